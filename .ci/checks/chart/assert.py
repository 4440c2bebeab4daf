"""Checks on rendered chart output that schema validation cannot see.

Usage: assert.py split RENDERED OUTDIR      -> OUTDIR/core.yaml, OUTDIR/cert-manager.json, counts
       assert.py check MODE RENDERED [CA_BUNDLE]
       assert.py docs VALUES_YAML DOC_MD          -> every value is in the doc's table
       assert.py cli BINARY RENDERED              -> the binary's CLI accepts each workload's args
       assert.py served RENDERED API_RESOURCES OUT -> OUT: the documents a cluster serves
       assert.py applied MODE RENDERED OBJECTS_JSON -> the cluster returns the configurations
       assert.py helm-owned RENDERED RELEASE NAMESPACE OUT -> OUT: marked as a Helm release's
       assert.py same-ca RENDERED_A RENDERED_B   -> both renders carry one CA and caBundle
       assert.py docker-context                  -> .dockerignore keeps what cargo build needs
       assert.py users RENDERED NAMESPACE        -> namespace, namespaceSelector, log level, securityContext values
       assert.py monitoring RENDERED TROUBLESHOOTING_MD -> scraper admitted, alerts' runbooks and aggregations
       assert.py variants RENDERED               -> host network, one replica, hard zone spread, quota, old key
       assert.py readme DOC_MD README_MD         -> README_MD with DOC_MD's values table (stdout)
MODE is cert-manager, self-signed or secret. Exits non-zero with one line per failure.
"""

import base64
import json
import os
import subprocess
import sys
import tempfile

import yaml

# API groups the Kubernetes JSON schemas cover; everything else is CRD-backed.
CORE_GROUPS = {
    "", "apps", "policy", "rbac.authorization.k8s.io", "admissionregistration.k8s.io",
    "networking.k8s.io", "apiextensions.k8s.io", "coordination.k8s.io", "discovery.k8s.io",
}
WEBHOOK_KINDS = ("MutatingWebhookConfiguration", "ValidatingWebhookConfiguration")
PATHS = {"MutatingWebhookConfiguration": "/mutate/eviction",
         "ValidatingWebhookConfiguration": "/validate/delete"}


def load(path):
    with open(path, encoding="utf-8") as f:
        return [d for d in yaml.safe_load_all(f) if d]


def group(doc):
    api = doc.get("apiVersion", "")
    return api.split("/")[0] if "/" in api else ""


def split(rendered, outdir):
    docs = load(rendered)
    core = [d for d in docs if group(d) in CORE_GROUPS]
    cm = [d for d in docs if group(d) == "cert-manager.io"]
    other = [d for d in docs if d not in core and d not in cm]
    with open(os.path.join(outdir, "core.yaml"), "w", encoding="utf-8") as f:
        yaml.safe_dump_all(core, f, sort_keys=False)
    with open(os.path.join(outdir, "cert-manager.json"), "w", encoding="utf-8") as f:
        json.dump(cm, f)
    kinds = sorted({f"{d['apiVersion']} {d['kind']}" for d in other})
    print(f"{len(core)} core, {len(cm)} cert-manager, {len(other)} other ({', '.join(kinds) or '-'})")


class Checker:
    def __init__(self, docs):
        self.docs = docs
        self.failures = []

    def one(self, kind, name=None):
        found = [d for d in self.docs if d["kind"] == kind
                 and (name is None or d["metadata"]["name"] == name)]
        if len(found) != 1:
            self.fail(f"expected one {kind} {name or ''}, found {len(found)}")
            return {}
        return found[0]

    def fail(self, msg):
        self.failures.append(msg)

    def expect(self, cond, msg):
        if not cond:
            self.fail(msg)


def container(workload):
    return workload["spec"]["template"]["spec"]["containers"][0]


def env_of(c):
    return {e["name"]: e for e in c.get("env", [])}


LINUX = {"kubernetes.io/os": "linux"}
ZONE = "topology.kubernetes.io/zone"
UNINSTALL_FINALIZER = "graceful-drain.io/uninstall"


def zone_spread(dep):
    """The webhook's topology spread constraints over zones."""
    pod = dep["spec"]["template"]["spec"]
    return [t for t in pod.get("topologySpreadConstraints", []) if t.get("topologyKey") == ZONE]


