"""One home per default: a config key's default is stated once, as ``default:`` in the schema
(config/config.yaml states only what differs from it; the code reads the schema's).

The places a default can be restated, each read here: config/config.yaml (a value equal to
the schema's default at the same key), a dataclass field (a literal default for a field named
like a schema key), ``mapping.get("key", literal)`` (``setdefault``/``pop`` too), a function
argument's default and an argparse option's ``default=`` (a ``--key-name`` option's dest), each
with the schema's default of that key as the literal (a list's as its comma-joined string too).
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from wattflex.schema import read_schema, read_yaml

REPO = Path(__file__).resolve().parents[2]
PACKAGE = REPO / "workflow_scripts"
CONFIG = REPO / "config" / "config.yaml"

# Dataclass fields named like a schema key that are another fact (not a config key's default).
OTHER_FACTS = {
    (
        "Schedule",
        "source",
    ): "a grid schedule's origin (wattflex.ops.events), not the campaign's source:",
}


def schema_defaults(
    node: dict[str, Any], path: tuple[str, ...] = ()
) -> Iterator[tuple[tuple[str, ...], Any]]:
    """(path, default) of every leaf key with a ``default:`` (a section's ``{}`` is structure,
    not a fact); ``*`` stands for any key of a mapping (``control.scenarios.<name>``)."""
    for key, sub in (node.get("properties") or {}).items():
        if not isinstance(sub, dict):
            continue
        if "default" in sub and not isinstance(sub["default"], dict):
            yield (*path, key), sub["default"]
        yield from schema_defaults(sub, (*path, key))
    if isinstance(node.get("additionalProperties"), dict):
        yield from schema_defaults(node["additionalProperties"], (*path, "*"))


DEFAULTS = dict(schema_defaults(read_schema()))
BY_NAME: dict[str, list[tuple[str, Any]]] = {}
for _path, _value in DEFAULTS.items():
    BY_NAME.setdefault(_path[-1], []).append((".".join(_path), _value))


def same(a: Any, b: Any) -> bool:
    """Equal as YAML/JSON values: 1800 == 1800.0, but True is not 1."""
    return a == b and isinstance(a, bool) == isinstance(b, bool)


def same_kind(a: Any, b: Any) -> bool:
    kind = lambda v: (
        "bool"
        if isinstance(v, bool)
        else "number"
        if isinstance(v, (int, float))
        else type(v).__name__
    )
    return kind(a) == kind(b)


def restated_in_config(doc: Any, path: tuple[str, ...] = ()) -> Iterator[str]:
    if not isinstance(doc, dict):
        return
    for key, value in doc.items():
        where = (*path, str(key))
        for candidate in (where, (*path[:-1], "*", str(key)) if path else None):
            if candidate in DEFAULTS and same(value, DEFAULTS[candidate]):
                yield f"{'.'.join(where)}: {value!r} (the schema's default)"
        yield from restated_in_config(value, where)


def literal(node: ast.AST) -> tuple[bool, Any]:
    try:
        return True, ast.literal_eval(node)
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        return False, None


def is_dataclass(cls: ast.ClassDef) -> bool:
    for d in cls.decorator_list:
        f = d.func if isinstance(d, ast.Call) else d
        if (isinstance(f, ast.Name) and f.id == "dataclass") or (
            isinstance(f, ast.Attribute) and f.attr == "dataclass"
        ):
            return True
    return False


def field_default(value: ast.AST | None) -> ast.AST | None:
    """The default expression of ``x: T = value`` (``field(default=...)`` too)."""
    if (
        isinstance(value, ast.Call)
        and getattr(value.func, "id", getattr(value.func, "attr", "")) == "field"
    ):
        return next((k.value for k in value.keywords if k.arg == "default"), None)
    return value


def same_setting(name: str, value: Any) -> list[str]:
    """The schema keys named ``name`` whose default is ``value`` (a list's also as the comma-joined
    string a command line takes)."""
    return [
        p
        for p, d in BY_NAME.get(name, [])
        if same(value, d)
        or (isinstance(d, list) and isinstance(value, str) and value == ",".join(map(str, d)))
    ]


def argument_defaults(node: ast.AST) -> Iterator[tuple[str, ast.AST]]:
    """(name, default expression) of each argument of a function that has a default."""
    a = node.args
    positional = a.posonlyargs + a.args
    yield from zip((x.arg for x in positional[len(positional) - len(a.defaults) :]), a.defaults)
    yield from ((x.arg, d) for x, d in zip(a.kwonlyargs, a.kw_defaults) if d is not None)


def option_dest(call: ast.Call) -> str | None:
    """The dest of ``parser.add_argument(...)``: its ``dest=``, else its first long option's
    name (``--period-s``: ``period_s``), else its first name."""
    keywords = {k.arg: k.value for k in call.keywords}
    if "dest" in keywords:
        ok, dest = literal(keywords["dest"])
        return dest if ok else None
    names = [a.value for a in call.args if isinstance(a, ast.Constant) and isinstance(a.value, str)]
    name = next((n for n in names if n.startswith("--")), names[0] if names else None)
    return name.lstrip("-").replace("-", "_") if name else None


def restated_defaults(node: ast.AST, where: str) -> Iterator[str]:
    """A function argument's or an argparse option's literal default that is a schema key's."""
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
        for name, expr in argument_defaults(node):
            ok, value = literal(expr)
            hits = same_setting(name, value) if ok and value is not None else []
            if hits:
                fn = getattr(node, "name", "lambda")
                yield f"{where}:{expr.lineno}: {fn}({name}={value!r}) (schema: {', '.join(hits)})"
    elif (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr == "add_argument"
    ):
        expr = next((k.value for k in node.keywords if k.arg == "default"), None)
        dest = option_dest(node)
        ok, value = literal(expr) if expr is not None else (False, None)
        hits = same_setting(dest, value) if ok and value is not None and dest else []
        if hits:
            yield f"{where}:{node.lineno}: option {dest} default={value!r} (schema: {', '.join(hits)})"


