# The names `wattflex.runs.training` hands on, loaded on first use (lazy_loader reads this stub).
from .train_config import TrainConfig
from .trainer import train

__all__ = ["TrainConfig", "train"]
