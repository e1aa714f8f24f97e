"""Peak RSS per rank during the training steps of a CPU FSDP2 run, beside the plan's figure
(wattflex.runs.plan.cpu_rank_bytes), with glibc's malloc as the harness sets it and as glibc
leaves it (the mechanism: wattflex.runs.training.hostmem).

Usage: python benchmarks/step_memory.py [--out MD] [--factors] [--steps N]
       python benchmarks/step_memory.py --families [--out MD] [--steps N]

Runs the harness (``python -m wattflex.runs.training`` under torchrun, 4 gloo ranks, fp32,
FSDP2) on ``STEP_MODEL``, a random-init 173M-parameter Llama shaped like Llama-3.1-70B's
layers (8 query heads per kv head, MLP 3.5x the hidden size) so that Llama's measured
activation factor applies, for LoRA and pretraining, each with the harness's fixed mmap
threshold and with glibc's rising one (``WATTFLEX_GLIBC_DYNAMIC_MMAP=1``). The figures are
the harness's own, from run.json's ``peak_rss_bytes_per_rank`` (VmHWM reset after the build).
``--factors`` also measures the fp32/bf16 ratio of the bytes a decoder layer saves for
backward (benchmarks/activation_bytes.py's hooks), the plan's FP32_ACTIVATION_SCALE.

``--families``: every catalogue family (the first config/models.yaml model of each hf_model_type)
with each task config/config.yaml's groups run it with, at 1/``FAMILY_DIVISOR`` of its widths and
vocabulary and ``FAMILY_LAYERS`` layers (head and expert counts kept), random init, in one 4-rank
torchrun job (benchmarks/step_memory_probe.py --cases: the harness's build and steps, one case after
another); per case the plan's figure for the step beside the measured peak RSS per rank, whole and
as the step's increment over the RSS after the build.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "workflow_scripts"))
sys.path.insert(0, str(REPO))  # tests/tiny_training.py: the model and run the test checks too

from tests.tiny_training import (  # noqa: E402
    STEP_BATCH,
    STEP_LORA_RANK,
    STEP_MODEL,
    STEP_SEQ_LEN,
    step_cfg,
)
from wattflex.runs import plan  # noqa: E402
from wattflex.runs.attention import catalog_attn_implementation  # noqa: E402
from wattflex.runs.training.hostmem import KEEP_DYNAMIC_ENV  # noqa: E402
from wattflex.runs.training.train_config import TrainConfig  # noqa: E402

RANKS = 4
SEQ_LEN, BATCH, LORA_RANK = STEP_SEQ_LEN, STEP_BATCH, STEP_LORA_RANK
GB = 1e9


def config(task: str, outdir: Path, steps: int = 3) -> TrainConfig:
    """The harness's run of ``STEP_MODEL`` (tests/tiny_training.py, shared with the test)."""
    return step_cfg(task, outdir, steps)


def torchrun_harness(
    cfg: TrainConfig, ranks: int = RANKS, env: dict | None = None
) -> subprocess.CompletedProcess:
    """The harness on ``cfg`` in ``ranks`` gloo ranks (its config in cfg.json in ``cfg.outdir``)."""
    Path(cfg.outdir).mkdir(parents=True, exist_ok=True)
    path = Path(cfg.outdir) / "cfg.json"
    cfg.to_json(path)
    env = {
        **os.environ,
        "PYTHONPATH": str(REPO / "workflow_scripts"),
        "OMP_NUM_THREADS": "1",
        **(env or {}),
    }
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            f"--nproc-per-node={ranks}",
            "-m",
            "wattflex.runs.training",
            "--config",
            str(path),
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=1500,
    )


def planned(task: str, params_total: int, ranks: int = RANKS) -> dict[str, float]:
    """The plan's bytes per rank for ``STEP_MODEL`` with the harness's parameter count."""
    facts = {**STEP_MODEL, "total_params_b": params_total / 1e9}
    cfg = config(task, Path("."))
    return plan.cpu_rank_bytes(
        facts, task, ranks, SEQ_LEN, BATCH, LORA_RANK, cfg.grad_checkpointing
    )


