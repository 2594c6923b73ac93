"""Count import cycles in client/, gateway/ and discovery/, between modules and between packages.

`lint-imports` (scripts/test.sh) enforces the layers; this script only measures, for the
"before and after" of a refactoring. It reads the import graph with grimp (installed with
import-linter), counting every import statement: module level, inside functions and under
`if TYPE_CHECKING`. A package here is a directory (`client`, `client.protocol`,
`gateway.storage`...); a module's imports count as its package's, so `client.protocol._x`
importing `client.core._exceptions` is an edge `client.protocol -> client`.

    python scripts/import_cycles.py            # counts, then every cycle found
"""

from __future__ import annotations

import sys
from collections.abc import Iterator

import grimp

PACKAGES = ("client", "gateway", "discovery")


def elementary_cycles(graph: dict[str, set[str]]) -> Iterator[list[str]]:
    """Every simple cycle once, started at its smallest node (fine for graphs this small)."""
    nodes = sorted(graph)
    for start in nodes:
        # Only nodes >= start, so each cycle is reported from its smallest member.
        stack: list[tuple[str, list[str]]] = [(start, [start])]
        while stack:
            node, path = stack.pop()
            for nxt in sorted(graph.get(node, ())):
                if nxt == start:
                    yield path
                elif nxt > start and nxt not in path:
                    stack.append((nxt, [*path, nxt]))


def package_of(module: str, packages: set[str]) -> str:
    """The package (directory) a module lives in; a package's `__init__` is the package."""
    return module if module in packages else module.rsplit(".", 1)[0]


def main() -> int:
    g = grimp.build_graph(*PACKAGES, cache_dir=None)
    modules = set(g.modules)
    packages = {m for m in modules if g.find_children(m)} | set(PACKAGES)
    module_graph = {m: set(g.find_modules_directly_imported_by(m)) & modules for m in modules}
    package_graph: dict[str, set[str]] = {p: set() for p in packages}
    for src, targets in module_graph.items():
        p = package_of(src, packages)
        package_graph[p] |= {package_of(t, packages) for t in targets} - {p}
    top_graph: dict[str, set[str]] = {p: set() for p in PACKAGES}
    for src, targets in module_graph.items():
        top = src.split(".")[0]
        top_graph[top] |= {t.split(".")[0] for t in targets} - {top}

    report = [
        ("top-level packages", list(elementary_cycles(top_graph))),
        ("packages", list(elementary_cycles(package_graph))),
        ("modules", list(elementary_cycles(module_graph))),
    ]
    for name, cycles in report:
        print(f"cycles between {name}: {len(cycles)}")
    for name, cycles in report:
        for cycle in cycles:
            print(f"  {name}: {' -> '.join([*cycle, cycle[0]])}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
