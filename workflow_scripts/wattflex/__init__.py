"""wattflex: measure and exploit the power flexibility of AI training jobs.

The library behind the Snakemake workflow and the ``wattflex`` command, a package per job:

- core: ``config`` (schema + semantic checks), ``telemetry`` (schema, phases, steady-state
  aggregation), ``provenance`` (artifact metadata), ``labels`` (emulated or measured),
  ``gpus`` (the GPU catalogue), ``architectures`` (the model families the harness builds),
  ``run_ids`` (a run's directory name, written and parsed), ``fingerprint`` (rule code
  fingerprints), ``errors``;
- ``runs``: where runs come from (emulator, devices, the real training harness, sweeps);
- ``analysis``: PFI, cluster statistics, the predictor, the paper's tables;
- ``ingest``: measured sweeps and DCGM captures from elsewhere;
- ``allocation``: splitting a power cut across jobs (curves, policies, oracle, simulation);
- ``control``: the closed-loop controller, its device loop, the cluster simulation;
- ``plots``: every figure (the only place matplotlib is imported);
- ``report``, ``diagnosis`` (what a machine offers, observe-only), ``cli`` + ``commands``: the
  HTML report and the ``wattflex`` command.
"""

import lazy_loader

__version__ = "0.1.0"
SCHEMA_VERSION = "1.0"

# The names this package hands on are those __init__.pyi imports; each is imported from its
# module on first use (PEP 562 ``__getattr__``, lazy_loader), so importing the package (as
# ``wattflex --help`` does) imports none of them.
__getattr__, __dir__, __all__ = lazy_loader.attach_stub(__name__, __file__)
