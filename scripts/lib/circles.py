"""The import circles inside each package of bindery: `scripts/circles` (or `python scripts/lib/circles.py`).

Import-linter's layers contract forbids circles between the top-level rooms only. Inside a room a
circle means no module of it can be read, tested or moved apart from the others. For every package
this prints each set of its children (modules, or subpackages taken whole) that import each other
in a circle, with one import line per arrow; it exits 1 when there is any. It reads the graph
import-linter builds (grimp); imports under TYPE_CHECKING count, as they tie the modules too.
"""

from __future__ import annotations

import collections
import sys

import grimp


def _child(package: str, module: str) -> str:
    return module[len(package) + 1 :].split(".", maxsplit=1)[0]


def circles(graph: grimp.ImportGraph, package: str) -> list[list[str]]:
    """The circles among `package`'s children: each a sorted list of two or more child names."""
    edges: dict[str, set[str]] = collections.defaultdict(set)
    for module in graph.find_descendants(package):
        for imported in graph.find_modules_directly_imported_by(module):
            if imported.startswith(f"{package}.") and _child(package, imported) != _child(package, module):
                edges[_child(package, module)].add(_child(package, imported))
    # Tarjan's strongly connected components, iteratively.
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []
    for root in sorted(edges):
        if root in index:
            continue
        work = [(root, iter(sorted(edges[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        while work:
            node, children = work[-1]
            for child in children:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    work.append((child, iter(sorted(edges[child]))))
                    break
                if child in stack:
                    low[node] = min(low[node], index[child])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    component = []
                    while True:
                        member = stack.pop()
                        component.append(member)
                        if member == node:
                            break
                    if len(component) > 1:
                        found.append(sorted(component))
    return sorted(found)


def arrows(graph: grimp.ImportGraph, package: str, members: list[str]) -> list[str]:
    """One line per import between two of `members`: `a -> b  (a/x.py:12: from ... import ...)`."""
    lines = []
    inside = set(members)
    for module in sorted(graph.find_descendants(package)):
        for imported in sorted(graph.find_modules_directly_imported_by(module)):
            mine, theirs = (
                _child(package, module),
                _child(package, imported) if imported.startswith(f"{package}.") else "",
            )
            if mine in inside and theirs in inside and mine != theirs:
                for detail in graph.get_import_details(importer=module, imported=imported)[:1]:
                    lines.append(
                        f"{mine} -> {theirs}  ({module}:{detail['line_number']}: {detail['line_contents']})"
                    )
    return lines


def main(root: str = "bindery") -> int:
    graph = grimp.build_graph(root, cache_dir=None)
    packages = sorted({module.rsplit(".", 1)[0] for module in graph.modules if "." in module})
    count = 0
    for package in packages:
        for members in circles(graph, package):
            count += 1
            print(f"{package}: {' <-> '.join(members)}")
            for line in arrows(graph, package, members):
                print(f"  {line}")
    print(f"{count} import circle(s) inside the packages of {root}")
    return 1 if count else 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:]))