def check_webhook_deployment(ck):
    dep = ck.one("Deployment")
    if not dep:
        return dep
    pod = dep["spec"]["template"]["spec"]
    c = container(dep)
    env = env_of(c)
    ck.expect(dep["spec"]["replicas"] >= 2, "webhook: fewer than 2 replicas")
    ck.expect("podAntiAffinity" in pod.get("affinity", {}), "webhook: no pod anti-affinity")
    # A preempted webhook fails open: it runs at the add-ons' priority by default.
    ck.expect(pod.get("priorityClassName") == "system-cluster-critical",
              f"webhook: priorityClassName {pod.get('priorityClassName')!r}, not system-cluster-critical")
    ck.expect(pod.get("nodeSelector") == LINUX, f"webhook: nodeSelector {pod.get('nodeSelector')} is not {LINUX}")
    spread = zone_spread(dep)
    selector = dep["spec"]["selector"]["matchLabels"]
    ck.expect(len(spread) == 1 and spread[0].get("whenUnsatisfiable") == "ScheduleAnyway"
              and spread[0].get("maxSkew") == 1
              and spread[0].get("labelSelector", {}).get("matchLabels") == selector,
              f"webhook: no soft zone spread over its own pods: {spread}")
    ck.expect(not pod.get("hostNetwork"), "webhook: on the host network by default")
    ck.expect(pod["securityContext"].get("runAsNonRoot") is True, "webhook: not runAsNonRoot")
    sc = c["securityContext"]
    ck.expect(sc.get("readOnlyRootFilesystem") is True, "webhook: root filesystem writable")
    ck.expect(sc.get("capabilities", {}).get("drop") == ["ALL"], "webhook: capabilities kept")
    ck.expect(sc.get("seccompProfile", {}).get("type") == "RuntimeDefault", "webhook: no seccomp")
    for probe, path in (("livenessProbe", "/livez"), ("readinessProbe", "/readyz")):
        got = c.get(probe, {}).get("httpGet", {})
        ck.expect(got.get("path") == path and got.get("port") == "admin",
                  f"webhook: {probe} is not {path} on the admin port")
    for name, field in (("GRACEFUL_DRAIN_NAMESPACE", "metadata.namespace"),
                        ("GRACEFUL_DRAIN_POD_NAME", "metadata.name")):
        got = env.get(name, {}).get("valueFrom", {}).get("fieldRef", {}).get("fieldPath")
        ck.expect(got == field, f"webhook: {name} not from the downward API {field}")
    own = f"system:serviceaccount:{dep['metadata']['namespace']}:{pod['serviceAccountName']}"
    ck.expect(env.get("GRACEFUL_DRAIN_OWN_USER", {}).get("value") == own,
              f"webhook: GRACEFUL_DRAIN_OWN_USER is not its ServiceAccount {own}")
    for d in ck.docs:
        if d["kind"] in WEBHOOK_KINDS:
            for w in d["webhooks"]:
                exprs = [c["expression"] for c in w.get("matchConditions", [])]
                ck.expect(any(f'"{own}"' in e for e in exprs),
                          f"{d['kind']}: matchConditions do not skip {own}")
    timeout = int(env.get("GRACEFUL_DRAIN_WEBHOOK_TIMEOUT_SECONDS", {}).get("value", "0"))
    ck.expect(timeout > 0, "webhook: GRACEFUL_DRAIN_WEBHOOK_TIMEOUT_SECONDS missing")
    ck.expect(pod["terminationGracePeriodSeconds"] > timeout,
              "webhook: terminationGracePeriodSeconds not longer than the webhook hold")
    for d in ck.docs:
        if d["kind"] in WEBHOOK_KINDS:
            for w in d["webhooks"]:
                ck.expect(w["timeoutSeconds"] == timeout,
                          f"{d['kind']}: timeoutSeconds {w['timeoutSeconds']} != server's {timeout}")
    return dep


def tls_secret_name(dep):
    vols = dep["spec"]["template"]["spec"]["volumes"]
    return next(v["secret"]["secretName"] for v in vols if "secret" in v)


