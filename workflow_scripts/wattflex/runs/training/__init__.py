"""The real training harness: causal-LM pretraining (AdamW, full parameters) and LoRA SFT
with transformers 5 + peft, dense and MoE families, launched by torchrun.

``TrainConfig`` (``config``) says what to train; ``models`` builds or loads the model and
wraps it with LoRA; ``data`` yields token batches; ``loop.train`` runs the timed loop with
the paper's eval and checkpoint events and writes ``steps.parquet``. The torchrun entry
point is ``python -m wattflex.runs.training --config CFG.json --t0 EPOCH``.
"""

from wattflex.runs.training.config import ARCHITECTURES, TrainConfig

__all__ = ["ARCHITECTURES", "TrainConfig", "train"]


def train(cfg: TrainConfig, t0: float | None = None):
    """Run one training job (see ``wattflex.runs.training.loop.train``); imports torch lazily."""
    from wattflex.runs.training.loop import train as _train

    return _train(cfg, t0)
