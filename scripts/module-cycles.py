#!/usr/bin/env python3
"""No import cycles between the top-level modules of a crate (docs/architecture.md).

Each .rs file under a crate's src/ belongs to its top-level module (src/engine.rs and
src/engine/state.rs both to `engine`); a reference to `crate::other` outside a comment is an
edge to `other` (unit tests are left out, a file's `#[cfg(test)] mod` at its end or in a file
of its own: they are not part of the crate's build). A strongly connected set of two or more
modules is a cycle: some constant or type lives in the wrong file. Prints each cycle and exits
1 if there is one.
"""
import pathlib
import re
import sys

ROOTS = ["crates", "backends"]
REFERENCE = re.compile(r"\bcrate::(\w+)")


def top_module(src: pathlib.Path, file: pathlib.Path) -> str | None:
    parts = file.relative_to(src).parts
    if len(parts) == 1:
        name = parts[0][:-3]
        return None if name in ("lib", "main") else name
    return parts[0]


def test_only(file: pathlib.Path) -> bool:
    """Whether `file` is a module its parent declares under `#[cfg(test)]` (`mod tests;`)."""
    parents = [file.parent.with_suffix(".rs"), file.parent / "mod.rs"]
    declaration = f"#[cfg(test)]\nmod {file.stem};"
    return any(parent.is_file() and declaration in parent.read_text() for parent in parents)


def edges_of(src: pathlib.Path) -> dict[str, set[str]]:
    edges: dict[str, set[str]] = {}
    for file in sorted(src.rglob("*.rs")):
        module = top_module(src, file)
        if module is None or test_only(file):
            continue
        lines = file.read_text().splitlines()
        for number, line in enumerate(lines):
            # A file's unit tests (its `#[cfg(test)] mod`) may use any module: they are not
            # part of the crate's build.
            if line.strip() == "#[cfg(test)]" and lines[number + 1 : number + 2] != [] and lines[number + 1].lstrip().startswith("mod "):
                break
            code = line.split("//", 1)[0]
            for target in REFERENCE.findall(code):
                if target != module:
                    edges.setdefault(module, set()).add(target)
    return edges


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Tarjan's strongly connected components of two or more modules."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for next_node in sorted(edges.get(node, ())):
            if next_node not in index:
                visit(next_node)
                low[node] = min(low[node], low[next_node])
            elif next_node in on_stack:
                low[node] = min(low[node], index[next_node])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(edges):
        if node not in index:
            visit(node)
    return found


def main() -> int:
    repo = pathlib.Path(__file__).resolve().parent.parent
    bad = 0
    for root in ROOTS:
        for src in sorted((repo / root).glob("*/src")):
            edges = edges_of(src)
            for component in cycles(edges):
                bad += 1
                ring = " ↔ ".join(component)
                print(f"{src.parent.relative_to(repo)}: import cycle between {ring}")
                for module in component:
                    into = sorted(edges.get(module, set()) & set(component))
                    print(f"    {module} uses {', '.join(into)}")
    if bad == 0:
        print("no import cycles between the modules of a crate")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
