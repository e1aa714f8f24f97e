"""docs/layout.md names every module of the library, in the section of its package."""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PACKAGE = REPO / "workflow_scripts" / "wattflex"


def modules() -> set[str]:
    """Every module, as its path under ``wattflex/`` without ``.py`` (``runs/devices/nvml``)."""
    return {
        p.relative_to(PACKAGE).with_suffix("").as_posix()
        for p in PACKAGE.rglob("*.py")
        if p.name != "__init__.py"
    }


def listed(text: str) -> set[str]:
    """The modules the library's tables name: a first cell's backticked names, each under the
    package its section's heading names (``### `wattflex/runs/`: ...``), else under ``wattflex/``."""
    library = text[text.index("## The library") :]
    names: set[str] = set()
    prefix = ""
    for line in library.splitlines():
        if line.startswith("### "):
            m = re.search(r"`wattflex/([\w/]*)`", line)
            prefix = m.group(1) if m else ""
        elif line.startswith("| `"):
            first_cell = line.split("|")[1]
            names |= {prefix + name for name in re.findall(r"`([\w/]+)`", first_cell)}
    return names


def test_every_module_is_in_the_layout_page():
    text = (REPO / "docs" / "layout.md").read_text()
    missing = sorted(modules() - listed(text))
    assert not missing, f"docs/layout.md does not list: {missing}"


def test_the_layout_page_names_no_module_that_is_gone():
    text = (REPO / "docs" / "layout.md").read_text()
    gone = sorted(listed(text) - modules())
    assert not gone, f"docs/layout.md lists modules that do not exist: {gone}"


def test_a_missing_module_is_found(tmp_path):
    text = (
        (REPO / "docs" / "layout.md")
        .read_text()
        .replace("| `services/mv` |", "| `services/nothing` |")
    )
    assert "ops/services/mv" not in listed(text) and "ops/services/nothing" in listed(text)
