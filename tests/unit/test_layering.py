"""Package-level layering: no wattflex module imports a module of a higher layer.

tests/unit/test_layout.py finds file-level import cycles; this finds the arrows that point
up between packages (``runs.sweep -> analysis`` while ``analysis -> runs``: a package cycle
no single module shows). Every import counts, at the top or inside a function (a lazy import
is still a dependency). A module may import the layers below and its own layer, but not in a
circle: two names of one layer (a top-level module or a subpackage) that import each other,
directly or through others of that layer, are one thing in two places (``same_layer_circles``).
"""

import ast
from pathlib import Path

import pytest

LIB = Path(__file__).resolve().parents[2] / "workflow_scripts" / "wattflex"

#: Bottom to top. A name is a top-level module or a subpackage (and all its modules).
LAYERS = [
    # core: facts and plumbing every stage shares
    [
        "wattflex",
        "errors",
        "provenance",
        "labels",
        "vocabulary",
        "gpus",
        "architectures",
        "run_ids",
        "schema",
        "telemetry",
        "fingerprint",
        "smk",
        "config",
        "pfi",
        "pfi_model",
        "pfi_tolerances",
        "metrics",
        "policies",
    ],
    ["ingest"],  # measured sweeps and DCGM captures from elsewhere
    [
        "runs",
        "snakemake_internals",
    ],  # where runs come from; the Snakemake hooks that guard real runs
    ["analysis"],  # PFI, statistics, predictor, tables, fitting the emulator to them
    ["allocation"],  # splitting a power cut across jobs
    # the operations wing (wattflex/ops/), four levels: the one event model at its bottom,
    ["ops", "ops.events"],
    # the models that compute on events (caps from readings, an emulated cluster, baselines),
    ["ops.controller", "ops.clustersim", "ops.baselines"],
    # the adapters to the outside world (OpenADR 2.0b/3, SLURM, the site file),
    ["ops.adapters"],
    # and the services (node agent, SLURM coordinator, M&V, offer, statement, exporter)
    ["ops.services"],
    [
        "plots",
        "report_sections",
        "report_format",
        "report_findings",
        "report",
        "diagnosis",
    ],  # figures, the HTML report, what a machine offers
    ["commands", "cli"],  # the `wattflex` command
]

#: Arrows that point up today, each with why it is allowed for now. Nothing else may.
ALLOWED_UP: set[tuple[str, str]] = set()


def _module_name(path: Path) -> str:
    rel = path.relative_to(LIB).with_suffix("")
    parts = rel.parts[:-1] if rel.name == "__init__" else rel.parts
    return ".".join(parts) or "wattflex"


def _resolve(base: str, names: list[str]) -> list[str]:
    """``from base import a, b``: the modules it names (``a`` if it is a submodule, else base)."""
    out = []
    for name in names:
        sub = f"{base}.{name}" if base != "wattflex" else name
        rel = Path(*sub.split("."))
        out.append(
            sub
            if (LIB / rel).with_suffix(".py").is_file() or (LIB / rel / "__init__.py").is_file()
            else base
        )
    return out


def imports(path: Path, source: str | None = None) -> set[str]:
    """wattflex modules ``path`` (its text, or ``source``) imports anywhere in it, as names
    relative to the package."""
    here = _module_name(path)
    package = here.split(".") if path.name == "__init__.py" else here.split(".")[:-1]
    if package == ["wattflex"]:
        package = []
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text() if source is None else source)):
        if isinstance(node, ast.Import):
            found.update(
                a.name.removeprefix("wattflex.") if a.name != "wattflex" else "wattflex"
                for a in node.names
                if a.name.split(".")[0] == "wattflex"
            )
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                parts = package[: len(package) - (node.level - 1)] + (
                    node.module.split(".") if node.module else []
                )
                base = ".".join(parts) or "wattflex"
            elif node.module and node.module.split(".")[0] == "wattflex":
                base = (
                    node.module.removeprefix("wattflex.")
                    if node.module != "wattflex"
                    else "wattflex"
                )
            else:
                continue
            found.update(_resolve(base, [a.name for a in node.names]))
    return found


