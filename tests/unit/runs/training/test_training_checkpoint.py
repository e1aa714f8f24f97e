"""The harness's distributed checkpoint (training.checkpoint): where it goes, what it records,
and that the asynchronous save writes what the synchronous one does. Real torch DCP on CPU."""

from pathlib import Path

import pytest
import torch

from tests.tiny_training import tiny_cfg
from wattflex.provenance import read_json
from wattflex.runs.training import checkpoint
from wattflex.runs.training.trainer import train

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/unit/runs/conftest.py
REPO = Path(__file__).resolve().parents[4]


def test_checkpoint_location_takes_env_vars_and_the_run(tmp_path, monkeypatch):
    run = tmp_path / "results" / "camp" / "runs" / "g1" / "cap300"
    assert checkpoint.checkpoint_root(None, run) == run / "checkpoint"
    monkeypatch.setenv("SCRATCH", str(tmp_path / "scratch"))
    assert (
        checkpoint.checkpoint_root("$SCRATCH/ckpt", run)
        == tmp_path / "scratch" / "ckpt" / "camp/runs/g1/cap300"
    )
    assert (
        checkpoint.checkpoint_root("${SCRATCH}/{run}/x", run)
        == tmp_path / "scratch" / "camp/runs/g1/cap300" / "x"
    )
    monkeypatch.delenv("NOT_SET_ANYWHERE", raising=False)
    with pytest.raises(
        ValueError,
        match=r"cuda.checkpoint_dir '\$NOT_SET_ANYWHERE/c': environment variable not set",
    ):
        checkpoint.checkpoint_root("$NOT_SET_ANYWHERE/c", run)


def _run(outdir: Path, use_async: bool) -> dict:
    outdir.mkdir(parents=True)
    cfg = tiny_cfg(
        "Qwen3-32B",
        outdir,
        max_steps=3,
        duration_s=60,
        checkpoint_at_s=0.0,
        keep_checkpoint=True,
        checkpoint_async=use_async,
        checkpoint_dir=str(outdir / "ckpt" / "{run}"),
    )
    train(cfg)
    return read_json(outdir / ".training.json")["training"]["events"][0]


def _load(path: str) -> dict[str, torch.Tensor]:
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

    dcp_to_torch_save(path, Path(path) / "whole.pt")
    return torch.load(Path(path) / "whole.pt", weights_only=False)


@pytest.mark.slow
def test_async_save_writes_what_the_sync_save_does_and_records_its_size(tmp_path):
    events = {mode: _run(tmp_path / mode, mode == "async") for mode in ("async", "sync")}
    for mode, ev in events.items():
        path = Path(ev["path"])
        assert ev["async"] == (mode == "async") and ev["after_step"] == 1
        assert path.is_relative_to(tmp_path / mode / "ckpt") and path.name == "step1"
        assert ev["bytes"] == sum(f.stat().st_size for f in path.iterdir()) > 0
        assert ev["t_start_s"] <= ev["t_end_s"] and ev["written_s"] >= ev["t_start_s"]
    a, s = _load(events["async"]["path"]), _load(events["sync"]["path"])
    assert a.keys() == s.keys() == {"model", "optim"}
    assert a["model"].keys() == s["model"].keys() and len(a["model"]) > 10
    for name, value in a["model"].items():
        assert torch.equal(value, s["model"][name]), name  # same seed, same step: same weights
