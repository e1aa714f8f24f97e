"""Bytes a real transformers decoder layer saves for backward, per family and task, beside the
plan's activation factor (wattflex.runs.plan.ACTIVATION_FACTORS): a table of
tests/layer_saved_bytes.py's measurement (the method is in its docstring) for every catalogue
family at the widths it fits from (1/16 of the catalogue's at most).

Usage: python benchmarks/activation_bytes.py [--out MD]
"""

from __future__ import annotations

import argparse
import datetime
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "workflow_scripts"))
sys.path.insert(0, str(REPO))  # tests/layer_saved_bytes.py: the measurement the test holds too

import torch  # noqa: E402

from tests.layer_saved_bytes import LORA_RANK, Measured, families, measure  # noqa: E402
from wattflex.runs import plan  # noqa: E402


def measure_all() -> list[Measured]:
    torch.set_num_threads(1)
    return [measure(f, t) for f in families() for t in ("pt", "lora")]


def table(rows: list[Measured]) -> str:
    lines = [
        "| family | model | task | attention | checkpointing | measured B/(s·b·h) | plan's factor | "
        "measured B/(a·s²·b) | B/routed-expert param |",
        "|" + " --- |" * 9,
    ]
    for r in rows:
        used = plan.activation_factors(r.family, r.task)
        lines.append(
            f"| {r.family} | {r.model} | {r.task} | {r.attention} | off | {r.factor:.1f} | {used.factor:.1f} | "
            f"{r.score:.2f} | {r.expert_weight:.2f} |"
        )
        lines.append(
            f"| {r.family} | {r.model} | {r.task} | {r.attention} | on | {r.checkpointed:.1f} | "
            f"{plan.ACT_BYTES_CKPT_INPUT:.1f} | - | - |"
        )
    return "\n".join(lines)


NOTES = """\
"measured B/(s·b·h)": bytes one layer saves for backward without activation checkpointing, at the
catalogue model's hidden size (fitted from 1/k and 1/2k of its widths, three sequence lengths each:
see the module docstring); with checkpointing ("on") a layer keeps only its bf16 input. "plan's
factor": wattflex.runs.plan.ACTIVATION_FACTORS, copied from this table. Before, the plan used
Korthikanti et al.'s 34 for every family (a GPT block with a 4h GeLU MLP): 1.4-3.2x too few here.
Eager scores cost 2 B per a·s²·b (bf16 softmax kept; the plan assumed Korthikanti's 5). LoRA on
fused expert weights (peft target_parameters) saves the merged bf16 weight of every expert of the
layer for grouped_mm's backward: 2 B per routed-expert parameter, whatever the tokens. Measured on
CPU; what a GPU's kernels (FlashAttention, grouped GEMM) save is not measured here.
"""


def main(argv: list[str] | None = None) -> list[Measured]:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument(
        "--out", type=Path, default=REPO / "benchmarks" / "results" / "activation_bytes.md"
    )
    args = ap.parse_args(argv)
    import peft
    import transformers

    rows = measure_all()
    doc = (
        f"# Activation bytes per decoder layer (`python benchmarks/activation_bytes.py`)\n\n"
        f"Measured {datetime.date.today().isoformat()} on CPU, torch {torch.__version__}, transformers "
        f"{transformers.__version__}, peft {peft.__version__}; bf16 layers, LoRA rank {LORA_RANK}.\n\n"
        + table(rows)
        + "\n\n"
        + NOTES
    )
    print(doc)
    args.out.write_text(doc)
    return rows


if __name__ == "__main__":
    main()
