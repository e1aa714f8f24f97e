"""What a ``backend: cuda`` campaign's runs need, checked before any job is submitted: model
weights and data, the cap command, each group's own command, the memory plan. The runs' own rules
(``runs.devices.caps``, ``runs.command_run``, ``runs.plan``, the torchrun layout) on a config that
``wattflex.config.prepare`` validated; ``rules/common/setup.smk`` calls :func:`check_inputs`
after it (config is the core and imports no runs module)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from wattflex.architectures import ARCHITECTURES, MULTIMODAL_TEXT_PREFIX
from wattflex.config import ConfigError, groups
from wattflex.gpus import GPUS_PER_NODE
from wattflex.runs.command_run import check_command
from wattflex.runs.devices.caps import cap_command_problem
from wattflex.runs.plan import check_layouts, check_plan


def check_inputs(cfg: dict[str, Any], cwd: str | Path | None = None) -> None:
    """Every check of this module for a validated config (``wattflex.config.prepare``'s result):
    nothing for an emulated or ingested campaign; for ``backend: cuda``, :func:`check_cuda`
    (relative paths against ``cwd``) and the memory plan of every group (``runs.plan.check_plan``)."""
    if cfg.get("source") == "generate" and cfg.get("backend") == "cuda":
        check_node_layouts(cfg)
        check_cuda(cfg, cwd)
        check_plan(cfg, groups(cfg))


def check_node_layouts(cfg: dict[str, Any]) -> None:
    """Refuse (ConfigError) a ``backend: cuda`` harness group whose torchrun layout is not the
    nodes SLURM gives it (``slurm_gpus_per_node``, default ``GPUS_PER_NODE``): ``runs.plan.check_layouts``."""
    check_layouts(cfg, groups(cfg), int(cfg.get("slurm_gpus_per_node") or GPUS_PER_NODE))


CAP_COMMAND_EXAMPLE = "sudo /usr/local/bin/setcap {gpu} {watts}"


def _model_dir_facts(path: Path) -> dict[str, Any] | None:
    """config.json of a Hugging Face model directory (None if it is not one)."""
    try:
        return json.loads((path / "config.json").read_text())
    except (OSError, ValueError):
        return None


def check_cuda(cfg: dict[str, Any], cwd: str | Path | None = None) -> None:
    """What the runs of a ``backend: cuda`` campaign need that can be checked here, before any
    job is submitted (the rest, on the node: ``TrainConfig.validate``, ``wattflex doctor``):

    * weights: ``cuda.model_path``, a local model directory (runs are offline) whose
      config.json is the model of every group (``model_type``, layers, hidden size as in the
      catalog); or ``cuda.random_init: true`` / ``cuda.tiny: true`` (no weights, the
      family built from the catalog);
    * ``cuda.data_path``, if given, exists (omitted: synthetic tokens);
    * ``cap_control: command`` has a ``cap_command`` with ``{gpu}`` and ``{watts}``; its
      program is not looked up (it lives on the compute nodes). ``cap_control: nvml`` needs
      root on the compute node: nothing to check from the login node (``wattflex doctor``
      there says);
    * ``sweep: staircase | adaptive`` can step caps and read power (not ``observe``,
      sampler on); on one node or several (``wattflex.runs.sweep.real``).

    Relative paths are relative to ``cwd`` (Snakemake's working directory, where the runs
    start), default the current directory."""
    cuda = cfg["cuda"]
    base = Path(cwd) if cwd is not None else Path.cwd()
    where = "config error at cuda"

    def local(p: str) -> Path:
        q = Path(p).expanduser()
        return q if q.is_absolute() else base / q

    mode = cuda["cap_control"]
    if mode == "command":
        cmd = cuda.get("cap_command")
        if not cmd:
            raise ConfigError(
                f"{where}.cap_command: cap_control: command needs cap_command, "
                f"e.g. {CAP_COMMAND_EXAMPLE!r}"
            )
        problem = cap_command_problem(cmd)
        if problem:
            raise ConfigError(f"{where}.cap_command: {cmd!r} {problem}")
    if cfg["sweep"] != "separate":
        if mode == "observe" or not cuda["sampler"]:
            raise ConfigError(
                f"{where}.cap_control: sweep: {cfg['sweep']} steps the GPUs' caps and reads their "
                f"power: needs cap_control nvml or command (is {mode}) and sampler: true "
                f"(is {cuda['sampler']}); use sweep: separate otherwise"
            )

    catalog = cfg.get("_catalog", {})
    model_path = cuda.get("model_path")
    from_config = bool(cuda.get("tiny")) or (bool(cuda.get("random_init")) and model_path is None)
    gs = groups(cfg)
    check_commands([g for g in gs if g.get("command")])
    gs = [g for g in gs if not g.get("command")]  # a group's own command brings its own model
    if from_config:
        for g in gs:
            mtype = catalog.get(g["model"], {}).get("hf_model_type", "")
            if mtype not in ARCHITECTURES:
                raise ConfigError(
                    f"{where}: group {g['id']}: model {g['model']} (hf_model_type {mtype!r}) cannot "
                    f"be built without weights (tiny / random_init); supported: "
                    f"{', '.join(sorted(ARCHITECTURES))}; give cuda.model_path"
                )
    elif model_path is None and gs:
        models = sorted({g["model"] for g in gs})
        raise ConfigError(
            f"{where}.model_path: missing: no model weights for {', '.join(models)} (runs are "
            f"offline): set cuda.model_path to a local model directory, or cuda.random_init: true "
            f"(full-size, random weights) or cuda.tiny: true (tiny smoke model)"
        )
    if model_path is not None:
        d = local(model_path)
        facts = _model_dir_facts(d) if d.is_dir() else None
        if facts is None:
            raise ConfigError(
                f"{where}.model_path: {d}: not a model directory with a readable config.json "
                f"(download the weights beforehand; runs never reach the network)"
            )
        # One directory serves every group: it must be every group's model (tiny ignores it).
        for g in [] if cuda.get("tiny") else gs:
            want = catalog.get(g["model"], {})
            pairs = (
                ("model_type", "hf_model_type"),
                ("num_hidden_layers", "layers"),
                ("hidden_size", "hidden"),
            )
            # a multimodal checkpoint's text decoder is the catalogue's model (its text_config; the
            # harness trains that: runs.training.models.text_decoder_config)
            decoder = (
                (facts.get("text_config") or {})
                if facts.get("model_type") in MULTIMODAL_TEXT_PREFIX
                else {}
            )
            for key, cat_key in pairs:
                have = decoder.get(key, facts.get(key, (facts.get("text_config") or {}).get(key)))
                if cat_key in want and have is not None and have != want[cat_key]:
                    raise ConfigError(
                        f"{where}.model_path: {d} is not {g['model']} (group {g['id']}): its "
                        f"config.json has {key} {have!r}, the catalog {cat_key} {want[cat_key]!r}; "
                        f"one model_path serves every group: one campaign per model"
                    )
    data_path = cuda.get("data_path")
    if data_path is not None and not local(data_path).exists():
        raise ConfigError(
            f"{where}.data_path: {local(data_path)}: no such file or directory (pre-tokenised "
            f"parquet/arrow shards of token ids; omit for synthetic tokens)"
        )


def check_commands(command_groups: list[dict[str, Any]]) -> None:
    """Each ``group.command``: its launch template's placeholders and its throughput source
    (``wattflex.runs.command_run.check_command``). Its program is not looked up here: it lives
    on the compute nodes (``wattflex doctor --configfile`` there does)."""
    if not command_groups:
        return
    for g in command_groups:
        try:
            check_command(
                g["command"], f"config error at group {g['id']}: command", g, look_up=False
            )
        except ValueError as exc:
            raise ConfigError(str(exc)) from None
