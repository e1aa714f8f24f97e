"""Campaign configuration: validation and grid expansion.

``load_config`` reads YAML, validates it against ``config/schema/config.schema.yaml`` and
then checks what a schema cannot (models exist in the catalog, caps inside the device's
limits, unique group ids, known cap grids, repeats naming real runs, keys that must fit
together: one SLA weight per tier, a sample period that leaves samples in the run). Every problem is a
``ConfigError`` whose message names the offending key, e.g. ``groups[3].caps``.
``expand_runs`` turns a validated config into the sweep table: one row per
(group, cap, repeat).

Unknown keys are errors at every level of the schema (a ``sumary:`` is never silently
ignored). What a ``backend: cuda`` campaign's runs will need (model weights, data, the cap
command, the memory plan) is checked by the runs (``wattflex.runs.campaign_checks``, which the
workflow calls after ``prepare``): ``snakemake -n`` on the login node names a missing
``cuda.model_path`` instead of every run failing on its node.

How Snakemake builds ``config`` (Snakemake 9): the Snakefile's ``configfile:
"config/config.yaml"`` (relative to the working directory, ``-d``) is loaded first, then
every ``--configfile`` is merged onto it, mapping by mapping (a list such as ``groups:``
replaces the default's; a mapping such as ``allocation:`` is merged key by key, so a key
left out of yours keeps the default's value), then ``--config KEY=VALUE`` (the SLURM
profile's ``slurm_*`` keys). So a section you leave out of your file is not absent: it is
the default campaign's. ``defaulted_sections`` names those top-level sections and
``rules/common/setup.smk`` logs them in one line. ``snakemake --replace-workflow-config
--configfile my.yaml`` uses your files alone, as does a working directory without
config/config.yaml; sections then missing take the schema's defaults (filled by prepare).
"""

from __future__ import annotations

import copy
import math
from pathlib import Path
from typing import Any

import jsonschema
import yaml

from wattflex.errors import ConfigError
from wattflex.gpus import DEFAULT_GPU, GPUS, GPUS_PER_NODE, gpu_spec
from wattflex.policies import names
from wattflex.run_ids import run_id

# the schema's reading lives below config, so the dataclasses of lower layers can take their defaults
from wattflex.schema import (  # noqa: F401
    REPO_ROOT,
    SCHEMA_PATH,
    DuplicateKeyError,
    group_default,
    read_schema,
    read_yaml,
    section_defaults,
)
from wattflex.vocabulary import cluster_of

# run.* keys that decide how runs are scheduled, not what they measure: kept out of run
# specs, so changing them never reruns a run.
SCHEDULING_KEYS = ("parallel_within_group", "retries")
# Keys prepare() adds to a validated config (not the user's; skipped when validating again).
INTERNAL_KEYS = ("_catalog", "_emulator_calibration", "_schema_defaulted")
# Top-level keys only generated campaigns read (an ingested one takes its runs from data).
GENERATE_ONLY_KEYS = (
    "backend",
    "sweep",
    "models_catalog",
    "seed",
    "run",
    "staircase",
    "cap_grids",
    "group_defaults",
    "groups",
    "repeats",
    "cuda",
    "emulator",
)


def _key_path(path) -> str:
    out = ""
    for p in path:
        out += f"[{p}]" if isinstance(p, int) else (f".{p}" if out else str(p))
    return out or "(top level)"


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def _unknown_keys(instance: dict[str, Any], schema: dict[str, Any]) -> str:
    """'unknown key 'sumary' (did you mean 'summary'?)': keys a mapping does not allow."""
    import difflib

    known = list(schema.get("properties", {}))
    parts = []
    for k in [k for k in instance if k not in known]:
        close = difflib.get_close_matches(str(k), known, n=1, cutoff=0.6)
        parts.append(f"{k!r}" + (f" (did you mean {close[0]!r}?)" if close else ""))
    return (
        f"unknown key{'s' if len(parts) > 1 else ''} {', '.join(parts)}; allowed here: "
        f"{', '.join(known) or 'none'}"
    )


def check_config_files(paths: list[str | Path]) -> None:
    """Read each config file as wattflex reads YAML (:func:`read_yaml`): Snakemake loads
    ``--configfile`` files itself, keeping the last of duplicate keys."""
    for path in paths:
        try:
            read_yaml(path)
        except yaml.YAMLError as exc:
            raise ConfigError(
                f"config error: {path} is not valid YAML: {' '.join(str(exc).split())}"
            ) from None


