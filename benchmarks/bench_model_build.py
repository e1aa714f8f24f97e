"""Model build per rank: the harness's sharded build against the old whole-model build.

Usage: python benchmarks/bench_model_build.py [--ranks 2 4] [--tasks pt lora] [--paths whole sharded]
                                              [--out benchmarks/results/model_build.md]

For a ~450M-parameter random-init Llama (``MODEL`` below), each cell is one real gloo torchrun
job on CPU (OMP_NUM_THREADS=1, as torchrun sets), every rank timing its own build and reading
its own peak RSS (``ru_maxrss``) before and after it:
- whole: the old sequence, replicated here (the library no longer has it): seed, build the
  whole model (``models.build_model``), LoRA for lora, ``fully_shard`` each decoder layer,
  then the root;
- sharded: the harness's ``trainer.prepare_model`` with ``cuda.parallel: fsdp`` (meta build,
  ``fully_shard`` units, each rank allocating and initialising its shard).
Tasks: pt (fp32 master weights, the CPU default precision) and lora (bf16 frozen base:
``precision: bf16-mixed``). One run per cell. Writes a Markdown table to ``--out``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "workflow_scripts"))

# 451M parameters: 24 layers of hidden 1024 (GQA 16/8 heads, MLP 4096), vocab 36000, untied head
MODEL = {
    "hf_model_type": "llama",
    "hidden": 1024,
    "layers": 24,
    "heads": 16,
    "kv_heads": 8,
    "head_dim": 64,
    "intermediate": 4096,
    "vocab": 36000,
}


def train_config(task: str, outdir: str):
    from wattflex.runs.training.train_config import TrainConfig

    return TrainConfig(
        model_facts=MODEL,
        task=task,
        seq_len=32,
        batch=1,
        device="cpu",
        random_init=True,
        compile=False,
        grad_checkpointing=False,
        precision="bf16-mixed" if task == "lora" else "fp32",
        parallel="fsdp",
        outdir=outdir,
    )


def peak_rss() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def worker(path: str, task: str, out: Path) -> None:
    """One rank: build the model the ``path`` way; rank 0 writes every rank's numbers to ``out``."""
    import torch

    from wattflex.runs.training import models, sharded, trainer

    cfg = train_config(task, str(out.parent))
    dist = trainer.init_distributed(cfg)
    models.import_libraries(cfg)  # as the harness: the baseline includes the libraries
    before, t = peak_rss(), time.perf_counter()
    if path == "whole":  # the harness before the sharded build, step for step
        from torch.distributed.fsdp import fully_shard

        torch.manual_seed(cfg.seed)
        dtype = torch.bfloat16 if task == "lora" else torch.float32
        model = models.build_model(cfg, dtype)
        if task == "lora":
            model = models.apply_lora(model, cfg)
        for layer in trainer.decoder_layers(model):
            fully_shard(layer)
        fully_shard(model)
    else:
        model, _ = trainer.prepare_model(cfg, dist)
    row = {"build_s": time.perf_counter() - t, "rss_before": before, "rss_after": peak_rss()}
    rows = [None] * dist.world
    torch.distributed.all_gather_object(rows, row)
    if dist.rank == 0:
        out.write_text(
            json.dumps(
                {
                    "ranks": rows,
                    "model_bytes": sharded.model_bytes(model),
                    "params": sum(p.numel() for p in model.parameters()),
                }
            )
        )
    torch.distributed.destroy_process_group()


def cell(ranks: int, path: str, task: str) -> dict:
    with tempfile.TemporaryDirectory(prefix="bench_model_build_") as tmp:
        out = Path(tmp) / "cell.json"
        env = {**os.environ, "PYTHONPATH": str(REPO / "workflow_scripts"), "OMP_NUM_THREADS": "1"}
        r = subprocess.run(
            [
                sys.executable,
                "-m",
                "torch.distributed.run",
                "--standalone",
                f"--nproc-per-node={ranks}",
                __file__,
                "--worker",
                path,
                task,
                str(out),
            ],
            capture_output=True,
            text=True,
            env=env,
        )
        if r.returncode != 0:
            raise RuntimeError(
                f"{ranks} ranks, {path}, {task}: torchrun failed\n{r.stderr[-3000:]}"
            )
        facts = json.loads(out.read_text())
    per_rank = facts["ranks"]
    return {
        "ranks": ranks,
        "path": path,
        "task": task,
        "params": facts["params"],
        "model_bytes": facts["model_bytes"],
        "build_s": max(p["build_s"] for p in per_rank),
        "peak_rss": max(p["rss_after"] for p in per_rank),
        "growth": max(p["rss_after"] - p["rss_before"] for p in per_rank),
    }


def table(rows: list[dict]) -> str:
    gb = 1e9
    lines = [
        "| ranks | path | task | build s (slowest rank) | peak RSS per rank GB | RSS growth in build GB | "
        "growth / model bytes | full model GB |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in rows:
        lines.append(
            f"| {r['ranks']} | {r['path']} | {r['task']} | {r['build_s']:.1f} | {r['peak_rss'] / gb:.2f} | "
            f"{r['growth'] / gb:.2f} | {r['growth'] / r['model_bytes']:.2f} | {r['model_bytes'] / gb:.2f} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    if argv is None and len(sys.argv) > 1 and sys.argv[1] == "--worker":
        worker(sys.argv[2], sys.argv[3], Path(sys.argv[4]))
        return 0
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ranks", type=int, nargs="+", default=[2, 4])
    ap.add_argument("--tasks", nargs="+", choices=["pt", "lora"], default=["pt", "lora"])
    ap.add_argument(
        "--paths", nargs="+", choices=["whole", "sharded"], default=["whole", "sharded"]
    )
    ap.add_argument("--out", type=Path, default=REPO / "benchmarks" / "results" / "model_build.md")
    args = ap.parse_args(argv)
    load = os.getloadavg()[0]
    rows = []
    for ranks in args.ranks:
        for task in args.tasks:
            for path in args.paths:
                rows.append(cell(ranks, path, task))
                print(table(rows[-1:]).splitlines()[-1], flush=True)
    text = table(rows)
    print(text)
    rev = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=REPO
    ).stdout.strip()
    import torch
    import transformers

    args.out.write_text(
        "# Model build per rank: sharded vs the old whole build\n\n"
        f"`python benchmarks/bench_model_build.py` at {rev}: {rows[0]['params'] / 1e6:.1f}M-parameter random-init "
        f"Llama ({json.dumps(MODEL)}), gloo on CPU, OMP_NUM_THREADS=1, one run per cell; torch {torch.__version__}, "
        f"transformers {transformers.__version__}, {platform.processor() or platform.machine()}, {os.cpu_count()} cores, "
        f"load average {load:.1f} at the start (shared machine: times are upper bounds). "
        "pt: fp32 master weights; lora: bf16 frozen base. Build s: the slowest rank's wall time, the model "
        "libraries already imported (not timed), from before the "
        "build to the model ready to train (sharded: including allocation and init). RSS: each rank's peak "
        "resident memory (`ru_maxrss`) after the build, the largest rank shown; growth: after minus before the "
        "build.\n\n" + text + "\n"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
