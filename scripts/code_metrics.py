"""Module and function sizes in client/, gateway/, discovery/ and proxy/, for a refactoring's
before/after.

The issue 14 guide is "modules under ~400 lines, functions under ~50"; this prints where the
code stands against it, with the method the first measurement used (so rounds compare):
a module's size is its physical line count, a function's is the span of its `def` statement
in the AST (`end_lineno - lineno + 1`: signature, docstring and body; decorators excluded;
nested functions counted on their own too). Import cycles are `scripts/import_cycles.py`'s.

    python scripts/code_metrics.py            # this tree
    python scripts/code_metrics.py /path/to/other/checkout
"""

from __future__ import annotations

import ast
import re
import sys
from pathlib import Path

PACKAGES = ("client", "gateway", "discovery", "proxy")
MODULE_GUIDE = 400
FUNCTION_GUIDE = 50
# A Manifest built by calling the class (not its definition, not `build_manifest`).
_MANIFEST_CALL = re.compile(r"(?<![\w.])Manifest\(")


def measure(root: Path) -> tuple[list[tuple[int, str]], list[tuple[int, str]], int]:
    """(lines, module) and (lines, module:function), largest first, and Manifest( calls."""
    modules: list[tuple[int, str]] = []
    functions: list[tuple[int, str]] = []
    manifests = 0
    for package in PACKAGES:
        for path in sorted((root / package).glob("**/*.py")):
            name = str(path.relative_to(root))
            text = path.read_text()
            lines = text.splitlines()
            modules.append((len(lines), name))
            for node in ast.walk(ast.parse(text)):
                if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    span = (node.end_lineno or node.lineno) - node.lineno + 1
                    functions.append((span, f"{name}:{node.name}"))
            manifests += sum(
                1
                for line in lines
                if _MANIFEST_CALL.search(line) and not line.lstrip().startswith(("class", "def"))
            )
    modules.sort(reverse=True)
    functions.sort(reverse=True)
    return modules, functions, manifests


def main() -> int:
    root = Path(sys.argv[1]) if len(sys.argv) > 1 else Path(__file__).resolve().parents[1]
    modules, functions, manifests = measure(root)
    big = [m for m in modules if m[0] > MODULE_GUIDE]
    long = [f for f in functions if f[0] > FUNCTION_GUIDE]
    print(f"largest module: {modules[0][1]} ({modules[0][0]} lines)")
    print(f"modules over {MODULE_GUIDE} lines: {len(big)}")
    for lines, name in big:
        print(f"  {lines:4d} {name}")
    print(f"longest function: {functions[0][1]} ({functions[0][0]} lines)")
    print(f"functions over {FUNCTION_GUIDE} lines: {len(long)}")
    for lines, name in long:
        print(f"  {lines:4d} {name}")
    print(f"places a Manifest is built (Manifest( calls): {manifests}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