def check_webhook_configurations(ck, dep):
    svc = ck.one("Service", dep["metadata"]["name"])
    ns = dep["metadata"]["namespace"]
    for kind in WEBHOOK_KINDS:
        cfg = ck.one(kind)
        for w in cfg.get("webhooks", []):
            ck.expect(w["failurePolicy"] == "Ignore", f"{kind}: failurePolicy not Ignore by default")
            ck.expect(w["sideEffects"] == "NoneOnDryRun", f"{kind}: sideEffects")
            ck.expect(w["admissionReviewVersions"] == ["v1"], f"{kind}: admissionReviewVersions")
            ref = w["clientConfig"]["service"]
            ck.expect(ref["path"] == PATHS[kind], f"{kind}: path {ref['path']}")
            ck.expect((ref["name"], ref["namespace"]) == (svc["metadata"]["name"], ns),
                      f"{kind}: clientConfig does not name the webhook Service")
            ck.expect(ref["port"] in [p["port"] for p in svc["spec"]["ports"]],
                      f"{kind}: clientConfig port not served by the Service")
            excluded = w["namespaceSelector"]["matchExpressions"][0]
            ck.expect(excluded["key"] == "kubernetes.io/metadata.name"
                      and excluded["operator"] == "NotIn"
                      and {ns, "kube-system"} <= set(excluded["values"]),
                      f"{kind}: namespaceSelector does not exclude {ns} and kube-system")
            opt_out = w["objectSelector"]["matchExpressions"][0]
            ck.expect(opt_out == {"key": "graceful-drain.io/exclude", "operator": "NotIn",
                                  "values": ["true"]}, f"{kind}: objectSelector opt-out")
        rule = cfg["webhooks"][0]["rules"][0]
        want = (["CREATE"], ["pods/eviction"]) if kind.startswith("Mutating") else (["DELETE"], ["pods"])
        ck.expect((rule["operations"], rule["resources"]) == want, f"{kind}: rules {rule}")


def check_agent(ck):
    ds = ck.one("DaemonSet")
    if not ds:
        return
    pod = ds["spec"]["template"]["spec"]
    c = container(ds)
    args = c["args"]
    flag = {a.split("=", 1)[0]: a.split("=", 1)[1] for a in args if "=" in a}
    driver, plugins, registry = flag["--driver-name"], flag["--plugins-dir"], flag["--registry-dir"]
    host = {v["name"]: v["hostPath"] for v in pod["volumes"] if "hostPath" in v}
    ck.expect(sorted(h["path"] for h in host.values()) == sorted([f"{plugins}/{driver}", registry]),
              f"agent: hostPath mounts {host} are not exactly the two socket folders")
    ck.expect(host.get("plugin-dir", {}).get("type") == "DirectoryOrCreate",
              "agent: driver folder is not DirectoryOrCreate")
    mounts = {m["name"]: m["mountPath"] for m in c["volumeMounts"]}
    ck.expect(all(mounts.get(n) == h["path"] for n, h in host.items()),
              "agent: sockets not mounted at their host paths")
    got = env_of(c).get("GRACEFUL_DRAIN_NODE_NAME", {}).get("valueFrom", {})
    ck.expect(got.get("fieldRef", {}).get("fieldPath") == "spec.nodeName",
              "agent: GRACEFUL_DRAIN_NODE_NAME not from spec.nodeName")
    ck.expect({"operator": "Exists"} in pod.get("tolerations", []), "agent: does not tolerate every taint")
    ck.expect(pod.get("priorityClassName") == "system-node-critical", "agent: priorityClassName")
    ck.expect(pod.get("nodeSelector") == LINUX, f"agent: nodeSelector {pod.get('nodeSelector')} is not {LINUX}")
    ck.expect(flag.get("--lifecycle-reconciler") in ("auto", "on", "off"), "agent: reconciler switch")
    ck.expect(c["securityContext"].get("readOnlyRootFilesystem") is True, "agent: root fs writable")
    ck.expect(c["securityContext"].get("privileged") is not True, "agent: privileged")


def check_rbac(ck):
    for role in (d for d in ck.docs if d["kind"] in ("ClusterRole", "Role")):
        for rule in role["rules"]:
            ck.expect("secrets" not in rule.get("resources", []),
                      f"{role['kind']} {role['metadata']['name']}: grants Secrets")
            ck.expect("*" not in rule.get("verbs", []) + rule.get("resources", []),
                      f"{role['kind']} {role['metadata']['name']}: wildcard")


def verify_chain(ck, ca_pem, crt_pem, dns_name):
    with tempfile.TemporaryDirectory() as tmp:
        ca, crt = os.path.join(tmp, "ca.crt"), os.path.join(tmp, "tls.crt")
        for path, data in ((ca, ca_pem), (crt, crt_pem)):
            with open(path, "wb") as f:
                f.write(data)
        run = subprocess.run(["openssl", "verify", "-CAfile", ca, "-verify_hostname", dns_name, crt],
                             capture_output=True, text=True, check=False)
        ck.expect(run.returncode == 0, f"serving certificate does not verify for {dns_name}: "
                  f"{run.stdout.strip()} {run.stderr.strip()}")