def _fill_properties(validator, properties, instance, schema):
    """The ``properties`` keyword that first sets each absent key that has a ``default:``
    (python-jsonschema FAQ, "Why doesn't my schema's default property set the default on my
    instance?"), then validates as usual, so a section defaulted to ``{}`` gets its keys' defaults
    too. A schema marked ``x-no-defaults: true`` (a group: it takes ``group_defaults``'s) is skipped."""
    if isinstance(instance, dict) and not schema.get("x-no-defaults"):
        for key, sub in properties.items():
            if isinstance(sub, dict) and "default" in sub:
                instance.setdefault(key, copy.deepcopy(sub["default"]))
    yield from _VALIDATE_PROPERTIES(validator, properties, instance, schema)


def _is_finite_number(checker, instance) -> bool:
    """JSON Schema's ``number``, less NaN and the infinities: YAML's ``.nan`` passes every
    ``minimum`` and ``maximum`` (each comparison with NaN is false), then fails at use."""
    return jsonschema.Draft202012Validator.TYPE_CHECKER.is_type(instance, "number") and (
        not isinstance(instance, float) or math.isfinite(instance)
    )


# The validator every schema of wattflex is checked with: numbers are finite.
FiniteValidator = jsonschema.validators.extend(
    jsonschema.Draft202012Validator,
    type_checker=jsonschema.Draft202012Validator.TYPE_CHECKER.redefine("number", _is_finite_number),
)
_VALIDATE_PROPERTIES = jsonschema.Draft202012Validator.VALIDATORS["properties"]
_DefaultFillingValidator = jsonschema.validators.extend(
    FiniteValidator, {"properties": _fill_properties}
)


def _read_schema(schema_path: str | Path) -> dict[str, Any]:
    """The schema at ``schema_path``; the shipped one is read once per process (read_schema),
    shared with the dataclasses that take their defaults from it."""
    return read_schema() if Path(schema_path) == SCHEMA_PATH else read_yaml(schema_path)


def fill_defaults(
    cfg: dict[str, Any], schema_path: str | Path = SCHEMA_PATH, schema: dict[str, Any] | None = None
) -> list[str]:
    """Set every key the schema gives a ``default:`` and ``cfg`` leaves out, in place, at every
    level (the schema is the one place defaults are stated; code reads ``cfg[key]``). Returns
    the top-level keys so filled. ``schema``: the schema already read (prepare reads it once)."""
    before = set(cfg)
    for _ in _DefaultFillingValidator(
        schema if schema is not None else _read_schema(schema_path)
    ).iter_errors(cfg):
        pass  # filling only: validate_schema reports the problems
    return [k for k in cfg if k not in before]


def validate_schema(
    cfg: dict[str, Any], schema_path: str | Path = SCHEMA_PATH, schema: dict[str, Any] | None = None
) -> None:
    """Check ``cfg`` (its internal ``_`` keys left out) against the JSON schema (``schema`` if given,
    else the file ``schema_path``), refusing NaN and infinity.

    Raises ConfigError naming the first problem by its key path (``config error at
    groups[0].caps: ...``) and how many more there are.
    """
    schema = schema if schema is not None else _read_schema(schema_path)
    validator = FiniteValidator(schema)
    cfg = {k: v for k, v in cfg.items() if k not in INTERNAL_KEYS}
    errors = sorted(
        validator.iter_errors(cfg),
        key=lambda e: (len(e.absolute_path), list(map(str, e.absolute_path))),
    )
    if errors:
        e = errors[0]
        msg = e.message
        if e.validator == "pattern":
            msg = f"{e.instance!r} has characters unsafe in paths or shells (allowed: letters, digits, . _ -)"
        elif e.validator == "type" and isinstance(e.instance, str) and _is_number(e.instance):
            msg += (
                f" ({e.instance} is text to YAML 1.1, which reads an exponent only after a dot and "
                f"with a sign: write {float(e.instance):.1e} or {float(e.instance):.0f})"
            )
        elif (
            e.validator == "type"
            and isinstance(e.instance, float)
            and not math.isfinite(e.instance)
        ):
            msg = (
                f"{e.instance} is not a finite number (YAML's .nan and .inf are refused here): "
                "give a number"
            )
        elif e.validator == "additionalProperties" and isinstance(e.instance, dict):
            msg = _unknown_keys(e.instance, e.schema)
        more = f" (and {len(errors) - 1} more problem(s))" if len(errors) > 1 else ""
        raise ConfigError(f"config error at {_key_path(e.absolute_path)}: {msg}{more}")


