"""The library's shape: no import cycle, plotting only under plots/, subpackages that say what
they are, and no comment, docstring or doc that names a repo file or module that does not
exist."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
LIB = REPO / "workflow_scripts" / "wattflex"


def module_name(path: Path) -> str:
    rel = path.relative_to(LIB.parent).with_suffix("")
    return ".".join(rel.parts[:-1] if rel.name == "__init__" else rel.parts)


def library_files() -> list[Path]:
    return sorted(LIB.rglob("*.py"))


def imports_of(path: Path) -> set[str]:
    """wattflex modules a module imports (anywhere in it), as dotted names."""
    name = module_name(path)
    pkg = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names if a.name.startswith("wattflex"))
        elif isinstance(node, ast.ImportFrom):
            mod = (
                ".".join(
                    [*pkg[: len(pkg) - node.level + 1], *(node.module or "").split(".")]
                ).strip(".")
                if node.level
                else node.module or ""
            )
            if mod.split(".")[0] != "wattflex":
                continue
            for a in node.names:  # `from pkg import submodule` depends on the submodule only
                sub = f"{mod}.{a.name}"
                if (LIB.parent / sub.replace(".", "/")).with_suffix(".py").is_file() or (
                    LIB.parent / sub.replace(".", "/") / "__init__.py"
                ).is_file():
                    out.add(sub)
                else:
                    out.add(mod)
    return out - {name}


def test_no_import_cycle_in_the_package():
    graph = {module_name(p): imports_of(p) for p in library_files()}
    state: dict[str, int] = {}
    cycles = []

    def visit(mod: str, stack: list[str]) -> None:
        state[mod] = 1
        for dep in sorted(graph.get(mod, ())):
            if dep == "wattflex" or dep not in graph:  # the root package holds no logic
                continue
            if state.get(dep) == 1:
                cycles.append(stack[stack.index(dep) :] + [dep] if dep in stack else [mod, dep])
            elif dep not in state:
                visit(dep, stack + [dep])
        state[mod] = 2

    for mod in sorted(graph):
        if mod not in state:
            visit(mod, [mod])
    assert not cycles, f"import cycles: {cycles}"


def test_matplotlib_is_imported_only_under_plots():
    """Outside plots/, only a command (the CLI: ``wattflex control --mv-out`` draws its M&V
    figure) may import plot code, and only inside a function, so ``--help`` and the other
    commands stay light; no rule script imports a command, so a plot change still reruns
    figure rules and the report, never a simulation (rule fingerprints follow imports)."""
    offenders = []
    for path in library_files():
        rel = path.relative_to(LIB)
        if rel.parts[0] == "plots":
            continue
        tree = ast.parse(path.read_text())
        top = set(map(id, tree.body))
        for node in ast.walk(tree):
            names = (
                [a.name for a in node.names]
                if isinstance(node, ast.Import)
                else [node.module or ""]
                if isinstance(node, ast.ImportFrom)
                else []
            )
            if any(
                n.split(".")[0] == "matplotlib" or n.startswith("wattflex.plots") for n in names
            ):
                if rel.parts[0] != "commands" or id(node) in top:
                    offenders.append(str(rel))
    assert not offenders, (
        f"modules outside plots/ that import matplotlib or plot code: {sorted(set(offenders))}"
    )
    rule_scripts = [
        p for p in (REPO / "workflow_scripts").glob("*.py") if "wattflex.commands" in p.read_text()
    ]
    assert not rule_scripts, f"rule scripts importing a command (and so plot code): {rule_scripts}"


@pytest.mark.parametrize("package", sorted(p.parent.name for p in LIB.glob("*/__init__.py")))
def test_each_subpackage_says_what_it_is_for(package):
    doc = ast.get_docstring(ast.parse((LIB / package / "__init__.py").read_text()))
    assert doc and len(doc.split()) >= 8, (
        f"wattflex/{package}/__init__.py needs a docstring stating its job"
    )


# ---- references in comments, docstrings and docs ---------------------------------------

TOP_DIRS = (
    "benchmarks",
    "tests",
    "rules",
    "config",
    "workflow_scripts",
    "resources",
    "profiles",
    "slurm",
    "envs",
    ".ci",
)
PATH_RE = re.compile(
    r"(?<![\w/.-])((?:" + "|".join(re.escape(d) for d in TOP_DIRS) + r")/[\w./-]*\w)"
)
LIB_PATH_RE = re.compile(r"(?<![\w/.-])wattflex/([\w/]+\.py)")
MODULE_RE = re.compile(r"(?<![\w./-])wattflex\.([a-z_][\w]*(?:\.[a-z_][\w]*)*)")


def text_files() -> list[Path]:
    files = [
        REPO / "README.md",
        *REPO.glob("docs/**/*.md"),
        REPO / "Snakefile",
        *REPO.glob("rules/**/*.smk"),
        *REPO.glob("config/**/*.yaml"),
        *REPO.glob("workflow_scripts/**/*.py"),
        *REPO.glob("benchmarks/*.py"),
        *REPO.glob("resources/**/*.md"),
    ]
    return [f for f in files if "__pycache__" not in f.parts]


def resolves(dotted: str) -> bool:
    """True if ``wattflex.<dotted>`` names a real module or package, followed by attributes;
    a package's attributes are its submodules and the names its __init__ defines."""
    node = ""
    for part in dotted.split("."):
        here = LIB.joinpath(*node.split(".")) if node else LIB
        if here.with_suffix(".py").is_file():
            return True  # the rest are attributes of a module
        sub = f"{node}.{part}".lstrip(".")
        if (here / part).with_suffix(".py").is_file() or (here / part / "__init__.py").is_file():
            node = sub
            continue
        init = (here / "__init__.py").read_text()
        return re.search(rf"^(def |class )?{part}\b", init, re.M) is not None
    return True


