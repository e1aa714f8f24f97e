"""The workload vocabulary: the names a group's architecture, task, cluster and set take, and
the rule that derives a cluster from architecture and task (the paper's three clusters,
Tables 10-11), and the columns that describe a group's job. One registry: the config (``wattflex.config.groups``), the ingest reader,
statistics, the predictor and the figures read it; the schema's enums list the same names
(tests/unit/test_vocabulary.py holds them equal). Light: no imports.
"""

from __future__ import annotations

ARCHITECTURES = ("dense", "moe")
TASKS = ("pt", "lora")  # pt: pretraining (full AdamW); lora: LoRA fine-tuning
# The names tables outside wattflex give LoRA fine-tuning ("ft": the paper's tables; "sft").
LORA_TASK_NAMES = ("lora", "ft", "sft")
CLUSTERS = ("dense", "moe-pt", "moe-ft")  # the paper's order (Tables 10-11)
SETS = ("headline", "validation", "h100", "other")
# The sets whose groups have a published H200 PFI: Table 6 (headline), Table 7 (validation).
PUBLISHED_H200_SETS = ("headline", "validation")
VOCABULARY = {"architecture": ARCHITECTURES, "task": TASKS, "cluster": CLUSTERS, "set": SETS}
# The columns of runs.csv that describe a group's job beside its GPUs, in runs.csv's order.
JOB_COLUMNS = (
    "model",
    "architecture",
    "task",
    "cluster",
    "set",
    "matches",
    "seq_len",
    "batch",
    "ep",
    "compile",
)
# What makes two groups the same job on different knobs (a ``knob: clock`` group beside its cap
# group): not its set, published match or the columns derived from these.
SAME_JOB_COLUMNS = (
    "model",
    "gpus",
    "gpu_model",
    "task",
    "seq_len",
    "batch",
    "ep",
    "compile",
    "grad_checkpointing",
    "lora_rank",
)
# What the summary of one of the workflow's own runs carries of its group (summarize_run, sweeps).
RUN_GROUP_FIELDS = ("gpus", *JOB_COLUMNS, "grad_checkpointing", "lora_rank")


def cluster_of(architecture: str, task: str) -> str | None:
    """The paper's cluster of a job: dense whatever its task; MoE by task (pt: moe-pt, lora:
    moe-ft). None for an architecture or task outside the vocabulary."""
    if architecture == "dense":
        return "dense"
    if architecture == "moe" and task in TASKS:
        return "moe-pt" if task == "pt" else "moe-ft"
    return None
