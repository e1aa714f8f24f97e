"""wattflex: measure and exploit the power flexibility of AI training jobs.

The library behind the Snakemake workflow and the ``wattflex`` command, a package per job:

- core: ``config`` (schema + semantic checks), ``telemetry`` (schema, phases, steady-state
  aggregation), ``provenance`` (artifact metadata), ``labels`` (emulated or measured),
  ``gpus`` (the GPU catalogue), ``fingerprint`` (rule code fingerprints), ``errors``;
- ``runs``: where runs come from (emulator, devices, the real training harness, sweeps);
- ``analysis``: PFI, cluster statistics, the predictor, the paper's tables;
- ``ingest``: measured sweeps and DCGM captures from elsewhere;
- ``allocation``: splitting a power cut across jobs (curves, policies, oracle, simulation);
- ``control``: the closed-loop controller, its device loop, the cluster simulation;
- ``plots``: every figure (the only place matplotlib is imported);
- ``report``, ``doctor`` (what a machine offers, observe-only), ``cli`` + ``commands``: the
  HTML report and the ``wattflex`` command.
"""

from __future__ import annotations

import importlib
from typing import Any, Callable, Mapping, Sequence

__version__ = "0.1.0"
SCHEMA_VERSION = "1.0"


def lazy_exports(package: str, exports: Mapping[str, Sequence[str]]) -> tuple[Callable, Callable, list[str]]:
    """PEP 562 re-exports for a subpackage ``__init__``: ``{submodule: [public names]}``.

    ``from wattflex.allocation import allocate`` works, yet importing one light submodule
    (``wattflex.allocation.policies`` for ``--help``) does not import its heavy siblings.
    wattflex.fingerprint reads the same ``EXPORTS`` literal to follow such imports."""
    where = {name: sub for sub, names in exports.items() for name in names}

    def __getattr__(name: str) -> Any:
        if name not in where:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        return getattr(importlib.import_module(f"{package}.{where[name]}"), name)

    def __dir__() -> list[str]:
        return sorted(where)

    return __getattr__, __dir__, sorted(where)