def test_no_text_names_a_repo_file_or_module_that_does_not_exist():
    missing = []
    for f in text_files():
        text = f.read_text()
        for m in PATH_RE.finditer(text):
            path = m.group(1).rstrip(".")
            if any(c in path for c in "*{<") or path.startswith(("results/", "logs/")):
                continue
            if not (REPO / path).exists():
                missing.append(f"{f.relative_to(REPO)}: {path}")
        for m in LIB_PATH_RE.finditer(text):
            if not (LIB / m.group(1)).exists():
                missing.append(f"{f.relative_to(REPO)}: wattflex/{m.group(1)}")
        for m in MODULE_RE.finditer(text):
            if not resolves(m.group(1)):
                missing.append(f"{f.relative_to(REPO)}: wattflex.{m.group(1)}")
    assert not missing, "references to files/modules that do not exist:\n" + "\n".join(
        sorted(set(missing))
    )


def test_what_the_snakefile_imports_at_every_start_stays_light():
    """Every `snakemake` call (a dry run, a rerun, each SLURM job) parses the rule files: the
    wattflex modules they import pull in no numpy, pandas, pyarrow, scipy or matplotlib
    (~0.1-0.4 s each on every start). rules/ingest.smk, included only for ingest
    campaigns, lists the campaign's data files with the ingest readers and is left out."""
    import subprocess
    import sys

    modules = sorted(
        {
            m
            for smk in (REPO / "rules").glob("**/*.smk")
            if smk.name != "ingest.smk"
            for m in re.findall(r"^from (wattflex[\w.]*) import", smk.read_text(), re.M)
        }
    )
    assert "wattflex.config" in modules and "wattflex.report_sections" in modules
    code = (
        f"import sys; import {', '.join(modules)}; "
        "heavy = sorted(m for m in ('numpy', 'pandas', 'pyarrow', 'scipy', 'matplotlib') if m in sys.modules); "
        "assert not heavy, heavy"
    )
    res = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=REPO / "workflow_scripts",
    )
    assert res.returncode == 0, res.stderr
