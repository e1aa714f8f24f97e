"""No two modules of workflow_scripts/ share a file name where a finder would confuse them.

The one convention (docs/layout.md, "File names"): a *face* of a thing may share the thing's
name. The faces are ``commands/<x>.py`` (the ``wattflex <x>`` command), ``plots/<x>.py`` (the
figures of ``<x>``) and the rule scripts ``workflow_scripts/<x>.py`` (the Snakemake rule's
thin script); the thing is at most one other module, ``<x>.py`` anywhere in the library, or the
package ``<x>/``. Two modules that are not faces (``config.py`` and ``runs/training/config.py``)
never share a name.
"""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

SCRIPTS = Path(__file__).resolve().parents[2] / "workflow_scripts"
#: Where the faces live, relative to workflow_scripts/ ("." : the rule scripts).
FACES = ("wattflex/commands", "wattflex/plots", ".")
#: Names every package repeats by design.
PACKAGE_FILES = {"__init__.py", "__main__.py"}


def module_paths() -> list[str]:
    """Every module under workflow_scripts/, as its path relative to it."""
    return sorted(p.relative_to(SCRIPTS).as_posix() for p in SCRIPTS.rglob("*.py"))


def confusable(paths: list[str]) -> dict[str, list[str]]:
    """The repeated file names the convention does not allow, each with its paths: those where
    more than one path is not a face (a module of ``commands/``, ``plots/`` or a rule script)."""
    by_name: dict[str, list[str]] = defaultdict(list)
    for path in paths:
        name = path.rsplit("/", 1)[-1]
        if name not in PACKAGE_FILES:
            by_name[name].append(path)
    return {
        name: found
        for name, found in by_name.items()
        if sum(str(Path(p).parent) not in FACES for p in found) > 1
    }


def test_no_two_modules_share_a_file_name_outside_the_convention():
    bad = confusable(module_paths())
    assert not bad, (
        "modules sharing a file name (rename one, or see docs/layout.md 'File names'): "
        + "; ".join(f"{name}: {', '.join(paths)}" for name, paths in sorted(bad.items()))
    )


def test_two_library_modules_of_one_name_are_found():
    planted = [*module_paths(), "wattflex/runs/training/config.py"]
    assert confusable(planted) == {
        "config.py": ["wattflex/config.py", "wattflex/runs/training/config.py"]
    }


def test_faces_may_share_the_name_of_what_they_show():
    paths = ["wattflex/grid/offer.py", "wattflex/commands/offer.py", "offer.py"]
    assert confusable(paths) == {}
    assert confusable([*paths, "wattflex/allocation/offer.py"])  # two things named offer