def check_certificates(ck, mode, dep, ca_bundle):
    ns = dep["metadata"]["namespace"]
    secret_name = tls_secret_name(dep)
    dns_name = f"{dep['metadata']['name']}.{ns}.svc"
    cfgs = [d for d in ck.docs if d["kind"] in WEBHOOK_KINDS]
    bundles = {w["clientConfig"].get("caBundle") for c in cfgs for w in c["webhooks"]}
    inject = {c["metadata"].get("annotations", {}).get("cert-manager.io/inject-ca-from") for c in cfgs}
    secrets = [d for d in ck.docs if d["kind"] == "Secret"]
    if mode == "cert-manager":
        cert = ck.one("Certificate", dep["metadata"]["name"])
        ck.expect(inject == {f"{ns}/{cert.get('metadata', {}).get('name')}"},
                  f"cert-manager: inject-ca-from {inject}")
        ck.expect(bundles == {None}, "cert-manager: caBundle set next to inject-ca-from")
        ck.expect(cert.get("spec", {}).get("secretName") == secret_name,
                  "cert-manager: Certificate secretName is not the mounted Secret")
        ck.expect(dns_name in cert.get("spec", {}).get("dnsNames", []),
                  f"cert-manager: {dns_name} not in dnsNames")
        ck.expect(not secrets, "cert-manager: chart renders a Secret")
    elif mode == "self-signed":
        secret = ck.one("Secret", secret_name)
        data = secret.get("data", {})
        ck.expect(inject == {None}, "self-signed: inject-ca-from annotation present")
        ck.expect(bundles == {data.get("ca.crt")}, "self-signed: caBundle differs from the Secret's ca.crt")
        verify_chain(ck, base64.b64decode(data["ca.crt"]), base64.b64decode(data["tls.crt"]), dns_name)
    else:
        ck.expect(bundles == {ca_bundle}, "secret: caBundle is not the given value")
        ck.expect(inject == {None}, "secret: inject-ca-from annotation present")
        ck.expect(not secrets, "secret: chart renders a Secret")


def check_network_policy(ck, dep):
    """On by default: the webhook port admits only the listed sources, never everyone."""
    labels = dep["spec"]["selector"]["matchLabels"]
    policies = [d for d in ck.docs if d["kind"] == "NetworkPolicy"
                and d["spec"]["podSelector"].get("matchLabels") == labels]
    ck.expect(len(policies) == 1, f"expected one NetworkPolicy for the webhook, found {len(policies)}")
    if len(policies) != 1:
        return
    spec = policies[0]["spec"]
    ck.expect(spec.get("policyTypes") == ["Ingress"], "webhook NetworkPolicy restricts ingress")
    port = container(dep)["ports"][0]["name"]
    rules = [r for r in spec.get("ingress", [])
             if any(p.get("port") == port for p in r.get("ports", []))]
    ck.expect(len(rules) == 1 and rules[0].get("from"),
              f"webhook port {port} admits only listed sources: {rules}")
    # Without ServiceMonitors and metricsFrom (the defaults) no peer reaches the admin ports.
    for policy in (d for d in ck.docs if d["kind"] == "NetworkPolicy"):
        ck.expect(not admin_peers(policy), f"NetworkPolicy {policy['metadata']['name']}: admin port "
                  f"open by default to {admin_peers(policy)}")


def admin_peers(policy):
    """The peers a NetworkPolicy admits to the admin port."""
    return [peer for r in policy["spec"].get("ingress", [])
            if any(p.get("port") == "admin" for p in r.get("ports", []))
            for peer in r.get("from", [])]


def check(mode, rendered, ca_bundle=None):
    ck = Checker(load(rendered))
    dep = check_webhook_deployment(ck)
    if dep:
        check_network_policy(ck, dep)
    if dep:
        check_webhook_configurations(ck, dep)
        check_certificates(ck, mode, dep, ca_bundle)
    check_agent(ck)
    check_rbac(ck)
    for msg in ck.failures:
        print(f"FAIL {rendered}: {msg}")
    if ck.failures:
        sys.exit(1)


# Stand-ins for the downward API when running a workload's command line outside a pod.
FIELD_VALUES = {"metadata.namespace": "graceful-drain", "metadata.name": "pod-0",
                "spec.nodeName": "node-1"}
# clap exits with this code when it rejects the command line.
CLAP_USAGE_ERROR = 2


