"""Tested versus shipped: the objects the suites and the real tier's rows register from the
chart (the `tested-objects` binary's JSON) against the chart as Helm renders it.

The one difference allowed is where the API server calls the webhook: the tests name a
loopback `url` (the chart's Service path appended) and their own `caBundle`, where the
chart names its Service and cert-manager injects the CA (the `cert-manager.io/inject-ca-from`
annotation). Any other field that differs — selectors, matchConditions, timeoutSeconds,
failurePolicy, sideEffects, rules, labels, RBAC rules, policies — is reported by its path,
and so is a chart object of those kinds that the tests do not register.

  python3 shipped.py RENDERED.yaml TESTED.json BASE_URL
"""
import json
import sys

import yaml

CONFIGURATIONS = {"MutatingWebhookConfiguration", "ValidatingWebhookConfiguration"}
INJECT_CA = "cert-manager.io/inject-ca-from"


def key(doc):
    meta = doc.get("metadata", {})
    return (doc.get("kind"), meta.get("namespace", ""), meta.get("name"))


def diff(a, b, path, out):
    """Appends to `out` each path where the chart's `a` and the tests' `b` differ."""
    if isinstance(a, dict) and isinstance(b, dict):
        for k in sorted(set(a) | set(b)):
            if k not in a:
                out.append(f"{path}.{k}: only in the tests: {json.dumps(b[k])[:200]}")
            elif k not in b:
                out.append(f"{path}.{k}: only in the chart: {json.dumps(a[k])[:200]}")
            else:
                diff(a[k], b[k], f"{path}.{k}", out)
    elif isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
        for i, (x, y) in enumerate(zip(a, b)):
            diff(x, y, f"{path}[{i}]", out)
    elif a != b:
        out.append(f"{path}: chart {json.dumps(a)[:200]} != tests {json.dumps(b)[:200]}")


def strip_client_config(chart, tested, base_url, name, out):
    """Checks the one allowed difference and removes it from both copies."""
    meta = chart.get("metadata", {})
    annotations = meta.get("annotations") or {}
    annotations.pop(INJECT_CA, None)
    if not annotations:
        meta.pop("annotations", None)
    hooks = zip(chart.get("webhooks") or [], tested.get("webhooks") or [])
    for i, (c, t) in enumerate(hooks):
        path = (c.get("clientConfig", {}).get("service") or {}).get("path")
        want = base_url.rstrip("/") + (path or "")
        got = t.get("clientConfig", {}).get("url")
        if got != want:
            out.append(f"{name}.webhooks[{i}].clientConfig.url: {got!r}, want {want!r}")
        if not t.get("clientConfig", {}).get("caBundle"):
            out.append(f"{name}.webhooks[{i}].clientConfig.caBundle: missing in the tests")
        c.pop("clientConfig", None)
        t.pop("clientConfig", None)


def main(rendered, tested_file, base_url):
    chart = {key(d): d for d in yaml.safe_load_all(open(rendered)) if isinstance(d, dict)}
    tested = json.load(open(tested_file))
    kinds = {d["kind"] for d in tested}
    problems = []
    for doc in tested:
        k = key(doc)
        name = "/".join(p for p in k if p)
        if k not in chart:
            problems.append(f"{name}: registered by the tests, not rendered by the chart")
            continue
        shipped = json.loads(json.dumps(chart[k]))
        if k[0] in CONFIGURATIONS:
            strip_client_config(shipped, doc, base_url, name, problems)
        diff(shipped, doc, name, problems)
    for k, doc in chart.items():
        if k[0] in kinds and k not in {key(d) for d in tested}:
            problems.append(f"{'/'.join(p for p in k if p)}: rendered by the chart, not registered by the tests")
    for p in problems:
        print(f"  DIFF {p}")
    print(f"  {len(tested)} objects the tests register ({', '.join(sorted(kinds))}): "
          f"{len(problems)} difference(s) from the chart")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:4]))
