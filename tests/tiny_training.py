"""The tiny CPU training job the harness's tests run: a random-init model of the catalogue's
family at a few layers (``tiny``), 32 tokens, no compile, no checkpointing of activations, no
evaluation or checkpoint unless a test asks. Each test passes what it is about."""

from pathlib import Path

import yaml

from wattflex.runs.training.train_config import TrainConfig

REPO = Path(__file__).resolve().parents[1]
CATALOG = yaml.safe_load((REPO / "config" / "models.yaml").read_text())["models"]

TINY = dict(
    task="pt",
    seq_len=32,
    batch=2,
    lora_rank=8,
    device="cpu",
    tiny=True,
    compile=False,
    grad_checkpointing=False,
    max_steps=2,
    duration_s=120,
    eval_at_s=None,
    checkpoint_at_s=None,
)


def tiny_cfg(model: str, outdir, **kw) -> TrainConfig:
    """A tiny job of the catalogue's ``model`` (or of ``model_facts``) writing to ``outdir``;
    ``kw`` overrides."""
    facts = kw.pop("model_facts", None) or CATALOG[model]
    return TrainConfig(**{"model_facts": facts, **TINY, "outdir": str(outdir), **kw})


# The step-memory model (tests/workflow/torchrun/test_step_memory.py, benchmarks/step_memory.py):
# Llama-3.1-70B's layer proportions (config.json: hidden 8192, 64 heads, 8 kv heads, MLP 28672)
# at hidden 1024, 8 layers, a 32000-token vocabulary: 173M parameters, 0.69 GB in fp32, shaped so
# that Llama's measured activation factor (wattflex.runs.plan) applies.
STEP_MODEL = {
    "hf_model_type": "llama",
    "hidden": 1024,
    "layers": 8,
    "heads": 16,
    "kv_heads": 2,
    "head_dim": 64,
    "intermediate": 3584,
    "vocab": 32000,
}
STEP_SEQ_LEN, STEP_BATCH, STEP_LORA_RANK = 256, 1, 8


def step_cfg(task: str, outdir, steps: int = 3) -> TrainConfig:
    """The harness's run of ``STEP_MODEL`` on CPU, FSDP2, random init, as the harness runs it
    (its checkpointing and compile defaults), ``steps`` steps."""
    return TrainConfig(
        model_facts=STEP_MODEL,
        task=task,
        seq_len=STEP_SEQ_LEN,
        batch=STEP_BATCH,
        lora_rank=STEP_LORA_RANK,
        device="cpu",
        random_init=True,
        parallel="fsdp",
        max_steps=steps,
        duration_s=1200,
        eval_at_s=None,
        checkpoint_at_s=None,
        outdir=str(outdir),
    )
