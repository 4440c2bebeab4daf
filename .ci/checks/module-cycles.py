#!/usr/bin/env python3
"""No import circle between the sibling modules of one folder.

Inside every folder of a crate's `src` (the crate root included), the modules that are
files of that folder (`mod.rs`, `lib.rs`, `main.rs` and `tests.rs` aside) may use each
other only one way: a module that another uses never uses it back, directly or through a
third. A module "uses" a sibling when its code outside a trailing `#[cfg(test)] mod tests`
names it as `super::x`, `crate::path::x`, or inside a `super::{...}` or
`crate::path::{...}` group; doc-comment links such as [`super::x::item`] count too, so a
module that is used says so in plain text, not with a link back. Each folder whose
modules form a circle is printed with the uses among them, and the check fails.

    python3 .ci/checks/module-cycles.py [SRC_DIR ...]    (default: crates/*/src)
"""
import pathlib
import re
import sys

NOT_SIBLINGS = {"mod.rs", "lib.rs", "main.rs", "tests.rs"}


def without_tests(src: str) -> str:
    """The source up to its test module: tests may reach anywhere."""
    at = src.find("#[cfg(test)]\nmod tests")
    return src if at < 0 else src[:at]


def uses(src: str, sibling: str, prefix: str, at_root: bool) -> bool:
    """Whether `src` names `sibling` through `prefix` (`crate::a::b::`) or `super::`."""
    name = re.escape(sibling)
    groups = re.findall(re.escape(prefix) + r"\{([^}]*)\}", src)
    if not at_root:
        if re.search(r"\bsuper::" + name + r"\b", src):
            return True
        groups += re.findall(r"\bsuper::\{([^}]*)\}", src)
    if re.search(r"\b" + re.escape(prefix) + name + r"\b", src):
        return True
    return re.search(r"(^|[\s,{])" + name + r"\b", " ".join(groups)) is not None


def circles(edges: dict) -> list:
    """The strongly connected components of more than one module (Tarjan)."""
    index, low, stack, on_stack, found = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(edges[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return found


def check_folder(folder: pathlib.Path, root: pathlib.Path) -> list:
    """The circles among `folder`'s modules, each with the uses inside it."""
    modules = sorted(f.stem for f in folder.glob("*.rs") if f.name not in NOT_SIBLINGS)
    if len(modules) < 2:
        return []
    rel = folder.relative_to(root).parts
    prefix = "crate::" + "".join(p + "::" for p in rel)
    edges = {}
    for m in modules:
        src = without_tests((folder / f"{m}.rs").read_text())
        edges[m] = {o for o in modules if o != m and uses(src, o, prefix, not rel)}
    return [
        (component, [f"{m} -> {o}" for m in component for o in sorted(edges[m]) if o in component])
        for component in circles(edges)
    ]


def main(args: list) -> int:
    roots = [pathlib.Path(a) for a in args] or sorted(pathlib.Path("crates").glob("*/src"))
    failed = False
    for root in roots:
        folders = [root] + sorted(p for p in root.rglob("*") if p.is_dir())
        for folder in folders:
            for component, used in check_folder(folder, root):
                failed = True
                print(f"{folder}: import circle between {', '.join(component)} ({'; '.join(used)})")
    if failed:
        print("error: sibling modules use each other in a circle (above); move what both need "
              "into a module of its own, or name a user in plain text in a doc comment",
              file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