def restated_in_code(tree: ast.AST, where: str) -> Iterator[str]:
    for node in ast.walk(tree):
        yield from restated_defaults(node, where)
        if isinstance(node, ast.ClassDef) and is_dataclass(node):
            for stmt in node.body:
                if not (isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name)):
                    continue
                name, expr = stmt.target.id, field_default(stmt.value)
                ok, value = literal(expr) if expr is not None else (False, None)
                if (
                    not ok
                    or value is None
                    or name not in BY_NAME
                    or (node.name, name) in OTHER_FACTS
                ):
                    continue
                # the same value restated, or one that disagrees with it (of its kind, or where it has none)
                hits = [
                    p
                    for p, d in BY_NAME[name]
                    if same(value, d) or same_kind(value, d) or d is None
                ]
                if hits:
                    yield f"{where}:{stmt.lineno}: {node.name}.{name} = {value!r} (schema: {', '.join(hits)})"
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr in ("get", "setdefault", "pop")
            and len(node.args) == 2
            and isinstance(node.args[0], ast.Constant)
            and node.args[0].value in BY_NAME
        ):
            ok, value = literal(node.args[1])
            hits = [p for p, d in BY_NAME[node.args[0].value] if ok and same(value, d)]
            if hits:
                yield (
                    f"{where}:{node.lineno}: .{node.func.attr}({node.args[0].value!r}, {value!r}) "
                    f"(schema: {', '.join(hits)})"
                )


def package_restatements() -> list[str]:
    out = []
    for path in sorted(PACKAGE.rglob("*.py")):
        out += restated_in_code(ast.parse(path.read_text(), str(path)), str(path.relative_to(REPO)))
    return out


def test_config_yaml_states_only_what_differs_from_the_schema():
    restated = list(restated_in_config(read_yaml(CONFIG)))
    assert not restated, (
        "config/config.yaml restates the schema's defaults (delete them there; the "
        "schema is their home):\n  " + "\n  ".join(restated)
    )


