"""torchrun entry point: ``python -m wattflex.runs.training --config CFG.json --t0 EPOCH``."""

from __future__ import annotations

import argparse
import logging
import os
import sys

from wattflex.runs.training.cpus import bind_this_rank
from wattflex.runs.training.train_config import TrainConfig

# Runs never reach the network: models and data come from local paths or are synthetic.
for _var in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_DATASETS_OFFLINE"):
    os.environ.setdefault(_var, "1")


def main(argv: list[str] | None = None) -> int:
    """One rank's training (under torchrun): read the TrainConfig JSON of ``--config`` and train on
    the shared clock ``--t0``. Returns the exit status, 0.
    """
    parser = argparse.ArgumentParser(prog="python -m wattflex.runs.training", description=__doc__)
    parser.add_argument(
        "--config", required=True, help="TrainConfig as JSON (written by wattflex.runs.real_run)"
    )
    parser.add_argument(
        "--t0", type=float, default=None, help="epoch seconds of the run start (shared clock)"
    )
    args = parser.parse_args(argv)
    rank = os.environ.get("RANK", "0")
    logging.basicConfig(
        level=logging.INFO if rank == "0" else logging.WARNING,
        format=f"%(asctime)s rank{rank} %(levelname)s %(message)s",
        stream=sys.stderr,
    )
    cfg = TrainConfig.from_json(args.config)
    if cfg.cpu_binding:  # before torch starts a thread: every thread inherits it
        bind_this_rank()
    # Lazy: trainer imports torch; ``--help`` must not need it.
    from wattflex.runs.training.trainer import train

    train(cfg, args.t0)
    return 0


if __name__ == "__main__":
    sys.exit(main())