def layer_of(module: str) -> int:
    """The layer of a module (its longest listed prefix)."""
    best = None
    for i, names in enumerate(LAYERS):
        for name in names:
            if module == name or module.startswith(name + "."):
                if best is None or len(name) > best[0]:
                    best = (len(name), i)
    if best is None:
        raise KeyError(
            f"{module}: in no layer of tests/unit/test_layering.py's LAYERS; add it where it belongs"
        )
    return best[1]


def unit_of(module: str) -> str:
    """The LAYERS name a module belongs to (its longest listed prefix)."""
    names = [n for layer in LAYERS for n in layer if module == n or module.startswith(n + ".")]
    if not names:
        raise KeyError(f"{module}: in no layer of tests/unit/test_layering.py's LAYERS")
    return max(names, key=len)


def same_layer_circles(all_edges: list[tuple[str, str]]) -> list[frozenset[str]]:
    """The sets of two or more names of one layer that reach each other through imports among
    that layer's names (strongly connected components of the name graph, same-layer arrows
    only), sorted."""
    graph: dict[str, set[str]] = {}
    for a, b in all_edges:
        ua, ub = unit_of(a), unit_of(b)
        if ua != ub and layer_of(ua) == layer_of(ub):
            graph.setdefault(ua, set()).add(ub)

    def reach(start: str) -> set[str]:
        seen, todo = set(), [start]
        while todo:
            for nxt in graph.get(todo.pop(), ()):
                if nxt not in seen:
                    seen.add(nxt)
                    todo.append(nxt)
        return seen

    reached = {u: reach(u) for u in graph}
    circles = {
        frozenset({u} | {v for v in reached[u] if u in reached.get(v, ())})
        for u in graph
        if u in reached[u]
    }
    return sorted(circles, key=sorted)


def edges() -> list[tuple[str, str]]:
    return sorted(
        (_module_name(p), dep)
        for p in LIB.rglob("*.py")
        if "__pycache__" not in p.parts
        for dep in imports(p)
    )


def upward(all_edges: list[tuple[str, str]]) -> list[tuple[str, str]]:
    return [(a, b) for a, b in all_edges if layer_of(b) > layer_of(a)]


def test_every_module_has_a_layer():
    missing = []
    for p in LIB.rglob("*.py"):
        try:
            layer_of(_module_name(p))
        except KeyError as exc:
            missing.append(str(exc))
    assert not missing, "\n".join(missing)


def test_nothing_imports_upward():
    up = [e for e in upward(edges()) if e not in ALLOWED_UP]
    assert not up, (
        "imports of a higher layer (move the code down, or the import up):\n"
        + "\n".join(
            f"wattflex.{a} (layer {layer_of(a)}) imports wattflex.{b} (layer {layer_of(b)})"
            for a, b in up
        )
    )


def test_no_two_names_of_one_layer_import_each_other():
    circles = same_layer_circles(edges())
    assert not circles, (
        "names of one layer that import each other (move what both need into one, or down a "
        "layer):\n" + "\n".join(" <-> ".join(sorted(c)) for c in circles)
    )


def test_a_planted_same_layer_circle_is_caught():
    """pfi -> config -> pfi (core), runs.plan -> snakemake_internals -> runs through a lazy
    import (one layer), and a three-name circle; arrows between layers or inside one name are
    no circle."""
    planted = [
        ("pfi", "config.x"),
        ("config", "pfi"),
        ("runs.plan", "snakemake_internals"),
        ("snakemake_internals", "runs.devices.caps"),
        ("errors", "labels"),
        ("labels", "vocabulary"),
        ("vocabulary", "errors"),
        ("allocation.a", "allocation.b"),
        ("allocation.b", "allocation.a"),
        ("plots.x", "runs.y"),
    ]
    assert same_layer_circles(planted) == [
        frozenset({"config", "pfi"}),
        frozenset({"errors", "labels", "vocabulary"}),
        frozenset({"runs", "snakemake_internals"}),
    ]
    assert same_layer_circles([e for e in planted if e != ("config", "pfi")])[0] == frozenset(
        {"errors", "labels", "vocabulary"}
    )


