"""The tiny CPU training job the harness's tests run: a random-init model of the catalogue's
family at a few layers (``tiny``), 32 tokens, no compile, no checkpointing of activations, no
evaluation or checkpoint unless a test asks. Each test passes what it is about."""

from pathlib import Path

import yaml

from wattflex.runs.training.config import TrainConfig

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
