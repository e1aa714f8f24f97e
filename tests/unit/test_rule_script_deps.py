"""The rule scripts need only the core install (``pip install -e .``, README command 1).

Every third-party module that a rule script (``workflow_scripts/*.py``) can reach, through the
wattflex modules it imports and theirs (every import, at the top or inside a function: a lazy
import still runs when the rule does), must come with a core dependency of pyproject.toml; the
exceptions are the measured path's modules, which a real run needs ``[train]`` for. A default
workflow once failed on a plain install because a statement rule reached an OpenADR 3 package
that only the test extras installed; the tests could not see it, as they run with the extras.
"""

from __future__ import annotations

import ast
import re
import sys
import tomllib
from pathlib import Path

from wattflex.fingerprint import handed_on

REPO = Path(__file__).resolve().parents[2]
SCRIPTS = REPO / "workflow_scripts"

# import name -> the core distribution it comes from (where the two names differ)
IMPORT_NAMES = {
    "sklearn": "scikit-learn",
    "scikit_posthocs": "scikit-posthocs",
    "yaml": "pyyaml",
    "prometheus_client": "prometheus-client",
}
# imported through a core dependency's own requirements
TRANSITIVE = {"PIL": "matplotlib requires pillow"}
# modules of the measured path (a real GPU run: ``pip install -e '.[train]'``), and what they import
MEASURED_PATH = ("wattflex.runs.training", "wattflex.runs.devices.nvml")


def core_distributions() -> set[str]:
    deps = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["dependencies"]
    return {re.split(r"[<>=!~\[; ]", d, maxsplit=1)[0].lower() for d in deps}


def module_file(name: str) -> Path | None:
    p = SCRIPTS / Path(*name.split("."))
    for f in (p / "__init__.py", p.with_suffix(".py")):
        if f.is_file():
            return f
    return None


def imported_names(path: Path, module: str) -> list[str]:
    """Every module ``path`` imports (``from a import b``: ``a`` and ``a.b``, b may be a module;
    where b is a name package ``a`` hands on, the module that defines it)."""
    out = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = module.split(".")[: -1 if path.name != "__init__.py" else None]
                base = base[: len(base) - node.level + 1]
                source = ".".join([*base, *([node.module] if node.module else [])])
            else:
                source = node.module or ""
            out += [source, *(f"{source}.{a.name}" for a in node.names)]
            if source == "wattflex" or source.startswith("wattflex."):  # a package's face
                face = handed_on(source.removeprefix("wattflex").lstrip("."))
                out += [f"wattflex.{face[a.name]}" for a in node.names if a.name in face]
    return out


def third_party_reached() -> dict[str, set[str]]:
    """Third-party top-level module -> the rule scripts' wattflex modules (or scripts) importing it."""
    seen: set[str] = set()
    todo = [(p, f"<rule script {p.name}>") for p in sorted(SCRIPTS.glob("*.py"))]
    reached: dict[str, set[str]] = {}
    while todo:
        path, module = todo.pop()
        for name in imported_names(path, module):
            top = name.split(".")[0]
            if top == "wattflex":
                f = module_file(name)
                if f is not None and name not in seen:
                    seen.add(name)
                    todo.append((f, name))
            elif top and top not in sys.stdlib_module_names:
                reached.setdefault(top, set()).add(module)
    return reached


def test_the_walk_sees_the_imports_it_must():
    reached = third_party_reached()
    assert {"numpy", "pandas", "matplotlib"} <= set(reached)
    # a measured run starts the trainer as a process of its own (torchrun -m wattflex.runs.training)
    # and reads the file names it leaves from train_config, which needs no torch: no rule script
    # imports torch, so the core install runs them all
    assert "torch" not in reached, reached.get("torch")


def test_every_rule_script_runs_on_the_core_install():
    core = core_distributions()
    wrong = {}
    for top, where in third_party_reached().items():
        if IMPORT_NAMES.get(top, top).lower().replace("_", "-") in core or top in TRANSITIVE:
            continue
        outside = sorted(m for m in where if not m.startswith(MEASURED_PATH))
        if outside:
            wrong[top] = outside
    assert not wrong, (
        "rule scripts reach packages the core install does not have (import them in the "
        f"measured path only, or make them core dependencies): {wrong}"
    )
