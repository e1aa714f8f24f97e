"""The resource plan's GPU memory, measured on one GPU (wattflex.runs.plan; docs/resource-plan.md).

Usage: python benchmarks/plan_gpu_check.py [--model Llama-3.1-70B] [--layers 2] [--task pt]
           [--precision bf16-mixed] [--seq-len 2048] [--batch 2] [--no-grad-checkpointing]
           [--loss-chunk-tokens 8192] [--steps 3] [--device cuda|cpu] [--out DIR]

A catalogue model cut to ``--layers`` decoder layers (full width, full vocabulary: the layer,
embedding and loss terms of the plan are the full model's) is trained with random weights
through the real harness (``wattflex.runs.training.trainer.train``, one process: no FSDP, so nothing
is gathered and the whole model's states sit on the GPU) for ``--steps`` steps; the peak of
``torch.cuda.max_memory_allocated`` is set beside the plan's states + activations for the
same job (the plan's framework headroom is CUDA context, NCCL and allocator slack, which the
allocator's counter does not see). Llama-3.1-70B at 2 layers: 3.8B parameters, ~28 GiB of
bf16 states (8 B/param), ~57 GiB with ``--precision bf16-mixed`` (then one process autocasts,
which caches bf16 weight copies the plan's FSDP path does not make). Writes plan_gpu_check_<gpu>.json/.md in benchmarks/results/.

Unproven until run on a GPU: no GPU has run it yet. ``--device cpu`` trains the catalogue's
tiny model instead (the plumbing only; no GPU memory to measure) and prints the plan.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "workflow_scripts"))

from wattflex.runs import plan  # noqa: E402

GIB = 2**30


def cut_to_layers(facts: dict[str, Any], layers: int) -> dict[str, Any]:
    """``facts`` with ``layers`` decoder layers: every layer as large as the full model's."""
    sh = plan.shape(facts)
    per_layer = sh.layer_dense + sh.layer_expert
    total = 2 * sh.embedding + layers * per_layer
    experts = sh.layer_expert * layers
    return {
        **facts,
        "layers": layers,
        "total_params_b": total / 1e9,
        "expert_params_b": experts / 1e9,
    }


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="Llama-3.1-70B")
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--task", default="pt", choices=["pt", "lora"])
    # bf16: one process trains without FSDP, and at bf16-mixed the harness then autocasts, whose
    # cache of bf16 weight copies the FSDP path (what the plan models) does not have
    p.add_argument("--precision", default="bf16", choices=list(plan.PRECISIONS))
    p.add_argument("--seq-len", type=int, default=2048)
    p.add_argument("--batch", type=int, default=2)
    p.add_argument("--no-grad-checkpointing", dest="grad_checkpointing", action="store_false")
    # the harness's chunked loss (training.loss; 0: transformers' whole-sequence loss), planned alike
    p.add_argument("--loss-chunk-tokens", type=int, default=plan.LOSS_CHUNK_TOKENS)
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    p.add_argument("--out", type=Path, default=REPO / "benchmarks" / "results")
    return p.parse_args(argv)


def measure(args: argparse.Namespace, facts: dict[str, Any]) -> dict[str, Any]:
    """Train; the peak allocated GPU bytes (None on cpu)."""
    import torch

    from wattflex.runs.training.train_config import TrainConfig
    from wattflex.runs.training.trainer import train

    with tempfile.TemporaryDirectory() as out:
        cfg = TrainConfig(
            model_facts=facts,
            task=args.task,
            seq_len=args.seq_len,
            batch=args.batch,
            device=args.device,
            random_init=args.device == "cuda",
            tiny=args.device == "cpu",
            max_steps=args.steps,
            duration_s=600,
            eval_at_s=None,
            checkpoint_at_s=None,
            precision=args.precision,
            grad_checkpointing=args.grad_checkpointing,
            compile=False,
            loss_chunk_tokens=args.loss_chunk_tokens,
            outdir=out,
        )
        if args.device == "cuda":
            torch.cuda.reset_peak_memory_stats()
        steps = train(cfg)
        peak = torch.cuda.max_memory_allocated() if args.device == "cuda" else None
        name = torch.cuda.get_device_name() if args.device == "cuda" else "cpu"
    return {
        "device": name,
        "steps": int(len(steps)),
        "peak_allocated_gib": None if peak is None else peak / GIB,
    }


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    catalog = yaml.safe_load((REPO / "config" / "models.yaml").read_text())["models"]
    facts = cut_to_layers(catalog[args.model], args.layers)
    attention = plan.attention_of(facts, args.task)
    parts = plan.gpu_bytes(
        facts,
        args.task,
        1,
        1,
        args.precision,
        args.seq_len,
        args.batch,
        args.grad_checkpointing,
        32,
        attention,
        loss_chunk_tokens=args.loss_chunk_tokens,
    )
    planned = {k: v / GIB for k, v in parts.items()}
    measured = measure(args, facts)
    allocator = planned["total"] - planned["framework"]  # what max_memory_allocated can see
    peak = measured["peak_allocated_gib"]
    result = {
        "model": args.model,
        "layers": args.layers,
        "params_b": facts["total_params_b"],
        "task": args.task,
        "precision": args.precision,
        "seq_len": args.seq_len,
        "batch": args.batch,
        "grad_checkpointing": args.grad_checkpointing,
        "loss_chunk_tokens": args.loss_chunk_tokens,
        "attention": attention,
        "planned_gib": planned,
        "planned_allocator_gib": allocator,
        **measured,
        "measured_over_planned": None if peak is None else peak / allocator,
    }
    slug = (
        measured["device"].replace("NVIDIA ", "").split()[0].lower() if peak is not None else "cpu"
    )
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"plan_gpu_check_{slug}.json").write_text(json.dumps(result, indent=2) + "\n")
    rows = [
        ("states", planned["states"]),
        ("activations (logits)", planned["activations"]),
        ("of which loss logits", planned["logits"]),
        ("planned, allocator's view", allocator),
        ("measured peak allocated", peak),
    ]
    md = [
        f"# Resource plan vs measured GPU memory: {args.model} cut to {args.layers} layers "
        f"({facts['total_params_b']:.2f}B params), {args.task}, {args.precision}, seq {args.seq_len} x batch "
        f"{args.batch}, grad_checkpointing {args.grad_checkpointing}, loss_chunk_tokens {args.loss_chunk_tokens}, "
        f"on {measured['device']}",
        "",
        "| part | GiB |",
        "| --- | --- |",
    ]
    md += [f"| {name} | {'n/a (no GPU)' if v is None else f'{v:.2f}'} |" for name, v in rows]
    if peak is not None:
        md += ["", f"measured / planned: {result['measured_over_planned']:.3f}"]
    (args.out / f"plan_gpu_check_{slug}.md").write_text("\n".join(md) + "\n")
    print("\n".join(md))
    return result


if __name__ == "__main__":
    main()