def test_no_default_in_code_restates_the_schema():
    restated = package_restatements()
    assert not restated, (
        "a schema default stated again in code (take it from wattflex.schema."
        "section_defaults):\n  " + "\n  ".join(restated)
    )


@pytest.mark.parametrize(
    "source, found",
    [
        (
            "from dataclasses import dataclass\n@dataclass\nclass T:\n    duration_s: float = 1800.0\n",
            "T.duration_s",
        ),
        (
            "from dataclasses import dataclass, field\n@dataclass\nclass T:\n    compile: bool = field(default=False)\n",
            "T.compile",
        ),
        ("def f(run):\n    return run.get('sample_period_s', 5)\n", ".get('sample_period_s', 5)"),
        (
            "def f(g):\n    return g.setdefault('aggregate', 'top10')\n",
            ".setdefault('aggregate', 'top10')",
        ),
        ("def f(df, *, alpha=0.05):\n    pass\n", "f(alpha=0.05)"),
        ("def f(df, p_adjust='holm', x=1):\n    pass\n", "f(p_adjust='holm')"),
        ("def f():\n    p.add_argument('--period-s', type=float, default=5.0)\n", "period_s"),
        ("def f():\n    p.add_argument('-a', '--alpha', default=0.05)\n", "alpha"),
        ("def f():\n    p.add_argument('--x', dest='response_s', default=30)\n", "response_s"),
        (
            "def f():\n    p.add_argument('--cluster-order', default='dense,moe-pt,moe-ft')\n",
            "cluster_order",
        ),
    ],
)
def test_the_check_finds_each_kind_of_restatement(source, found):
    hits = list(restated_in_code(ast.parse(source), "x.py"))
    assert len(hits) == 1 and found in hits[0]


@pytest.mark.parametrize(
    "source",
    [
        "def f(run):\n    return run.get('sample_period_s')\n",  # no default: the filled config's
        "def f(g):\n    return g.get('gpus', 1)\n",  # not control.cluster.gpus' 256
        "from dataclasses import dataclass\n@dataclass\nclass T:\n    duration_s: float = DEFAULTS['duration_s']\n",
        "def f(df, alpha=0.01, p_adjust=_STATS['p_adjust']):\n    pass\n",  # another value; the schema's
        "def f(df, sample_period_s=None):\n    pass\n",  # None: the caller's or the config's
        "def f():\n    p.add_argument('--period-s', type=float, default=D['period_s'])\n",
        "def f():\n    p.add_argument('--alpha', type=float)\n",  # no default
        "def f():\n    p.add_argument('--gpus', type=int, default=1)\n",  # not 256
    ],
)
def test_the_check_leaves_defaults_taken_from_the_schema(source):
    assert list(restated_in_code(ast.parse(source), "x.py")) == []


def test_the_config_check_finds_a_restated_key_and_a_restated_scenario_key():
    doc = {
        "run": {"duration_s": 1800, "gap_s": 60},
        "control": {"scenarios": {"s": {"signal": "x.csv", "response_s": 30}}},
    }
    hits = list(restated_in_config(doc))
    assert [h.split(":")[0] for h in hits] == ["run.duration_s", "control.scenarios.s.response_s"]


def test_a_train_config_without_a_spec_is_the_job_an_empty_spec_describes():
    """TrainConfig's defaults are the schema's, as from_spec fills them for a spec that sets nothing."""
    from dataclasses import asdict

    from wattflex.runs.training.train_config import TrainConfig

    bare, spec = asdict(TrainConfig(model_facts={})), asdict(TrainConfig.from_spec({}, "."))
    bare.pop("attn_implementation"), spec.pop("attn_implementation")  # the catalog's, per model
    assert bare == spec
    assert bare["compile"] is True and bare["eval_at_s"] is None and bare["seq_len"] == 4096
