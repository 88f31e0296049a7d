"""Import circles among forge's modules, counting the imports made only for annotations
(``if TYPE_CHECKING:``): each circle (a strongly connected set of modules, two or more) with the
imports that close it. None is the rule, checked by tests/test_import_cycles.py.

An import under ``TYPE_CHECKING`` costs nothing at run time, but it is a dependency all the same:
a module that names another's class in its signatures cannot be understood, moved or tested
without it. So a function that works on a model takes a narrow protocol its caller satisfies
(``supervisor._host.HostedModel``, ``supervisor._status.SupervisedModel``), not the class.

    python scripts/audit/import_cycles.py
"""

from __future__ import annotations

import sys
from collections.abc import Mapping, Set

import grimp

PACKAGE = "rocmforge_supervisor"


def import_graph(package: str = PACKAGE) -> dict[str, set[str]]:
    """Each module of ``package`` → the modules of ``package`` it imports (annotations included)."""
    graph = grimp.build_graph(package, exclude_type_checking_imports=False)
    return {m: set(graph.find_modules_directly_imported_by(m)) for m in sorted(graph.modules)}


def circles(edges: Mapping[str, Set[str]]) -> list[list[str]]:
    """The strongly connected sets of two or more modules (Tarjan, iterative: no recursion limit)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for root in edges:
        if root in index:
            continue
        work: list[tuple[str, list[str]]] = [(root, sorted(edges.get(root, ())))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, todo = work[-1]
            if todo:
                nxt = todo.pop()
                if nxt not in index:
                    index[nxt] = low[nxt] = len(index)
                    stack.append(nxt)
                    on_stack.add(nxt)
                    work.append((nxt, sorted(edges.get(nxt, ()))))
                elif nxt in on_stack:
                    low[node] = min(low[node], index[nxt])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                group: list[str] = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    group.append(member)
                    if member == node:
                        break
                if len(group) > 1:
                    found.append(sorted(group))
    return found


def main() -> int:
    edges = import_graph()
    found = circles(edges)
    for group in found:
        members = set(group)
        print(f"a circle of {len(group)} modules:")
        for m in group:
            print(f"  {m} -> {', '.join(sorted(edges[m] & members))}")
    print(f"{len(edges)} modules, {sum(map(len, edges.values()))} imports, {len(found)} circles")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
