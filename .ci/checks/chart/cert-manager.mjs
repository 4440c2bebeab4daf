// Validates rendered cert-manager objects (JSON array on stdin or in argv[2]) against the
// cert-manager JSON schemas of @kubernetes-models/cert-manager, then checks every field
// name against the models' TypeScript declarations, because those schemas accept
// unknown fields and a misspelt one would be silently ignored by cert-manager.
// Usage: node chart-cert-manager.mjs NODE_MODULES_DIR < objects.json
import fs from "node:fs";
import path from "node:path";
import { pathToFileURL } from "node:url";

const nodeModules = process.argv[2];
const pkg = path.join(nodeModules, "@kubernetes-models", "cert-manager");
const models = {
  Certificate: "cert-manager.io/v1/Certificate",
  Issuer: "cert-manager.io/v1/Issuer",
  ClusterIssuer: "cert-manager.io/v1/ClusterIssuer",
};

// Property names and types of the `declare class` in a .d.ts file, with the files the
// referenced interfaces come from. Returns null for type aliases (enums, scalars).
const classCache = new Map();
function classProps(dtsFile) {
  if (classCache.has(dtsFile)) return classCache.get(dtsFile);
  const text = fs.readFileSync(dtsFile, "utf8");
  const imports = new Map();
  for (const m of text.matchAll(/^import \{ ([^}]+) \} from "([^"]+)";$/gm)) {
    for (const name of m[1].split(",").map((s) => s.trim())) {
      imports.set(name, resolveImport(dtsFile, m[2]));
    }
  }
  const body = text.match(/^export declare class \w+ extends Model<[^>]+>[^{]*\{\n([\s\S]*?)^\}/m);
  let props = null;
  if (body) {
    props = new Map();
    for (const m of body[1].matchAll(/^ {4}"([^"]+)"\??: (.+?);?$/gm)) {
      // Map types (labels, annotations) span lines and start with "{": free keys.
      const type = m[2].replace(/^Array<(.+)>$/, "$1").replace(/\[\]$/, "");
      props.set(m[1], { array: m[2].startsWith("Array<"), file: imports.get(type) ?? null });
    }
  }
  classCache.set(dtsFile, props);
  return props;
}

function resolveImport(from, spec) {
  const target = spec.startsWith(".")
    ? path.resolve(path.dirname(from), spec)
    : path.join(nodeModules, spec);
  return target.replace(/\.js$/, "") + ".d.ts";
}

function unknownFields(value, dtsFile, where, out) {
  if (value === null || typeof value !== "object" || !dtsFile || !fs.existsSync(dtsFile)) return;
  const props = classProps(dtsFile);
  if (!props) return;
  for (const [key, child] of Object.entries(value)) {
    const prop = props.get(key);
    if (!prop) {
      out.push(`${where}.${key}: unknown field`);
      continue;
    }
    const items = prop.array && Array.isArray(child) ? child : [child];
    items.forEach((item, i) =>
      unknownFields(item, prop.file, prop.array ? `${where}.${key}[${i}]` : `${where}.${key}`, out),
    );
  }
}

const input = JSON.parse(fs.readFileSync(process.argv[3] ?? 0, "utf8"));
let failures = 0;
for (const obj of input) {
  const id = `${obj.kind}/${obj.metadata?.namespace ?? ""}/${obj.metadata?.name ?? "?"}`;
  const model = models[obj.kind];
  if (!obj.apiVersion?.endsWith("cert-manager.io/v1") || !model) {
    console.error(`FAIL ${id}: no cert-manager model for ${obj.apiVersion} ${obj.kind}`);
    failures++;
    continue;
  }
  const mod = await import(pathToFileURL(path.join(pkg, model + ".js")).href);
  const problems = [];
  try {
    new mod[obj.kind](obj).validate();
  } catch (err) {
    problems.push(err.message);
  }
  unknownFields(obj, path.join(pkg, model + ".d.ts"), obj.kind, problems);
  if (problems.length) {
    failures++;
    console.error(`FAIL ${id}:\n  ${problems.join("\n  ")}`);
  }
}
if (failures) process.exit(1);
console.log(`cert-manager: ${input.length} objects valid`);