def load_catalog(path: str | Path) -> dict[str, dict[str, Any]]:
    """The ``models:`` mapping of the models catalogue YAML at ``path`` (model name -> its facts).

    Raises ConfigError when the file has no top-level ``models:`` mapping.
    """
    doc = read_yaml(path)
    if not isinstance(doc, dict) or "models" not in doc:
        raise ConfigError(f"models catalog {path}: expected a top-level 'models:' mapping")
    return doc["models"]


def resolve_path(cfg_value: str, base: Path = REPO_ROOT) -> Path:
    """``cfg_value`` as a path: itself when absolute, else under ``base`` (the repository root)."""
    p = Path(cfg_value)
    return p if p.is_absolute() else base / p


def groups(cfg: dict[str, Any]) -> list[dict[str, Any]]:
    """Groups with defaults applied, caps resolved and cluster derived."""
    out = []
    defaults = cfg["group_defaults"]  # the schema's group defaults filled in (fill_defaults)
    catalog = cfg.get("_catalog", {})
    for raw in cfg["groups"]:
        g = {**copy.deepcopy(defaults), **raw}
        if g.get("knob", group_default("knob")) == "clock":
            # a clock group sweeps its clocks at the part's default power limit (``caps``: that one limit)
            g["clocks"] = sorted(float(c) for c in g.get("clocks", []))
            g["caps"] = (
                [float(GPUS[g.get("gpu", DEFAULT_GPU)].default_limit_w)]
                if g.get("gpu", DEFAULT_GPU) in GPUS
                else []
            )
        elif "caps" not in g:
            g["caps"] = list(cfg.get("cap_grids", {}).get(g.get("cap_grid", ""), []))
        g["caps"] = sorted(float(c) for c in g["caps"])
        g.pop("cap_grid", None)
        arch = catalog.get(g["model"], {}).get("architecture", "dense")
        g.setdefault("cluster", cluster_of(arch, g["task"]))
        g["architecture"] = arch
        out.append(g)
    return out


# Bounds of a run's timeline. A week is far beyond any sweep run (the paper's are 30 min) yet
# within SLURM limits; 10^6 samples per GPU keep an emulated run to seconds (duration_s =
# 10^12 spun for minutes).
MAX_DURATION_S = 7 * 24 * 3600
MAX_SAMPLES_PER_RUN = 1_000_000
# A run's sample period is the median gap between its samples (wattflex.telemetry): two at least.
MIN_SAMPLES_PER_RUN = 2


def check_expert_parallel(g: dict[str, Any], facts: dict[str, Any], where: str) -> None:
    """EP (expert parallelism) splits the ranks into groups of ``ep`` and each model's experts
    across a group: ``ep`` must divide the GPUs and the model's experts."""
    ep = int(g.get("ep", group_default("ep")))
    if ep == 1:
        return
    if facts.get("architecture") != "moe":
        raise ConfigError(
            f"config error at {where}.ep: ep {ep} needs a mixture-of-experts model; "
            f"{g['model']} is {facts.get('architecture', 'dense')}: use ep: 1"
        )
    if ep > g["gpus"] or g["gpus"] % ep:
        raise ConfigError(
            f"config error at {where}.ep: expert-parallel degree {ep} does not divide gpus "
            f"{g['gpus']}: use a divisor of {g['gpus']}"
        )
    experts = facts.get("experts")
    if experts and int(experts) % ep:
        raise ConfigError(
            f"config error at {where}.ep: expert-parallel degree {ep} does not divide the "
            f"{experts} experts of {g['model']}: use a divisor of {experts}"
        )