def cli(binary, rendered):
    """Runs each workload's rendered command line against the real binary: clap must accept
    it. The run then fails on purpose (no cluster, no certificate) or is stopped after a
    few seconds; both mean the flags and environment parsed."""
    failures = 0
    for doc in load(rendered):
        if doc["kind"] not in ("Deployment", "DaemonSet"):
            continue
        c = container(doc)
        env = {"PATH": os.environ.get("PATH", ""), "KUBECONFIG": "/nonexistent/kubeconfig",
               "HOME": tempfile.gettempdir()}
        for e in c.get("env", []):
            field = e.get("valueFrom", {}).get("fieldRef", {}).get("fieldPath")
            env[e["name"]] = FIELD_VALUES[field] if field else e["value"]
        # Point the sockets' folders at a scratch directory, never at the real kubelet's.
        with tempfile.TemporaryDirectory() as scratch:
            args = [a.replace("=/var/lib/kubelet", f"={scratch}") for a in c["args"]]
            try:
                run = subprocess.run([binary, *args], env=env, capture_output=True, text=True,
                                     timeout=5, check=False)
                code, err = run.returncode, run.stderr
            except subprocess.TimeoutExpired:
                code, err = None, ""
        if code == CLAP_USAGE_ERROR:
            failures += 1
            print(f"FAIL {doc['kind']} {doc['metadata']['name']}: the binary rejects its "
                  f"command line {' '.join(c['args'])}:\n{err.strip()}")
        else:
            print(f"{doc['kind']} {doc['metadata']['name']}: command line accepted "
                  f"({'still running after 5 s' if code is None else f'exit {code}'})")
    if failures:
        sys.exit(1)


def served(rendered, api_resources, out):
    """Keeps the documents whose kind `kubectl api-resources --no-headers` lists."""
    kinds = set()
    with open(api_resources, encoding="utf-8") as f:
        for line in f:
            cols = line.split()
            if len(cols) >= 4:
                kinds.add((cols[-3], cols[-1]))
    docs = load(rendered)
    keep = [d for d in docs if (d["apiVersion"], d["kind"]) in kinds]
    with open(out, "w", encoding="utf-8") as f:
        yaml.safe_dump_all(keep, f, sort_keys=False)
    skipped = sorted({d["kind"] for d in docs if d not in keep})
    print(f"{len(keep)} objects served, skipped kinds: {', '.join(skipped) or '-'}")


def applied(mode, rendered, objects_json):
    """Compares the webhook configurations the cluster returns with the rendered ones."""
    ck = Checker(load(rendered))
    with open(objects_json, encoding="utf-8") as f:
        items = json.load(f)["items"]
    for kind in WEBHOOK_KINDS:
        want = ck.one(kind)
        got = [i for i in items if i["kind"] == kind and i["metadata"]["name"] == want["metadata"]["name"]]
        if len(got) != 1:
            ck.fail(f"cluster does not return {kind} {want['metadata']['name']}")
            continue
        got = got[0]
        annotation = "cert-manager.io/inject-ca-from"
        ck.expect(got["metadata"].get("annotations", {}).get(annotation)
                  == want["metadata"].get("annotations", {}).get(annotation),
                  f"{kind}: {annotation} not served back")
        for w_got, w_want in zip(got["webhooks"], want["webhooks"]):
            for key in ("caBundle", "service"):
                ck.expect(w_got["clientConfig"].get(key) == w_want["clientConfig"].get(key),
                          f"{kind}: clientConfig.{key} served back differs")
            for key in ("timeoutSeconds", "failurePolicy", "namespaceSelector", "objectSelector", "rules"):
                ck.expect(w_got.get(key) == w_want.get(key), f"{kind}: {key} served back differs")
        if mode != "cert-manager":
            ck.expect(all(w["clientConfig"].get("caBundle") for w in got["webhooks"]),
                      f"{kind}: no caBundle in mode {mode}")
    for msg in ck.failures:
        print(f"FAIL {rendered} applied: {msg}")
    if ck.failures:
        sys.exit(1)


