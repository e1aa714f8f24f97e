"""Campaign configuration: validation and grid expansion.

``load_config`` reads YAML, validates it against ``config/schema/config.schema.yaml`` and
then checks what a schema cannot (models exist in the catalog, caps inside the device's
limits, unique group ids, known cap grids, repeats naming real runs). Every problem is a
``ConfigError`` whose message names the offending key, e.g. ``groups[3].caps``.
``expand_runs`` turns a validated config into the sweep table: one row per
(group, cap, repeat).
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import jsonschema
import yaml

from wattflex.errors import ConfigError
from wattflex.gpus import DEFAULT_GPU, GPUS

REPO_ROOT = Path(__file__).resolve().parents[2]
SCHEMA_PATH = REPO_ROOT / "config" / "schema" / "config.schema.yaml"


# run.* keys that decide how runs are scheduled, not what they measure: kept out of run
# specs, so changing them never reruns a run.
SCHEDULING_KEYS = ("parallel_within_group", "retries")


def _key_path(path) -> str:
    out = ""
    for p in path:
        out += f"[{p}]" if isinstance(p, int) else (f".{p}" if out else str(p))
    return out or "(top level)"


def validate_schema(cfg: dict[str, Any], schema_path: str | Path = SCHEMA_PATH) -> None:

    schema = yaml.safe_load(Path(schema_path).read_text())
    validator = jsonschema.Draft202012Validator(schema)
    errors = sorted(validator.iter_errors(cfg), key=lambda e: (len(e.absolute_path), list(map(str, e.absolute_path))))
    if errors:
        e = errors[0]
        msg = e.message
        if e.validator == "pattern":
            msg = f"{e.instance!r} has characters unsafe in paths or shells (allowed: letters, digits, . _ -)"
        elif e.validator == "additionalProperties":
            msg = f"unknown key: {e.message}"
        more = f" (and {len(errors) - 1} more problem(s))" if len(errors) > 1 else ""
        raise ConfigError(f"config error at {_key_path(e.absolute_path)}: {msg}{more}")


def load_catalog(path: str | Path) -> dict[str, dict[str, Any]]:
    doc = yaml.safe_load(Path(path).read_text())
    if not isinstance(doc, dict) or "models" not in doc:
        raise ConfigError(f"models catalog {path}: expected a top-level 'models:' mapping")
    return doc["models"]


def resolve_path(cfg_value: str, base: Path = REPO_ROOT) -> Path:
    p = Path(cfg_value)
    return p if p.is_absolute() else base / p


def groups(cfg: dict[str, Any]) -> list[dict[str, Any]]:
    """Groups with defaults applied, caps resolved and cluster derived."""
    out = []
    defaults = cfg.get("group_defaults", {})
    catalog = cfg.get("_catalog", {})
    for raw in cfg["groups"]:
        g = {**copy.deepcopy(defaults), **raw}
        g.setdefault("gpu", DEFAULT_GPU)
        g.setdefault("set", "headline")
        g.setdefault("matches", "")
        if "caps" not in g:
            g["caps"] = list(cfg.get("cap_grids", {}).get(g.get("cap_grid", ""), []))
        g["caps"] = sorted(float(c) for c in g["caps"])
        g.pop("cap_grid", None)
        arch = catalog.get(g["model"], {}).get("architecture", "dense")
        g.setdefault("cluster", "dense" if arch == "dense" else ("moe-pt" if g["task"] == "pt" else "moe-ft"))
        g["architecture"] = arch
        out.append(g)
    return out


def check_semantics(cfg: dict[str, Any]) -> None:
    catalog = cfg["_catalog"]
    seen: dict[str, int] = {}
    for i, (raw, g) in enumerate(zip(cfg["groups"], groups(cfg))):
        where = f"groups[{i}]"
        if g["id"] in seen:
            raise ConfigError(f"config error at {where}.id: duplicate group id {g['id']!r} (also groups[{seen[g['id']]}])")
        seen[g["id"]] = i
        if g["model"] not in catalog:
            raise ConfigError(f"config error at {where}.model: unknown model {g['model']!r}; "
                              f"known: {', '.join(sorted(catalog))}")
        if "caps" not in raw and raw.get("cap_grid", cfg.get("group_defaults", {}).get("cap_grid")) not in cfg.get("cap_grids", {}):
            raise ConfigError(f"config error at {where}.cap_grid: unknown cap grid "
                              f"{raw.get('cap_grid', cfg.get('group_defaults', {}).get('cap_grid'))!r}")
        if not g["caps"]:
            raise ConfigError(f"config error at {where}.caps: empty cap grid")
        spec = GPUS[g["gpu"]]
        for c in g["caps"]:
            if not spec.min_limit_w <= c <= spec.max_limit_w:
                raise ConfigError(f"config error at {where}.caps: cap {c:g} W is outside the {spec.name}'s "
                                  f"power-limit range {spec.min_limit_w:g}-{spec.max_limit_w:g} W")
        if len(set(g["caps"])) != len(g["caps"]):
            raise ConfigError(f"config error at {where}.caps: duplicate caps {g['caps']}")
        if g.get("task") == "pt" and catalog[g["model"]]["architecture"] == "moe" and g.get("ep", 1) > g["gpus"]:
            raise ConfigError(f"config error at {where}.ep: expert-parallel degree {g['ep']} > gpus {g['gpus']}")
    by_id = {g["id"]: g for g in groups(cfg)}
    for i, r in enumerate(cfg.get("repeats", []) or []):
        if r["group"] not in by_id:
            raise ConfigError(f"config error at repeats[{i}].group: unknown group {r['group']!r}")
        if float(r["cap_w"]) not in by_id[r["group"]]["caps"]:
            raise ConfigError(f"config error at repeats[{i}].cap_w: {r['cap_w']} W is not in the caps of {r['group']}")
    for g in by_id.values():
        if g["matches"] and g["matches"] not in by_id:
            raise ConfigError(f"config error at group {g['id']}.matches: unknown group {g['matches']!r}")


def prepare(cfg: dict[str, Any], base: Path = REPO_ROOT, schema_path: str | Path = SCHEMA_PATH) -> dict[str, Any]:
    """Validate a loaded config in place and attach the model catalog (``_catalog``)."""
    if not isinstance(cfg, dict):
        raise ConfigError("config error at (top level): expected a mapping")
    validate_schema(cfg, schema_path)
    if cfg.get("source", "generate") == "generate":
        cat_path = resolve_path(cfg.get("models_catalog", "config/models.yaml"), base)
        if not cat_path.is_file():
            raise ConfigError(f"config error at models_catalog: file not found: {cat_path}")
        cfg["_catalog"] = load_catalog(cat_path)
        check_semantics(cfg)
    return cfg


def load_config(path: str | Path, base: Path = REPO_ROOT) -> dict[str, Any]:
    try:
        cfg = yaml.safe_load(Path(path).read_text())
    except yaml.YAMLError as exc:
        raise ConfigError(f"config error: {path} is not valid YAML: {exc}") from None
    return prepare(cfg, base)


def run_id(cap_w: float, repeat: int) -> str:
    return f"cap{cap_w:g}" + (f"_r{repeat}" if repeat else "")


def expand_runs(cfg: dict[str, Any]) -> list[dict[str, Any]]:
    """The sweep table: one dict per (group, cap, repeat)."""
    n_rep = {(r["group"], float(r["cap_w"])): int(r["n"]) for r in cfg.get("repeats", []) or []}
    rows = []
    for g in groups(cfg):
        for cap in g["caps"]:
            for k in range(n_rep.get((g["id"], cap), 1)):
                rows.append({"group": g["id"], "cap_w": cap, "repeat": k, "run_id": run_id(cap, k)})
    return rows


def run_spec(cfg: dict[str, Any], group_id: str, run: str) -> dict[str, Any]:
    """Everything one run needs (and nothing else): the run rule's params."""
    g = next(g for g in groups(cfg) if g["id"] == group_id)
    row = next(r for r in expand_runs(cfg) if r["group"] == group_id and r["run_id"] == run)
    spec = {
        "campaign": cfg["campaign"], "backend": cfg["backend"], "run_id": run, "cap_w": row["cap_w"],
        "repeat": row["repeat"], "seed": int(cfg.get("seed", 0)),
        "group": {k: v for k, v in g.items() if k not in ("caps",)},
        "model_facts": cfg["_catalog"][g["model"]],
        "run": {k: v for k, v in cfg.get("run", {}).items() if k not in SCHEDULING_KEYS},
    }
    if cfg["backend"] == "cuda":
        spec["cuda"] = dict(cfg.get("cuda", {}))
    return spec
