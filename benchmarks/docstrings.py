"""What share of the library's public functions and methods have a docstring? (issue 52)

Usage: python benchmarks/docstrings.py [PACKAGE_DIR]   (default: workflow_scripts/wattflex)

Counts, with `ast`, the public top-level functions and the public methods of public top-level
classes (names not starting with `_`; `__init__` and other dunders are not counted, as ruff's
D102/D103 do not count them), and the public top-level classes. Prints one Markdown table row per
kind and the files with the most undocumented names.
"""

from __future__ import annotations

import ast
import sys
from collections import Counter
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def public(name: str) -> bool:
    """Whether a name is public: it does not start with an underscore."""
    return not name.startswith("_")


def census(root: Path) -> tuple[Counter, Counter, Counter]:
    """(all, documented, undocumented per file) over the ``.py`` files under ``root``.

    The first two count by kind: ``function``, ``method``, ``class``.
    """
    total: Counter = Counter()
    documented: Counter = Counter()
    missing: Counter = Counter()
    for path in sorted(root.rglob("*.py")):
        tree = ast.parse(path.read_text(), filename=str(path))
        found: list[tuple[str, ast.AST]] = []
        for node in tree.body:
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and public(node.name):
                found.append(("function", node))
            elif isinstance(node, ast.ClassDef) and public(node.name):
                found.append(("class", node))
                found += [
                    ("method", item)
                    for item in node.body
                    if isinstance(item, ast.FunctionDef | ast.AsyncFunctionDef)
                    and public(item.name)
                ]
        for kind, node in found:
            total[kind] += 1
            if ast.get_docstring(node) is not None:
                documented[kind] += 1
            else:
                missing[str(path.relative_to(root))] += 1
    return total, documented, missing


def main() -> None:
    """Print the table for the package directory named on the command line."""
    root = Path(sys.argv[1]) if len(sys.argv) > 1 else REPO / "workflow_scripts" / "wattflex"
    total, documented, missing = census(root)
    print("| public | with a docstring | share |")
    print("|---|---:|---:|")
    for kind, plural in (("function", "functions"), ("method", "methods"), ("class", "classes")):
        print(
            f"| {plural} | {documented[kind]} of {total[kind]} | "
            f"{100 * documented[kind] / total[kind]:.1f} % |"
        )
    all_, doc = sum(total.values()), sum(documented.values())
    print(f"| all | {doc} of {all_} | {100 * doc / all_:.1f} % |")
    if missing:
        print("\nmost undocumented:", ", ".join(f"{f} ({n})" for f, n in missing.most_common(8)))


if __name__ == "__main__":
    main()