def measure(task: str, dynamic: bool, workdir: Path, steps: int = 3) -> dict:
    """One harness run: its run.json training facts and the plan beside them."""
    cfg = config(task, workdir / f"{task}-{'dynamic' if dynamic else 'fixed'}", steps)
    r = torchrun_harness(cfg, env={KEEP_DYNAMIC_ENV: "1"} if dynamic else None)
    if r.returncode != 0:
        raise RuntimeError(f"{task} run failed:\n{r.stderr[-3000:]}")
    facts = json.loads((Path(cfg.outdir) / ".training.json").read_text())["training"]
    return {
        "task": task,
        "dynamic": dynamic,
        "facts": facts,
        "plan": planned(task, facts["params_total"]),
    }


def torchrun_probe(
    args: list[str], env: dict | None = None, ranks: int = RANKS
) -> subprocess.CompletedProcess:
    """benchmarks/step_memory_probe.py with ``args`` in ``ranks`` gloo ranks."""
    env = {
        **os.environ,
        "PYTHONPATH": str(REPO / "workflow_scripts"),
        "OMP_NUM_THREADS": "1",
        **(env or {}),
    }
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            f"--nproc-per-node={ranks}",
            str(REPO / "benchmarks" / "step_memory_probe.py"),
            *args,
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=1500,
    )


def written(cfg: TrainConfig) -> Path:
    """``cfg`` as cfg.json in its outdir."""
    Path(cfg.outdir).mkdir(parents=True, exist_ok=True)
    cfg.to_json(Path(cfg.outdir) / "cfg.json")
    return Path(cfg.outdir) / "cfg.json"


def probe(task: str, dynamic: bool, workdir: Path, steps: int = 3) -> dict:
    """Rank 0's phases through the steps (benchmarks/step_memory_probe.py) on ``STEP_MODEL``."""
    cfg = config(task, workdir / f"probe-{task}-{'dynamic' if dynamic else 'fixed'}", steps)
    r = torchrun_probe([str(written(cfg))], {KEEP_DYNAMIC_ENV: "1"} if dynamic else None)
    if r.returncode != 0:
        raise RuntimeError(f"probe {task} failed:\n{r.stderr[-3000:]}")
    return {
        "task": task,
        "dynamic": dynamic,
        **json.loads((Path(cfg.outdir) / "probe0.json").read_text()),
    }


def probe_table(rows: list[dict]) -> str:
    lines = [
        "| task | glibc mmap threshold | phase (end of) | RSS GB | peak in phase GB | allocated GB | "
        "arenas GB | free in arenas GB | units gathered |",
        "|" + " --- |" * 9,
    ]
    for row in rows:
        for snap in row["snapshots"]:
            lines.append(
                f"| {row['task']} | {'rising' if row['dynamic'] else 'fixed'} | {snap['tag']} "
                f"| {snap['rss'] / GB:.3f} | {snap['peak_since_last'] / GB:.3f} | {snap['allocated'] / GB:.3f} "
                f"| {snap['arenas'] / GB:.3f} | {snap['arenas_free'] / GB:.3f} | {snap.get('gathered_units', '-')} |"
            )
    return "\n".join(lines)


def activation_bytes_bench():
    """tests/layer_saved_bytes.py (the layer builds, hooks and family list of
    benchmarks/activation_bytes.py's measurement)."""
    from tests import layer_saved_bytes

    return layer_saved_bytes


def fp32_factors() -> list[tuple[str, str, int, float, float]]:
    """(family, task, hidden, bf16 B/(s*b*h), fp32 B/(s*b*h)): one layer at 1/8 of the catalogue's
    widths, sequence 128, activation_bytes' saved-tensor hooks."""
    import torch

    ab = activation_bytes_bench()
    torch.set_num_threads(1)
    out = []
    for family in ("llama", "qwen3"):
        facts = ab.CATALOG[ab.families()[family]]
        k, s = 8, 128
        h = int(facts["hidden"]) // k
        for task in ("pt", "lora"):
            per = []
            for fp32 in (False, True):
                model = ab.one_layer_model(facts, k, task, "sdpa", s)
                if fp32:
                    model.float()
                per.append(ab.saved_bytes(model, s)[0] / (s * h))
            out.append((family, task, h, *per))
    return out