def check_run_timeline(run: dict[str, Any]) -> None:
    """run.*: the evaluation and checkpoint inside the run, the run and its samples bounded."""
    duration = float(run["duration_s"])
    if duration > MAX_DURATION_S:
        raise ConfigError(
            f"config error at run.duration_s: {duration:g} s is longer than a week "
            f"({MAX_DURATION_S} s); the paper's runs are 1800 s"
        )
    for key in ("eval_at_s", "checkpoint_at_s"):
        if run.get(key) is not None and float(run[key]) >= duration:
            raise ConfigError(
                f"config error at run.{key}: {float(run[key]):g} s is not before the run ends "
                f"(run.duration_s {duration:g} s): move it earlier, or null to skip it"
            )
    if float(run["sample_period_s"]) > duration / MIN_SAMPLES_PER_RUN:
        raise ConfigError(
            f"config error at run.sample_period_s: {float(run['sample_period_s']):g} s leaves fewer "
            f"than {MIN_SAMPLES_PER_RUN} samples in a run of {duration:g} s (run.duration_s): "
            f"use at most {duration / MIN_SAMPLES_PER_RUN:g} s"
        )
    samples = duration / float(run["sample_period_s"])
    if samples > MAX_SAMPLES_PER_RUN:
        raise ConfigError(
            f"config error at run.sample_period_s: {float(run['sample_period_s']):g} s gives "
            f"{samples:.3g} samples per GPU over {duration:g} s (at most {MAX_SAMPLES_PER_RUN:.0e}): "
            f"sample less often"
        )


def check_allocation(allocation: dict[str, Any]) -> None:
    """allocation.*: what the study draws from and reports must fit together (a schema states
    each key alone): one weight per SLA tier, not all zero; the headline cut among the cuts."""
    sla = allocation["sla"]
    tiers, weights = sla["tiers"], sla["tier_weights"]
    if len(weights) != len(tiers):
        raise ConfigError(
            f"config error at allocation.sla.tier_weights: {len(weights)} weights for "
            f"{len(tiers)} tiers (allocation.sla.tiers): give one weight per tier"
        )
    if not sum(float(w) for w in weights) > 0:
        raise ConfigError(
            "config error at allocation.sla.tier_weights: all weights are 0; a job draws its "
            "tier with these weights: give at least one a positive weight"
        )
    head = allocation["headline"]
    cuts = [float(c) for c in allocation["cuts"]]
    if head["mix"] in allocation["mixes"] and not any(
        abs(float(head["cut"]) - c) < 1e-9 for c in cuts
    ):
        raise ConfigError(
            f"config error at allocation.headline.cut: {float(head['cut']):g} is not one of "
            f"allocation.cuts ({', '.join(f'{c:g}' for c in cuts)}): the headline is read "
            "from a simulated cut"
        )


def _check_known(values: list[Any], known: Any, where: str, what: str) -> None:
    for i, v in enumerate(values):
        if v not in known:
            raise ConfigError(
                f"config error at {where}[{i}]: unknown {what} {v!r}; known: "
                f"{', '.join(map(str, known))}"
            )


def check_names(cfg: dict[str, Any]) -> None:
    """Names the config gives, against the registries that define them (the schema states no
    copy of them): policies (wattflex.policies), the GPU of group_defaults
    (wattflex.gpus; each group's is checked in check_semantics) and DCGM fields (wattflex.metrics)."""
    from wattflex import metrics

    _check_known(
        cfg["allocation"].get("policies", []),
        names(allocation=True),
        "allocation.policies",
        "policy",
    )
    _check_known(
        cfg["control"].get("policies", []),
        names(control=True),
        "control.policies",
        "closed-loop policy",
    )
    try:
        gpu_spec(cfg["group_defaults"]["gpu"])
    except KeyError as exc:
        raise ConfigError(f"config error at group_defaults.gpu: {exc.args[0]}") from None
    fields = [m.dcgm_field for m in metrics.METRICS if m.dcgm_profiling]
    _check_known(
        (cfg["cuda"].get("dcgm") or {}).get("fields", []),
        fields,
        "cuda.dcgm.fields",
        "DCGM profiling field",
    )


def check_node_layout(g: dict[str, Any], per_node: int, where: str) -> None:
    """A group of more GPUs than a node holds must fill whole nodes: SLURM gives each node the
    same count (``--gres=gpu:<per node>``) and each node's torchrun one rank per GPU, so 12 GPUs
    on 8-GPU nodes would ask for a split no node layout has."""
    n = int(g["gpus"])
    if n > per_node and n % per_node:
        raise ConfigError(
            f"config error at {where}.gpus: group {g['id']} asks for {n} GPUs, not a whole "
            f"number of {per_node}-GPU nodes (slurm_gpus_per_node); counts that fit: 1-{per_node} "
            f"on one node, or {', '.join(str(per_node * k) for k in (2, 3, 4))}, ... on whole nodes "
            f"(here {n // per_node * per_node} or {(n // per_node + 1) * per_node})"
        )


