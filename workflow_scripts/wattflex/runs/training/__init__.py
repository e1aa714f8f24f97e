"""The real training harness: causal-LM pretraining (AdamW, full parameters) and LoRA SFT
with transformers 5 + peft, dense and MoE families, launched by torchrun.

``TrainConfig`` (``train_config``) says what to train; ``models`` builds or loads the model and
wraps it with LoRA; ``sharded`` builds it on the meta device and materialises each rank's
shard (FSDP, with ``parallel`` for expert parallelism); ``data`` yields token batches;
``checkpoint`` writes the distributed checkpoint; ``trainer.train`` runs the timed loop with
the paper's eval and checkpoint events and writes ``steps.parquet``. The torchrun entry
point is ``python -m wattflex.runs.training --config CFG.json --t0 EPOCH``. ``train_config`` imports
no torch, so checking a ``TrainConfig`` never imports it.
"""

import lazy_loader

# The names this package hands on are those __init__.pyi imports; each is imported from its
# module on first use (PEP 562 ``__getattr__``, lazy_loader), so importing the package (as
# ``wattflex --help`` does) imports none of them.
__getattr__, __dir__, __all__ = lazy_loader.attach_stub(__name__, __file__)