def table(rows: list[dict]) -> str:
    lines = [
        "| task | glibc mmap threshold | rank | before build GB | after build GB | steps' peak GB | plan GB | "
        "measured / plan |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for row in rows:
        total = row["plan"]["total"]
        for p in row["facts"]["peak_rss_bytes_per_rank"]:
            lines.append(
                f"| {row['task']} | {'rising (glibc default)' if row['dynamic'] else 'fixed 128 KiB (harness)'} "
                f"| {p['rank']} | {p['before_build'] / GB:.3f} | {p['after_build'] / GB:.3f} "
                f"| {p['steps'] / GB:.3f} | {total / GB:.3f} | {p['steps'] / total:.2f} |"
            )
    return "\n".join(lines)


def plan_parts(rows: list[dict]) -> str:
    keys = ("framework", "states", "gathered", "activations", "logits", "total")
    lines = ["| task | params | " + " | ".join(keys) + " |", "|" + " --- |" * (len(keys) + 2)]
    for row in rows:
        if not row["dynamic"]:
            lines.append(
                f"| {row['task']} | {row['facts']['params_total'] / 1e6:.1f}M | "
                + " | ".join(f"{row['plan'][k] / GB:.3f}" for k in keys)
                + " |"
            )
    return "\n".join(lines)


# ---- every catalogue family -------------------------------------------------------------
CATALOG = yaml.safe_load((REPO / "config" / "models.yaml").read_text())["models"]
CAMPAIGN = REPO / "config" / "config.yaml"
# Each family at 1/8 of its catalogue widths and vocabulary (hidden 256-720), 4 layers: 21-66M
# parameters, a step's increment of 0.1-0.4 GB per rank, all 12 cases in ~2 min on 2 cores.
FAMILY_DIVISOR = 8
FAMILY_LAYERS = 4
SCALED_KEYS = (
    "hidden",
    "head_dim",
    "global_head_dim",
    "intermediate",
    "dense_intermediate",
    "dense_layer_intermediate",
    "vocab",
)


def family_cases() -> list[tuple[str, str]]:
    """(catalogue model, task): the first model of each hf_model_type, with each task the
    campaign's groups (config/config.yaml) run it with."""
    groups = yaml.safe_load(CAMPAIGN.read_text())["groups"]
    first = activation_bytes_bench().families()
    return [
        (name, task)
        for name in first.values()
        for task in ("lora", "pt")
        if any(g["model"] == name and g["task"] == task for g in groups)
    ]


def family_facts(name: str, divisor: int = FAMILY_DIVISOR, layers: int = FAMILY_LAYERS) -> dict:
    """Catalogue ``name`` at 1/``divisor`` of its widths and ``layers`` layers, with its parameter
    counts (all, and the routed experts') as the harness builds it (on the meta device)."""
    import torch
    from transformers import AutoModelForCausalLM

    from wattflex.runs.training.models import hf_config

    facts = {
        **CATALOG[name],
        "layers": layers,
        **{k: int(CATALOG[name][k]) // divisor for k in SCALED_KEYS if k in CATALOG[name]},
    }
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(hf_config(facts, seq_len=SEQ_LEN))
    total = sum(p.numel() for p in model.parameters())  # a tied weight once
    expert = activation_bytes_bench().routed_expert_params(model)
    return {**facts, "total_params_b": total / 1e9, "expert_params_b": expert / 1e9}


def family_config(task: str, facts: dict, outdir: Path, steps: int) -> TrainConfig:
    """``config``'s run of ``facts`` with the catalogue's attention for ``task``."""
    return dataclasses.replace(
        config(task, outdir, steps),
        model_facts=facts,
        attn_implementation=catalog_attn_implementation(facts, task),
    )


def family_plan(facts: dict, task: str, attention: str, ranks: int = RANKS) -> dict[str, float]:
    """The plan's bytes per rank (``plan.cpu_rank_bytes``) and ``step``: its increment over the
    build, i.e. without the process and the fp32 weights (base and adapters) the build holds."""
    cfg = config(task, Path("."))  # the harness's checkpointing and loss chunk
    parts = plan.cpu_rank_bytes(
        facts,
        task,
        ranks,
        SEQ_LEN,
        BATCH,
        LORA_RANK,
        cfg.grad_checkpointing,
        attention,
        loss_chunk_tokens=cfg.loss_chunk_tokens,
    )
    sh = plan.shape(facts, LORA_RANK if task == "lora" else 0)
    built = (sh.params + sh.adapters) * 4 / ranks
    return {**parts, "built": built, "step": parts["total"] - parts["framework"] - built}


def measure_families(
    workdir: Path,
    steps: int = 2,
    which: list[tuple[str, str]] | None = None,
    ranks: int = RANKS,
) -> list[dict]:
    """Every ``family_cases`` case (or ``which``'s, in its order) in one torchrun job: per case its
    facts, the ranks' figures (benchmarks/step_memory_probe.py --cases) and the plan for the
    attention the harness ran."""
    cases = [
        {"model": name, "task": task, "facts": family_facts(name)}
        for name, task in (which or family_cases())
    ]
    for i, c in enumerate(cases):
        outdir = workdir / f"{i}-{c['model']}-{c['task']}"
        cfg = family_config(c["task"], c["facts"], outdir, steps)
        c["config"] = str(written(cfg))
    listing = workdir / "cases.json"
    listing.write_text(json.dumps([c["config"] for c in cases]))
    r = torchrun_probe(["--cases", str(listing)], ranks=ranks)
    if r.returncode != 0:
        raise RuntimeError(f"family cases failed:\n{r.stderr[-3000:]}")
    per_rank = [json.loads((workdir / f"cases{i}.json").read_text()) for i in range(ranks)]
    for i, case in enumerate(cases):
        case["ranks"] = [rank["cases"][i] for rank in per_rank]
        case["fixed"] = all(rank["mmap_threshold_fixed"] for rank in per_rank)
        case["plan"] = family_plan(
            case["facts"], case["task"], case["ranks"][0]["attn_implementation"], ranks
        )
    return cases


def family_table(cases: list[dict]) -> str:
    lines = [
        "| family | catalogue model | task | params | attention | after build GB | steps' peak GB "
        "| plan GB | peak / plan | step's increment GB | plan's increment GB | increment / plan |",
        "|" + " --- |" * 12,
    ]
    for c in cases:
        p, worst = c["plan"], max(c["ranks"], key=lambda r: r["steps"] - r["after_build"])
        inc = worst["steps"] - worst["after_build"]
        lines.append(
            f"| {c['facts']['hf_model_type']} | {c['model']} | {c['task']} "
            f"| {worst['params_total'] / 1e6:.1f}M | {worst['attn_implementation']} "
            f"| {worst['after_build'] / GB:.3f} | {worst['steps'] / GB:.3f} | {p['total'] / GB:.3f} "
            f"| {worst['steps'] / p['total']:.2f} | {inc / GB:.3f} | {p['step'] / GB:.3f} "
            f"| {inc / p['step']:.2f} |"
        )
    return "\n".join(lines)


def family_plan_parts(cases: list[dict]) -> str:
    keys = ("built", "states", "gathered", "activations", "logits", "optimizer_step", "step")
    lines = ["| family | task | " + " | ".join(keys) + " |", "|" + " --- |" * (len(keys) + 2)]
    for c in cases:
        lines.append(
            f"| {c['facts']['hf_model_type']} | {c['task']} | "
            + " | ".join(f"{c['plan'][k] / GB:.3f}" for k in keys)
            + " |"
        )
    return "\n".join(lines)


def main_families(out: Path | None, steps: int, which: list[str] | None = None) -> None:
    import time

    import torch
    import transformers

    t = time.time()
    with tempfile.TemporaryDirectory() as tmp:
        cases = measure_families(
            Path(tmp), steps, [tuple(c.split(":")) for c in which] if which else None
        )
    wall = time.time() - t
    flags = " --families" + (" --cases " + " ".join(which) if which else "")
    doc = [
        f"Measured {datetime.date.today()} (`python benchmarks/step_memory.py{flags}`), torch "
        f"{torch.__version__}, transformers {transformers.__version__}, {RANKS} gloo ranks on CPU, "
        f"fp32, FSDP2, seq {SEQ_LEN} x batch {BATCH}, LoRA rank {LORA_RANK}, {steps} steps, each "
        f"family at 1/{FAMILY_DIVISOR} of its widths and vocabulary with {FAMILY_LAYERS} layers; "
        f"one job, {wall:.0f} s, the cases in the table's order. Each row: the rank with the "
        "largest increment.",
        "",
        family_table(cases),
        "",
        "The plan's parts per rank (GB; step = total - process - built):",
        "",
        family_plan_parts(cases),
    ]
    text = "\n".join(doc)
    print(text)
    if out:
        out.write_text(text + "\n")


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument(
        "--out", type=Path, default=None, help="write the tables to this markdown file too"
    )
    ap.add_argument(
        "--factors", action="store_true", help="also measure the fp32/bf16 activation ratios"
    )
    ap.add_argument(
        "--probe",
        action="store_true",
        help="also rank 0's phases of a LoRA run (step_memory_probe.py)",
    )
    ap.add_argument(
        "--families",
        action="store_true",
        help="instead: every catalogue family and task in one job (family_cases)",
    )
    ap.add_argument(
        "--cases",
        nargs="*",
        default=None,
        help="with --families: these MODEL:TASK cases, in this order, in one job",
    )
    ap.add_argument("--steps", type=int, default=None, help="steps per run (3; --families: 2)")
    args = ap.parse_args(argv)
    import torch

    if args.families:
        return main_families(args.out, args.steps or 2, args.cases)
    args.steps = args.steps or 3

    with tempfile.TemporaryDirectory() as tmp:
        rows = [
            measure(task, dynamic, Path(tmp), args.steps)
            for task in ("lora", "pt")
            for dynamic in (False, True)
        ]
        probes = (
            [probe("lora", dynamic, Path(tmp), args.steps) for dynamic in (True, False)]
            if args.probe
            else []
        )
    flags = "".join(f" --{f}" for f in ("factors", "probe") if getattr(args, f))
    doc = [
        f"Measured {datetime.date.today()} (`python benchmarks/step_memory.py{flags}`), "
        f"torch {torch.__version__}, {RANKS} gloo ranks on CPU, fp32, FSDP2, seq {SEQ_LEN} x batch {BATCH}, "
        f"LoRA rank {LORA_RANK}, {args.steps} steps.",
        "",
        table(rows),
        "",
        "The plan's parts per rank (GB):",
        "",
        plan_parts(rows),
    ]
    if probes:
        doc += [
            "",
            "Rank 0 of the LoRA run, phase by phase (allocated: malloc's bytes in use, mallinfo2 "
            "uordblks + hblkhd; the peak: VmHWM, reset at each phase's start):",
            "",
            probe_table(probes),
        ]
    if args.factors:
        doc += [
            "",
            "fp32 over bf16 bytes a decoder layer saves for backward (B per s·b·h, one layer at 1/8 of the "
            "catalogue's widths, seq 128):",
            "",
            "| family | task | hidden | bf16 | fp32 | ratio |",
            "| --- | --- | --- | --- | --- | --- |",
        ]
        doc += [
            f"| {f} | {t} | {h} | {b:.1f} | {x:.1f} | {x / b:.3f} |"
            for f, t, h, b, x in fp32_factors()
        ]
    text = "\n".join(doc)
    print(text)
    if args.out:
        args.out.write_text(text + "\n")


if __name__ == "__main__":
    main()