def check_semantics(cfg: dict[str, Any]) -> None:
    """Check what the schema cannot: the run timeline, node layouts of cuda groups, unique group ids,
    known models, cap grids inside each GPU's power-limit range, clock groups' settings.

    Raises ConfigError naming the first bad key (``config error at groups[2].caps: ...``).
    """
    catalog = cfg["_catalog"]
    check_run_timeline(cfg["run"])
    per_node = int(cfg.get("slurm_gpus_per_node") or GPUS_PER_NODE)
    seen: dict[str, int] = {}
    for i, (raw, g) in enumerate(zip(cfg["groups"], groups(cfg))):
        where = f"groups[{i}]"
        if cfg["backend"] == "cuda":  # measured runs are real jobs on real nodes
            check_node_layout(g, per_node, where)
        if g["id"] in seen:
            raise ConfigError(
                f"config error at {where}.id: duplicate group id {g['id']!r} (also groups[{seen[g['id']]}])"
            )
        seen[g["id"]] = i
        if g["model"] not in catalog:
            raise ConfigError(
                f"config error at {where}.model: unknown model {g['model']!r}; "
                f"known: {', '.join(sorted(catalog))}"
            )
        if g.get("knob", group_default("knob")) == "clock":
            check_clock_group(cfg, raw, g, where)
            check_expert_parallel(g, catalog[g["model"]], where)
            continue
        if "clocks" in raw:
            raise ConfigError(
                f"config error at {where}.clocks: clocks are for knob: clock groups (this one sweeps caps)"
            )
        if "cap_grid" in raw and raw["cap_grid"] not in cfg.get("cap_grids", {}):
            raise ConfigError(
                f"config error at {where}.cap_grid: unknown cap grid {raw['cap_grid']!r}"
            )
        if "cap_grid" in raw and "caps" in raw:
            raise ConfigError(f"config error at {where}: both caps and cap_grid given; keep one")
        if "caps" not in raw and raw.get(
            "cap_grid", cfg.get("group_defaults", {}).get("cap_grid")
        ) not in cfg.get("cap_grids", {}):
            raise ConfigError(
                f"config error at {where}.cap_grid: unknown cap grid "
                f"{raw.get('cap_grid', cfg.get('group_defaults', {}).get('cap_grid'))!r}"
            )
        if not g["caps"]:
            raise ConfigError(f"config error at {where}.caps: empty cap grid")
        spec = _group_gpu(g, where)
        check_setpoints(
            g["caps"],
            (spec.min_limit_w, spec.max_limit_w),
            f"{where}.caps",
            "cap",
            "W",
            f"{spec.name}'s power-limit range",
        )
        check_expert_parallel(g, catalog[g["model"]], where)
    by_id = {g["id"]: g for g in groups(cfg)}
    for i, r in enumerate(cfg["repeats"]):
        if r["group"] not in by_id:
            raise ConfigError(f"config error at repeats[{i}].group: unknown group {r['group']!r}")
        if by_id[r["group"]].get("knob", group_default("knob")) == "clock":
            raise ConfigError(
                f"config error at repeats[{i}].group: {r['group']} is a knob: clock group; repeats "
                f"are for cap groups"
            )
        if float(r["cap_w"]) not in by_id[r["group"]]["caps"]:
            raise ConfigError(
                f"config error at repeats[{i}].cap_w: {r['cap_w']} W is not in the caps of {r['group']}"
            )
    for g in by_id.values():
        if g["matches"] and g["matches"] not in by_id:
            raise ConfigError(
                f"config error at group {g['id']}.matches: unknown group {g['matches']!r}"
            )


def _group_gpu(g: dict[str, Any], where: str) -> Any:
    try:
        return gpu_spec(g["gpu"])
    except KeyError as exc:
        raise ConfigError(f"config error at {where}.gpu: {exc.args[0]}") from None


def check_setpoints(
    values: list[float],
    bounds: tuple[float, float],
    where: str,
    what: str,
    unit: str,
    range_name: str,
) -> None:
    """A group's caps (W) or clocks (MHz): each within ``bounds``, none twice."""
    lo, hi = bounds
    for c in values:
        if not lo <= c <= hi:
            raise ConfigError(
                f"config error at {where}: {what} {c:g} {unit} is outside the {range_name} "
                f"{lo:g}-{hi:g} {unit}"
            )
    if len(set(values)) != len(values):
        raise ConfigError(f"config error at {where}: duplicate {what}s {values}")