def helm_owned(rendered, release, namespace, out):
    """Adds the ownership annotations Helm puts on what it installs, with the namespace
    in front, so a later `helm template --dry-run=server` treats the objects as its own."""
    docs = [{"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}}]
    docs += load(rendered)
    for doc in docs:
        notes = doc["metadata"].setdefault("annotations", {})
        notes["meta.helm.sh/release-name"] = release
        notes["meta.helm.sh/release-namespace"] = namespace
    with open(out, "w", encoding="utf-8") as f:
        yaml.safe_dump_all(docs, f, sort_keys=False)


def same_ca(a, b):
    """Exit 0 when two self-signed renders carry the same certificate and caBundle."""
    def material(path):
        docs = load(path)
        secret = next(d for d in docs if d["kind"] == "Secret")
        bundles = {w["clientConfig"].get("caBundle") for d in docs if d["kind"] in WEBHOOK_KINDS
                   for w in d["webhooks"]}
        return secret["data"], bundles
    (data_a, bundles_a), (data_b, bundles_b) = material(a), material(b)
    same = data_a == data_b and bundles_a == bundles_b == {data_a["ca.crt"]}
    print("same certificate and caBundle" if same else "different certificate or caBundle")
    sys.exit(0 if same else 1)


def docker_context():
    """The build context must keep every file `cargo build --locked` reads: the workspace
    manifest and lock file, .cargo/config.toml, and every member crate (its manifest,
    build.rs, protos, sources, and the tests and benches its Cargo.toml names: a missing
    member or [[bench]] file breaks the workspace). Checked against `git ls-files`."""
    import fnmatch
    with open(".dockerignore", encoding="utf-8") as f:
        patterns = [l.strip().rstrip("/") for l in f if l.strip() and not l.startswith("#")]
    files = subprocess.run(["git", "ls-files"], capture_output=True, text=True,
                           check=True).stdout.split()
    def ignored(path):
        parts = path.split("/")
        prefixes = ["/".join(parts[:i]) for i in range(1, len(parts) + 1)]
        return any(fnmatch.fnmatch(p, pat) or fnmatch.fnmatch(parts[-1], pat)
                   for p in prefixes for pat in patterns)
    needed = [f for f in files if f in ("Cargo.toml", "Cargo.lock", ".cargo/config.toml")
              or f.split("/")[0] in ("crates", "xtask")]
    missing = [f for f in needed if ignored(f)]
    for f in missing:
        print(f"FAIL .dockerignore leaves out {f}, which cargo build needs")
    if missing or "crates/graceful-drain/src/main.rs" not in needed:
        sys.exit(1)
    print(f"docker context keeps the {len(needed)} files cargo build reads")


# Values documented as one row although they are maps (their keys are free-form).
WHOLE_VALUES = {"webhook.resources", "agent.resources", "agent.updateStrategy",
                "webhook.podSecurityContext", "webhook.securityContext",
                "agent.podSecurityContext", "agent.securityContext",
                "webhook.nodeSelector", "agent.nodeSelector"}


def leaf_values(values, prefix=""):
    for key, value in values.items():
        path = f"{prefix}.{key}" if prefix else key
        if isinstance(value, dict) and value and path not in WHOLE_VALUES:
            yield from leaf_values(value, path)
        else:
            yield path


def docs(values_yaml, doc_md):
    with open(values_yaml, encoding="utf-8") as f:
        values = yaml.safe_load(f)
    with open(doc_md, encoding="utf-8") as f:
        rows = {line.split("|")[1].strip().strip("`") for line in f if line.startswith("| `")}
    wanted = set(leaf_values(values))
    missing, stale = sorted(wanted - rows), sorted(rows - wanted)
    for key in missing:
        print(f"FAIL {doc_md}: value {key} is not in the values table")
    for key in stale:
        print(f"FAIL {doc_md}: values table lists {key}, which values.yaml does not have")
    if missing or stale:
        sys.exit(1)
    print(f"{len(wanted)} values documented")


def users(rendered, namespace):
    """The values that meet users where they are, as chart.sh's "everything" render sets
    them: the labelled Namespace, the user's namespaceSelector ANDed after the chart's
    exclusions, RUST_LOG from logLevel, and securityContext values replacing the defaults."""
    ck = Checker(load(rendered))
    ns = ck.one("Namespace", namespace)
    labels = ns.get("metadata", {}).get("labels", {})
    for mode in ("enforce", "warn", "audit"):
        ck.expect(labels.get(f"pod-security.kubernetes.io/{mode}") == "privileged",
                  f"Namespace: pod-security.kubernetes.io/{mode} is not privileged")
    ck.expect(ns.get("metadata", {}).get("annotations", {}).get("helm.sh/resource-policy") == "keep",
              "Namespace: not kept on uninstall")
    for kind in WEBHOOK_KINDS:
        for w in ck.one(kind).get("webhooks", []):
            sel = w["namespaceSelector"]
            exprs = sel["matchExpressions"]
            ck.expect(sel.get("matchLabels") == {"team": "payments"}, f"{kind}: matchLabels {sel}")
            ck.expect([e["key"] for e in exprs] == ["kubernetes.io/metadata.name",
                                                    "graceful-drain.io/exclude", "env"],
                      f"{kind}: the user's matchExpressions are not appended to the exclusions: {exprs}")
            ck.expect(namespace in exprs[0]["values"], f"{kind}: own namespace no longer excluded")
    for kind in ("Deployment", "DaemonSet"):
        c = container(ck.one(kind))
        ck.expect(env_of(c).get("RUST_LOG", {}).get("value") == "warn,graceful_drain=debug",
                  f"{kind}: RUST_LOG is not warn,graceful_drain=debug")
    dep, ds = ck.one("Deployment"), ck.one("DaemonSet")
    ck.expect(container(dep)["securityContext"].get("runAsUser") == 1000,
              "webhook: securityContext value not rendered")
    ck.expect(ds["spec"]["template"]["spec"]["securityContext"].get("seccompProfile")
              == {"type": "Unconfined"} and
              ds["spec"]["template"]["spec"]["securityContext"].get("runAsUser") == 0,
              "agent: podSecurityContext not merged with its defaults")
    for msg in ck.failures:
        print(f"FAIL {rendered} users: {msg}")
    if ck.failures:
        sys.exit(1)
    return "namespace labels, namespaceSelector, RUST_LOG and securityContext values: ok"


def github_anchor(heading):
    """The anchor GitHub gives a Markdown heading."""
    import re
    slug = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return slug.replace(" ", "-")


def monitoring(rendered, troubleshooting_md):
    """As chart.sh's "everything" render sets them (ServiceMonitors, PrometheusRule,
    NetworkPolicies, a metricsFrom peer): both policies admit the ServiceMonitors' scraper
    and the metricsFrom peer to the admin port; every alert has a runbook_url whose anchor
    is a heading of troubleshooting.md; every aggregation keeps namespace and cluster."""
    import re
    ck = Checker(load(rendered))
    anchors, fenced = set(), False
    with open(troubleshooting_md, encoding="utf-8") as f:
        for line in f:
            fenced ^= line.startswith("```")
            if line.startswith("#") and not fenced:
                anchors.add(github_anchor(line.lstrip("#")))
    prometheus = {"namespaceSelector": {}, "podSelector": {
        "matchLabels": {"app.kubernetes.io/managed-by": "prometheus-operator"},
        "matchExpressions": [{"key": "app.kubernetes.io/name", "operator": "In",
                              "values": ["prometheus", "prometheus-agent"]}]}}
    monitoring_ns = {"namespaceSelector": {"matchLabels": {"name": "monitoring"}}}
    policies = [d for d in ck.docs if d["kind"] == "NetworkPolicy"]
    ck.expect(len(policies) == 2, f"expected the webhook's and the agent's NetworkPolicy, found {len(policies)}")
    for policy in policies:
        peers = admin_peers(policy)
        ck.expect(prometheus in peers and monitoring_ns in peers,
                  f"NetworkPolicy {policy['metadata']['name']}: admin port does not admit the "
                  f"ServiceMonitors' Prometheus and metricsFrom: {peers}")
    rule = ck.one("PrometheusRule")
    alerts = [r for g in rule.get("spec", {}).get("groups", []) for r in g["rules"] if "alert" in r]
    ck.expect(len(alerts) >= 12, f"expected the 12 alerts, found {len(alerts)}")
    aggregation = re.compile(r"\b(sum|max|min|avg|count)\s*(?:by\s*\(([^)]*)\))?\s*\(")
    for a in alerts:
        url = a.get("annotations", {}).get("runbook_url", "")
        doc, _, anchor = url.partition("#")
        ck.expect(doc.endswith("troubleshooting.md") and anchor == a["alert"].lower(),
                  f"{a['alert']}: runbook_url {url!r} is not troubleshooting.md#{a['alert'].lower()}")
        ck.expect(anchor in anchors, f"{a['alert']}: troubleshooting.md has no section #{anchor}")
        for m in aggregation.finditer(a["expr"]):
            kept = {k.strip() for k in (m.group(2) or "").split(",")}
            ck.expect({"namespace", "cluster"} <= kept,
                      f"{a['alert']}: {m.group(0)}…) drops namespace or cluster")
    for msg in ck.failures:
        print(f"FAIL {rendered} monitoring: {msg}")
    if ck.failures:
        sys.exit(1)
    return (f"NetworkPolicies admit the ServiceMonitors' Prometheus; {len(alerts)} alerts with a "
            "runbook section each, aggregations by namespace and cluster: ok")


def variants(rendered):
    """chart.sh's "hostnet" render: webhook.hostNetwork with its own ports, one replica, a
    hard zone spread, the priority-class quota, and the old deleteEmptydirData key."""
    ck = Checker(load(rendered))
    dep = ck.one("Deployment")
    pod = dep.get("spec", {}).get("template", {}).get("spec", {})
    ck.expect(pod.get("hostNetwork") is True and pod.get("dnsPolicy") == "ClusterFirstWithHostNet",
              "webhook.hostNetwork: not on the host network with ClusterFirstWithHostNet")
    ports = {p["name"]: p["containerPort"] for p in container(dep)["ports"]}
    env = env_of(container(dep))
    ck.expect(ports == {"https": 10443, "admin": 10490}, f"webhook ports {ports}")
    ck.expect(env.get("GRACEFUL_DRAIN_LISTEN", {}).get("value") == "0.0.0.0:10443"
              and env.get("GRACEFUL_DRAIN_ADMIN_LISTEN", {}).get("value") == "0.0.0.0:10490",
              "webhook: listens elsewhere than its declared ports")
    ck.expect(dep["spec"]["replicas"] == 1, "webhook.replicas=1 not rendered")
    spread = zone_spread(dep)
    ck.expect([t.get("whenUnsatisfiable") for t in spread] == ["DoNotSchedule"],
              f"webhook.zoneSpread=hard: {spread}")
    quota = ck.one("ResourceQuota")
    scopes = quota.get("spec", {}).get("scopeSelector", {}).get("matchExpressions", [])
    ck.expect(scopes == [{"scopeName": "PriorityClass", "operator": "In",
                          "values": ["system-cluster-critical", "system-node-critical"]}],
              f"priorityClassQuota: scopes {scopes}")
    ck.expect(quota.get("metadata", {}).get("namespace") == dep["metadata"]["namespace"],
              "priorityClassQuota: not in the release namespace")
    ck.expect("--delete-emptydir-data" in container(ck.one("DaemonSet"))["args"],
              "agent.drain.deleteEmptydirData (deprecated spelling) no longer honoured")
    for msg in ck.failures:
        print(f"FAIL {rendered} variants: {msg}")
    if ck.failures:
        sys.exit(1)
    return "host network with its own ports, one replica, hard zone spread, quota, old key: ok"


BEGIN, END = "<!-- values-table:begin -->", "<!-- values-table:end -->"


def readme(doc_md, readme_md):
    """Prints README_MD with the table of DOC_MD's "## Values" section between its markers;
    links to docs/ pages are rewritten relative to the chart's folder."""
    import re
    with open(doc_md, encoding="utf-8") as f:
        section = f.read().split("\n## Values\n", 1)[1].split("\n## ", 1)[0]
    table = [l for l in section.splitlines() if l.startswith("|")]
    docs_dir = os.path.relpath(os.path.dirname(doc_md), os.path.dirname(readme_md))
    fix = lambda l: re.sub(r"\]\((?!https?:|#)([^)]+)\)", lambda m: f"]({docs_dir}/{m.group(1)})", l)
    with open(readme_md, encoding="utf-8") as f:
        text = f.read()
    if BEGIN not in text or END not in text:
        print(f"FAIL {readme_md}: no {BEGIN} ... {END} markers", file=sys.stderr)
        sys.exit(1)
    head, rest = text.split(BEGIN, 1)
    tail = rest.split(END, 1)[1]
    sys.stdout.write(head + BEGIN + "\n" + "\n".join(fix(l) for l in table) + "\n" + END + tail)


if __name__ == "__main__":
    if sys.argv[1] == "users":
        print(users(sys.argv[2], sys.argv[3]))
    elif sys.argv[1] == "monitoring":
        print(monitoring(sys.argv[2], sys.argv[3]))
    elif sys.argv[1] == "variants":
        print(variants(sys.argv[2]))
    elif sys.argv[1] == "readme":
        readme(sys.argv[2], sys.argv[3])
    elif sys.argv[1] == "docker-context":
        docker_context()
    elif sys.argv[1] == "helm-owned":
        helm_owned(*sys.argv[2:6])
    elif sys.argv[1] == "same-ca":
        same_ca(sys.argv[2], sys.argv[3])
    elif sys.argv[1] == "served":
        served(sys.argv[2], sys.argv[3], sys.argv[4])
    elif sys.argv[1] == "applied":
        applied(sys.argv[2], sys.argv[3], sys.argv[4])
    elif sys.argv[1] == "cli":
        cli(sys.argv[2], sys.argv[3])
    elif sys.argv[1] == "docs":
        docs(sys.argv[2], sys.argv[3])
    elif sys.argv[1] == "split":
        split(sys.argv[2], sys.argv[3])
    else:
        check(sys.argv[2], sys.argv[3], *sys.argv[4:5])
