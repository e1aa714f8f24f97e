"""Helpers of the training-harness tests: real torchrun jobs on CPU (the harness itself, or probe
scripts that build the harness's model in every rank and report what that rank holds)."""

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]

# A probe's first lines: the harness's model (``model``, ``info``) in this rank, and a whole,
# one-process reference (``ref``, ``ref_params``) built from the same config and seed.
PROBE_PREAMBLE = textwrap.dedent("""
    import json, sys, torch
    from wattflex.runs.training import loop, models, sharded
    from wattflex.runs.training.config import TrainConfig
    torch.set_num_threads(1)
    cfg = TrainConfig.from_json(sys.argv[1])
    dist = loop.init_distributed(cfg)
    model, info = loop.prepare_model(cfg, dist)
    torch.manual_seed(cfg.seed)
    ref = models.build_model(cfg, torch.float32, ep=cfg.ep)
    if cfg.task == "lora":
        ref = models.apply_lora(ref, cfg)
    ref_params = dict(ref.named_parameters())
""")


def torchrun(args: list[str], nproc: int = 2) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(REPO / "workflow_scripts"), "OMP_NUM_THREADS": "1"}
    return subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone",
                           f"--nproc-per-node={nproc}", *args], capture_output=True, text=True, env=env, timeout=300)


def train_torchrun(cfg, nproc: int = 2) -> subprocess.CompletedProcess:
    """The harness (``python -m wattflex.runs.training``) on ``cfg`` in ``nproc`` ranks; the
    config goes to cfg.json in ``cfg.outdir``."""
    Path(cfg.outdir).mkdir(parents=True, exist_ok=True)
    path = Path(cfg.outdir) / "cfg.json"
    cfg.to_json(path)
    return torchrun(["-m", "wattflex.runs.training", "--config", str(path)], nproc)


def run_probe(body: str, cfg, tmp_path: Path, nproc: int = 2) -> list[dict]:
    """Run ``PROBE_PREAMBLE + body`` in ``nproc`` ranks; ``body`` writes ``probe<rank>.json``
    into ``cfg.outdir``. Returns every rank's report."""
    cfg.to_json(tmp_path / "cfg.json")
    (tmp_path / "probe.py").write_text(PROBE_PREAMBLE + textwrap.dedent(body))
    r = torchrun([str(tmp_path / "probe.py"), str(tmp_path / "cfg.json")], nproc)
    assert r.returncode == 0, r.stderr[-3000:]
    return [json.loads((Path(cfg.outdir) / f"probe{rank}.json").read_text()) for rank in range(nproc)]