def check_clock_group(
    cfg: dict[str, Any], raw: dict[str, Any], g: dict[str, Any], where: str
) -> None:
    """A ``knob: clock`` group: clocks given, distinct, within its GPU's SM clock range
    (``wattflex.gpus``); no caps; the separate sweep only (staircase and adaptive step caps)."""
    if "caps" in raw or "cap_grid" in raw:
        raise ConfigError(
            f"config error at {where}: knob: clock sweeps clocks, not caps; drop caps/cap_grid"
        )
    if not g["clocks"]:
        raise ConfigError(f"config error at {where}.clocks: a knob: clock group needs clocks (MHz)")
    spec = _group_gpu(g, where)
    check_setpoints(
        g["clocks"],
        (spec.sm_clock_min_mhz, spec.sm_clock_max_mhz),
        f"{where}.clocks",
        "clock",
        "MHz",
        f"{spec.name}'s SM clock range",
    )
    if cfg.get("sweep", section_defaults()["sweep"]) != "separate":
        raise ConfigError(
            f"config error at {where}.knob: knob: clock needs sweep: separate (sweep: {cfg['sweep']} "
            f"steps caps)"
        )


def defaulted_sections(
    merged: dict[str, Any], user_files: list[str | Path], overrides: dict[str, Any] | None = None
) -> list[str]:
    """Top-level keys of ``merged`` that none of ``user_files`` (the ``--configfile`` files)
    nor ``overrides`` (``--config``) set: they came from the workflow's default config.
    An ingested campaign (``source: ingest``) does not list the keys it never reads."""
    given: set[str] = set(overrides or {})
    if merged.get("source") == "ingest":
        given |= set(GENERATE_ONLY_KEYS)
    for f in user_files:
        try:
            doc = read_yaml(f)
        except (OSError, yaml.YAMLError):
            continue
        if isinstance(doc, dict):
            given |= set(doc)
    given |= set(
        merged.get("_schema_defaulted", [])
    )  # the schema's defaults, not the default config's
    return [k for k in merged if k not in given and k not in INTERNAL_KEYS]


def prepare(
    cfg: dict[str, Any],
    base: Path = REPO_ROOT,
    schema_path: str | Path = SCHEMA_PATH,
) -> dict[str, Any]:
    """Validate a loaded config in place and attach the model catalog (``_catalog``). What a
    ``backend: cuda`` campaign's runs need (weights, data, the cap command, the memory plan) is
    the runs' own check: ``wattflex.runs.campaign_checks.check_inputs``."""
    if not isinstance(cfg, dict):
        raise ConfigError("config error at (top level): expected a mapping")
    schema = _read_schema(schema_path)  # once: filling and validating read the same schema
    filled = fill_defaults(cfg, schema=schema)
    if isinstance(cfg.get("group_defaults"), dict):
        cfg["group_defaults"].setdefault(
            "gpu", DEFAULT_GPU
        )  # the GPU catalogue's default (wattflex.gpus)
    cfg["_schema_defaulted"] = sorted(set(cfg.get("_schema_defaulted", [])) | set(filled))
    validate_schema(cfg, schema=schema)
    check_names(cfg)
    check_allocation(cfg["allocation"])
    if cfg["source"] == "generate":
        cat_path = resolve_path(cfg["models_catalog"], base)
        if not cat_path.is_file():
            raise ConfigError(f"config error at models_catalog: file not found: {cat_path}")
        cfg["_catalog"] = load_catalog(cat_path)
        cal = cfg["emulator"]["calibration"]
        if cal:
            cfg["_emulator_calibration"] = load_emulator_calibration(resolve_path(cal, base))
        check_semantics(cfg)
    return cfg