def test_every_allowed_exception_is_still_needed():
    stale = ALLOWED_UP - set(upward(edges()))
    assert not stale, f"no longer imported upward, remove from ALLOWED_UP: {sorted(stale)}"


@pytest.mark.parametrize(
    "source, expected",
    [
        ("import wattflex.analysis.pfi as pfi\n", {"analysis.pfi"}),
        (
            "def f():\n    from wattflex.plots import sweeps\n",
            {"plots.sweeps"},
        ),  # lazy imports count
        ("from wattflex import gpus as g, __version__\n", {"gpus", "wattflex"}),
        ("from ..analysis.pfi import pfi_table\n", {"analysis.pfi"}),
        ("from . import curves\n", {"allocation.curves"}),
    ],
)
def test_imports_sees_every_kind_of_import(source, expected):
    # as if it were a module of wattflex.allocation, so relative imports resolve there
    assert imports(LIB / "allocation" / "probe.py", source) == expected


def test_an_upward_import_is_caught():
    # runs importing a figure module: plots sit above runs
    assert upward([("runs.runner", "plots.sweeps"), ("plots.sweeps", "runs.runner")]) == [
        ("runs.runner", "plots.sweeps")
    ]


#: The operations wing (docs/layout.md, DESIGN.md) and the study (the paper's pipeline): two
#: wings over one core, neither importing the other. The edges that still cross, each with why.
WING = ("ops",)
STUDY = ("analysis", "report", "report_sections", "report_findings", "report_format")
#: (none: the cluster simulation applies the fitted predictor through the core's pfi_model)
WING_STUDY_ALLOWED: set[tuple[str, str]] = set()


def _in(module: str, packages: tuple[str, ...]) -> bool:
    return any(module == p or module.startswith(p + ".") for p in packages)


def crossing(all_edges: list[tuple[str, str]]) -> list[tuple[str, str]]:
    """Imports between the operations wing and the study, either way."""
    return [
        (a, b)
        for a, b in all_edges
        if (_in(a, WING) and _in(b, STUDY)) or (_in(a, STUDY) and _in(b, WING))
    ]


def local_imports(path: Path) -> set[str]:
    """wattflex modules imported inside a function of ``path``."""
    tree = ast.parse(path.read_text())
    found: set[str] = set()
    for fn in ast.walk(tree):
        if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
            for node in ast.walk(fn):
                if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("wattflex."):
                    found.add(node.module.removeprefix("wattflex."))
    return found


def test_the_operations_wing_is_walled():
    # the wing and the study import each other only where WING_STUDY_ALLOWED says why
    crossed = crossing(edges())
    assert set(crossed) <= WING_STUDY_ALLOWED, sorted(set(crossed) - WING_STUDY_ALLOWED)
    assert WING_STUDY_ALLOWED <= set(crossed), "no longer imported: remove from WING_STUDY_ALLOWED"
    assert crossing([("ops.clustersim", "analysis.predictor")]) == [
        ("ops.clustersim", "analysis.predictor")
    ]
    assert crossing(
        [("report", "ops.services.mv"), ("ops.adapters.slurm", "allocation.curves")]
    ) == [("report", "ops.services.mv")]
    # inside the wing no wattflex import hides in a function (where it could dodge a cycle):
    # every one stands at the top of its module, where the layering and the import order see it
    hidden = sorted(
        (_module_name(p), m) for p in (LIB / "ops").rglob("*.py") for m in local_imports(p)
    )
    assert not hidden, hidden


def test_the_wing_has_its_own_levels():
    """events < models < adapters < services: an import from a lower level of the wing to a
    higher one is caught, and so is one from the event model to anything else of the wing."""
    levels = [layer_of(m) for m in ("ops.events", "ops.controller", "ops.adapters.slurm")]
    assert levels == sorted(levels) < [layer_of("ops.services.mv")] * 3
    planted = [
        ("ops.events", "ops.controller"),
        ("ops.controller", "ops.adapters.slurm"),
        ("ops.adapters.openadr", "ops.services.mv"),
        ("ops.services.node_agent", "ops.adapters.slurm"),
        ("ops.services.mv", "ops.events"),
        ("ops.clustersim", "ops.controller"),
    ]
    assert upward(planted) == planted[:3]
