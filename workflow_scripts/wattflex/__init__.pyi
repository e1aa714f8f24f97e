# The names `wattflex` hands on, loaded on first use (lazy_loader reads this stub; see __init__.py).
from .config import load_config
from .errors import UserError
from .gpus import GPUS
from .pfi import clock_pfi_table, pfi_table

__version__: str
SCHEMA_VERSION: str
__all__ = ["GPUS", "UserError", "clock_pfi_table", "load_config", "pfi_table"]
