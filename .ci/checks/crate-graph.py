#!/usr/bin/env python3
"""The workspace's crate graph, from `cargo metadata`: prints each crate of ours with its
normal and dev edges to other crates of ours and its lines of Rust, and fails when the
graph has a cycle (dev edges included) or when a product crate depends on test
infrastructure (docs/design.md §2, "Crates").

    python3 .ci/checks/crate-graph.py
"""
import json
import pathlib
import subprocess
import sys

# What ships, and what only tests and develops it.
PRODUCT = {"graceful-drain", "graceful-drain-core", "graceful-drain-webhook", "graceful-drain-agent"}
UNIT_TEST_SUPPORT = {"graceful-drain-testing", "kube-sim"}
TEST_ONLY = {"kube-sim", "graceful-drain-sim", "graceful-drain-testing", "graceful-drain-e2e", "kube-control-plane",
             "real-lb"}


def main() -> int:
    meta = json.loads(subprocess.check_output(
        ["cargo", "metadata", "--locked", "--format-version", "1", "--no-deps"]))
    ours = {p["name"]: p for p in meta["packages"]}
    edges = {}
    for name, pkg in ours.items():
        for dep in pkg["dependencies"]:
            if dep["name"] in ours:
                kind = dep["kind"] or "normal"
                if kind == "build":
                    continue
                opt = " (optional)" if dep.get("optional") else ""
                edges.setdefault(name, []).append((dep["name"], kind + opt))
    errors = []
    print(f"{'crate':24} {'lines':>6}  depends on")
    for name in sorted(ours):
        root = pathlib.Path(ours[name]["manifest_path"]).parent
        lines = sum(len(f.read_text().splitlines()) for f in root.rglob("*.rs"))
        deps = ", ".join(f"{d} [{k}]" for d, k in sorted(edges.get(name, [])))
        print(f"{name:24} {lines:>6}  {deps or '-'}")
        if name in PRODUCT:
            for d, k in edges.get(name, []):
                # The binary's `sim` feature pulls in `simulate`; unit tests may use the
                # builders, the scripted mock and the simulated API server, which know
                # nothing of the product; nothing else of the test world.
                allowed = (name == "graceful-drain" and d == "graceful-drain-sim" and "optional" in k) or (
                    k.startswith("dev") and d in UNIT_TEST_SUPPORT)
                if d in TEST_ONLY and not allowed:
                    errors.append(f"product crate {name} depends on {d} [{k}]")
    # Depth-first search for a cycle over every edge kind.
    state = {}

    def visit(node, path):
        state[node] = "open"
        for d, _ in edges.get(node, []):
            if state.get(d) == "open":
                errors.append("cycle: " + " -> ".join(path[path.index(d):] + [d]))
            elif d not in state:
                visit(d, path + [d])
        state[node] = "done"

    for name in sorted(ours):
        if name not in state:
            visit(name, [name])
    for e in errors:
        print("error:", e, file=sys.stderr)
    if not errors:
        print("crate graph: no cycle, no product crate on test infrastructure")
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
