"""The real training harness: causal-LM pretraining (AdamW, full parameters) and LoRA SFT
with transformers 5 + peft, dense and MoE families, launched by torchrun.

``TrainConfig`` (``train_config``) says what to train; ``models`` builds or loads the model and
wraps it with LoRA; ``sharded`` builds it on the meta device and materialises each rank's
shard (FSDP, with ``parallel`` for expert parallelism); ``data`` yields token batches;
``checkpoint`` writes the distributed checkpoint; ``trainer.train`` runs the timed loop with
the paper's eval and checkpoint events and writes ``steps.parquet``. The torchrun entry
point is ``python -m wattflex.runs.training --config CFG.json --t0 EPOCH``. ``train_config`` importsno torch, so checking a ``TrainConfig`` never imports it.
"""
