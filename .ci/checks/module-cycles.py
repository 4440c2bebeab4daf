#!/usr/bin/env python3
"""No import circle between the sibling modules of one folder.

Inside every folder of a crate's `src` (the crate root included), the modules of that
folder may use each other only one way: a module that another uses never uses it back,
directly or through a third. The modules of a folder are its files (`mod.rs`, `lib.rs`,
`main.rs` and `tests.rs` aside) and its subfolders with a `mod.rs`; a module's code is
its file and everything in its folder, so `scenario/mod.rs` and `scenario/real.rs` both
speak for `scenario` beside `setup.rs`. A module "uses" a sibling when its code outside a
trailing `#[cfg(test)] mod tests` (and outside `tests.rs` files) names it as
`crate::path::x`, as `super::x` from the module's own file (`super::super::x` one level
down, and so on), or inside such a `{...}` group; doc-comment links such as
[`super::x::item`] count too, so a module that is used says so in plain text, not with a
link back. At a crate's root only `crate::x` counts. Each folder whose modules form a
circle is printed with the uses among them, and the check fails.

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


def uses(src: str, sibling: str, prefix: str, supers: int) -> bool:
    """Whether `src` names `sibling` through `prefix` (`crate::a::b::`) or, when `supers`
    is not 0, through `super::` written `supers` times (and not once more)."""
    name = re.escape(sibling)
    paths = [re.escape(prefix)]
    if supers:
        paths.append(r"(?<![\w:])" + "super::" * supers)
    for path in paths:
        if re.search(path + name + r"\b", src):
            return True
        groups = re.findall(path + r"\{([^}]*)\}", src)
        if re.search(r"(^|[\s,{])" + name + r"\b", " ".join(groups)):
            return True
    return False


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


def sources(folder: pathlib.Path, module: str) -> list:
    """The files of `module` in `folder`, each with the number of `super::` that names a
    sibling from it: its own file (`x.rs` or `x/mod.rs`) 1, a file in `x/` 2, and so on;
    test files left out."""
    found = []
    own = folder / f"{module}.rs"
    inner = folder / module
    if own.is_file():
        found.append((own, 1))
    if inner.is_dir():
        for f in sorted(inner.rglob("*.rs")):
            rel = f.relative_to(inner).parts
            if f.name == "tests.rs" or "tests" in rel[:-1]:
                continue
            depth = len(rel) if f.name != "mod.rs" else len(rel) - 1
            found.append((f, depth + 1))
    return found


def check_folder(folder: pathlib.Path, root: pathlib.Path) -> list:
    """The circles among `folder`'s modules, each with the uses inside it."""
    modules = {f.stem for f in folder.glob("*.rs") if f.name not in NOT_SIBLINGS}
    modules |= {d.name for d in folder.iterdir() if d.is_dir() and (d / "mod.rs").is_file()}
    modules = sorted(modules)
    if len(modules) < 2:
        return []
    rel = folder.relative_to(root).parts
    prefix = "crate::" + "".join(p + "::" for p in rel)
    edges = {}
    for m in modules:
        edges[m] = set()
        for path, supers in sources(folder, m):
            src = without_tests(path.read_text())
            # At a crate's root only `crate::x` counts, as it always has here: the
            # webhook's root modules still reach each other through `super::` in a
            # circle, which the admission pipeline's restructuring is to untangle.
            depth = supers if rel else 0
            edges[m] |= {o for o in modules if o != m and uses(src, o, prefix, depth)}
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
