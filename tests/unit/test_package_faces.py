"""Each package's face: the names its ``__init__.pyi`` hands on (lazy_loader), as docs/layout.md
lists them, each the very object of the module the stub names, loaded only when used; and a
rule script that imports one depends, for its code fingerprint, on that module alone."""

from __future__ import annotations

import ast
import importlib
import os
import pkgutil
import re
import subprocess
import sys
from pathlib import Path

import pytest

from wattflex import fingerprint

REPO = Path(__file__).resolve().parents[2]
LIB = REPO / "workflow_scripts" / "wattflex"
FACES = (
    "wattflex",
    "wattflex.ingest",
    "wattflex.runs",
    "wattflex.runs.devices",
    "wattflex.runs.sweep",
    "wattflex.runs.training",
    "wattflex.analysis",
    "wattflex.plots",
)
HEAVY = ("numpy", "pandas", "pyarrow", "scipy", "matplotlib", "torch", "transformers")


def stub_names(package: str) -> dict[str, str]:
    """name -> defining module, as the package's ``__init__.pyi`` imports them."""
    stub = LIB.joinpath(*package.split(".")[1:]) / "__init__.pyi"
    return {
        alias.name: f"{package}.{node.module}"
        for node in ast.parse(stub.read_text()).body
        if isinstance(node, ast.ImportFrom)
        for alias in node.names
    }


def layout_faces(text: str) -> dict[str, list[str]]:
    """docs/layout.md's "Package faces" table: package -> the names it lists."""
    section = text[text.index("## Package faces") : text.index("## The library")]
    return {
        m.group(1): re.findall(r"`(\w+)`", m.group(2))
        for m in re.finditer(r"^\| `([\w.]+)` \| (.*) \|$", section, re.M)
    }


@pytest.mark.parametrize("package", FACES)
def test_each_name_is_the_object_of_its_module(package):
    face = importlib.import_module(package)
    names = stub_names(package)
    assert sorted(face.__all__) == sorted(names)
    for name, module in names.items():
        assert getattr(face, name) is getattr(importlib.import_module(module), name), name


@pytest.mark.parametrize("package", FACES)
def test_no_name_shadows_a_module_of_its_package(package):
    face = importlib.import_module(package)
    modules = {m.name for m in pkgutil.iter_modules(face.__path__)}
    assert not modules & set(face.__all__)


def test_the_layout_page_lists_each_face():
    listed = layout_faces((REPO / "docs" / "layout.md").read_text())
    assert listed == {p: list(importlib.import_module(p).__all__) for p in FACES}


def test_a_name_missing_from_the_layout_page_is_found():
    text = (REPO / "docs" / "layout.md").read_text().replace("`kruskal_dunn`, ", "")
    assert "kruskal_dunn" not in layout_faces(text)["wattflex.analysis"]


def test_importing_the_faces_and_listing_their_names_imports_no_heavy_library():
    code = (
        "import sys, importlib\n"
        f"for p in {FACES!r}: assert importlib.import_module(p).__all__, p\n"
        f"heavy = sorted(m for m in {HEAVY!r} if m in sys.modules)\n"
        "assert not heavy, heavy\n"
    )
    env = {**os.environ, "PYTHONPATH": str(LIB.parent)}
    res = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert res.returncode == 0, res.stderr


def test_a_script_importing_a_face_name_depends_on_its_module_alone(tmp_path):
    script = tmp_path / "rule_script.py"
    script.write_text("from wattflex.analysis import kruskal_dunn\n")
    direct = tmp_path / "direct_script.py"
    direct.write_text("from wattflex.analysis.stats import kruskal_dunn\n")
    assert fingerprint.closure(script) == fingerprint.closure(direct)
    assert "analysis.stats" in fingerprint.closure(script)
    assert "analysis.predictor" not in fingerprint.closure(script)  # another name of the face
    assert fingerprint.script_fingerprint(script) == fingerprint.script_fingerprint(direct)
