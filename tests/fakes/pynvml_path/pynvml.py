"""FAKE pynvml, for processes a test starts but cannot patch (SLURM job steps, Snakemake's
rule scripts): with this directory first on PYTHONPATH, ``import pynvml`` gives
``tests.fakes.fake_pynvml`` (its GPUs in FAKE_PYNVML_STATE, per SLURM node with ``{node}``)."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))  # the repository, for tests.fakes
from tests.fakes import fake_pynvml  # noqa: E402

sys.modules[__name__] = fake_pynvml