def load_emulator_calibration(path: Path) -> dict[str, Any]:
    """The JSON of a calibration file (``wattflex calibrate``), checked for what the emulator
    reads (``wattflex.runs.emulator.physics.calibrated_physics``)."""
    import json

    where = f"config error at emulator.calibration: {path}"
    if not path.is_file():
        raise ConfigError(
            f"{where} not found; make one with `wattflex calibrate` (relative paths: "
            "against the repository)"
        )
    try:
        data = json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise ConfigError(f"{where} is not JSON ({exc})") from None
    curve = data.get("curve") if isinstance(data, dict) else None
    if (
        not isinstance(curve, dict)
        or data.get("kind") != "wattflex-emulator-calibration"
        or "anchor_clock_mhz" not in data
        or not {"sm_dyn_w", "v_min", "v_exp", "calib_tensor_util"} <= set(curve)
    ):
        raise ConfigError(
            f"{where} is not a wattflex calibration file; make one with `wattflex calibrate`"
        )
    return data


def merge_config(base_cfg: dict[str, Any], cfg: dict[str, Any]) -> dict[str, Any]:
    """``cfg`` merged onto ``base_cfg`` as Snakemake merges a ``--configfile`` onto the
    Snakefile's ``configfile:`` (``snakemake.utils.update_config``): mappings key by key,
    anything else replaced."""
    out = dict(base_cfg)
    for key, value in cfg.items():
        out[key] = (
            merge_config(out[key], value)
            if isinstance(value, dict) and isinstance(out.get(key), dict)
            else value
        )
    return out


def load_config(
    path: str | Path, base: Path = REPO_ROOT, onto_default: bool = False
) -> dict[str, Any]:
    """The config in ``path``, validated; ``onto_default``: merged onto ``config/config.yaml``
    first, which is what ``snakemake --configfile path`` runs (``wattflex doctor`` checks that)."""
    try:
        cfg = read_yaml(path)
        if (
            onto_default
            and isinstance(cfg, dict)
            and Path(path).resolve() != (base / "config" / "config.yaml").resolve()
        ):
            cfg = merge_config(read_yaml(base / "config" / "config.yaml"), cfg)
    except yaml.YAMLError as exc:
        raise ConfigError(
            f"config error: {path} is not valid YAML: {' '.join(str(exc).split())}"
        ) from None
    return prepare(cfg, base)


def expand_runs(cfg: dict[str, Any]) -> list[dict[str, Any]]:
    """The sweep table: one dict per (group, cap, repeat)."""
    n_rep = {(r["group"], float(r["cap_w"])): int(r["n"]) for r in cfg["repeats"]}
    rows = []
    for g in groups(cfg):
        if (
            g.get("knob", group_default("knob")) == "clock"
        ):  # at the default limit, one run per locked clock
            rows += [
                {
                    "group": g["id"],
                    "cap_w": g["caps"][0],
                    "clock_mhz": c,
                    "repeat": 0,
                    "run_id": run_id(c, 0, "clock"),
                }
                for c in g["clocks"]
            ]
            continue
        for cap in g["caps"]:
            for k in range(n_rep.get((g["id"], cap), 1)):
                rows.append({"group": g["id"], "cap_w": cap, "repeat": k, "run_id": run_id(cap, k)})
    return rows


def run_spec(cfg: dict[str, Any], group_id: str, run: str) -> dict[str, Any]:
    """Everything one run needs (and nothing else): the run rule's params."""
    # Resolve the run's own group only: resolving every group costs O(groups) per run, which
    # is O(runs x groups) for the run rule's params at every `snakemake` start.
    own = {**cfg, "groups": [next(g for g in cfg["groups"] if g["id"] == group_id)]}
    g = groups(own)[0]
    row = next(r for r in expand_runs(own) if r["run_id"] == run)
    spec = {
        "campaign": cfg["campaign"],
        "backend": cfg["backend"],
        "run_id": run,
        "cap_w": row["cap_w"],
        "repeat": row["repeat"],
        "seed": int(cfg["seed"]),
        # knob: cap (the default) is left out: a cap run's spec is the same with or without it
        "group": {
            k: v for k, v in g.items() if k not in ("caps", "clocks") and (k, v) != ("knob", "cap")
        },
        "model_facts": cfg["_catalog"][g["model"]],
        "run": {k: v for k, v in cfg["run"].items() if k not in SCHEDULING_KEYS},
    }
    if "clock_mhz" in row:
        spec["clock_mhz"] = row["clock_mhz"]
    if cfg["backend"] == "cuda":
        spec["cuda"] = dict(cfg["cuda"])
    elif cfg.get(
        "_emulator_calibration"
    ):  # the emulator's calibrated power level (wattflex calibrate)
        spec["emulator"] = {"calibration": cfg["_emulator_calibration"]}
    return spec
