"""The plan against published measurements: torchtitan's Llama-3.1-8B peak memory
on H100 (resources/external/torchtitan-h100-202412/README.md says which file, commit and
setting each number is). For every pure-FSDP row, the plan of that run without activation
checkpointing must be at least the measured peak and the plan with full checkpointing at
most it: a selective-checkpointing run lies between the two, a fully checkpointed one at
or above the lower bound."""

import csv

import pytest

from wattflex.config import REPO_ROOT
from wattflex.runs import plan

ANCHORS = REPO_ROOT / "resources" / "external" / "torchtitan-h100-202412" / "peak_memory.csv"
GIB = 2**30
# meta-llama/Llama-3.1-8B config.json (torchtitan's llama3 "8B" flavour: dim 4096, 32 layers,
# 32 heads, 8 kv heads, ffn 14336): 8.03B parameters, embedding and output untied.
LLAMA_8B = {
    "hf_model_type": "llama",
    "total_params_b": 8.03,
    "expert_params_b": 0,
    "layers": 32,
    "hidden": 4096,
    "heads": 32,
    "kv_heads": 8,
    "head_dim": 128,
    "intermediate": 14336,
    "vocab": 128256,
}


def anchors() -> list[dict[str, str]]:
    """The rows the plan models: Llama-3.1-8B, FSDP over every GPU (no context or tensor
    parallelism, which the plan does not lay out)."""
    with ANCHORS.open(newline="") as f:
        rows = list(csv.DictReader(f))
    return [r for r in rows if r["model"] == "Llama-3.1-8B" and r["cp"] == r["tp"] == "1"]


def allocator_gib(row: dict[str, str], grad_checkpointing: bool) -> float:
    """The plan's GPU memory of the anchor's run, as torchtitan laid it out (9dec370): bf16
    mixed precision, the embedding and output in the FSDP root, the loss over the whole
    sequence. Less the plan's framework term: the measurement is the caching allocator's
    reserved peak, and the CUDA context and NCCL buffers the term is for lie outside it."""
    parts = plan.gpu_bytes(
        LLAMA_8B,
        "pt",
        int(row["gpus"]),
        1,
        "bf16-mixed",
        int(row["seq_len"]),
        int(row["local_batch"]),
        grad_checkpointing,
        0,
        "sdpa",
        embedding_units="root",
        loss_chunk_tokens=0,
    )
    return (parts["total"] - parts["framework"]) / GIB


def test_the_anchor_table_holds_the_published_rows_the_plan_models():
    rows = anchors()
    assert len(rows) == 7, rows  # Tables 1 and 3 (selective), Table 2's FSDP 8 / CP 1 (full)
    assert {r["activation_checkpointing"] for r in rows} == {"selective", "full"}


@pytest.mark.parametrize(
    "row",
    anchors(),
    ids=lambda r: (
        f"table{r['table']}-{r['gpus']}gpu-{r['seq_len']}"
        f"x{r['local_batch']}-{r['activation_checkpointing']}"
        f"{'-compile' if r['compile'] == 'true' else ''}{'-float8' if r['float8'] == 'true' else ''}"
    ),
)
def test_the_plans_without_and_with_checkpointing_bracket_the_measured_peak(row):
    measured = float(row["memory_gib"])
    no_ac, full_ac = allocator_gib(row, False), allocator_gib(row, True)
    assert no_ac >= measured >= full_ac, (
        f"torchtitan Table {row['table']} ({row['gpus']} H100, seq {row['seq_len']} x {row['local_batch']}, "
        f"{row['activation_checkpointing']} AC): plan without checkpointing {no_ac:.1f} GiB, measured "
        f"{measured:.1f} GiB, plan with full checkpointing {full_ac:.1f} GiB"
    )


def test_the_docs_table_shows_these_brackets():
    doc = (
        (REPO_ROOT / "docs" / "resource-plan.md")
        .read_text()
        .split("## Against published measurements")[1]
    )
    shown = [
        [c.strip() for c in line.strip("|").split("|")]
        for line in doc.splitlines()
        if line.startswith("| ") and line[2].isdigit()
    ]
    expected = [
        [f"{allocator_gib(r, False):.1f}", r["memory_gib"], f"{allocator_gib(r, True):.1f}"]
        for r in anchors()
    ]
    assert [row[-3:] for row in shown] == expected
