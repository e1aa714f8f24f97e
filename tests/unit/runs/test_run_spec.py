"""``RunSpec`` (wattflex.runs.spec): a run's spec parsed once. On the walk from
``runner.run_at_cap`` to the training's launch, ``RunOptions.from_spec`` and
``TrainConfig.from_spec`` each run once (before RunSpec: twice each, in ``run_real`` and
again in ``run_node``), and the launched job's config is the parsed one with the run's
directory. The launch is stopped (no torchrun): real CPU spec of tests/unit/runs/test_real_run.py."""

import json

import pytest

from tests.unit.runs.test_real_run import cuda_spec
from wattflex.runs import real_run, runner
from wattflex.runs.spec import RunSpec
from wattflex.runs.training.config import TrainConfig


class Launched(Exception):
    """Raised where torchrun would start."""


def counted(monkeypatch, cls) -> list:
    calls = []
    parse = cls.from_spec.__func__
    monkeypatch.setattr(
        cls, "from_spec", classmethod(lambda c, *a: calls.append(a) or parse(c, *a))
    )
    return calls


def test_the_walk_from_run_at_cap_parses_the_spec_once(tmp_path, monkeypatch):
    options, training = counted(monkeypatch, real_run.RunOptions), counted(monkeypatch, TrainConfig)
    launched = {}

    def launch(cmd, log_path, *a, **k):
        launched["config"] = json.loads(
            next(tmp_path.glob(".run.*/.node0/train_config.json")).read_text()
        )
        launched["outdir"] = str(log_path.parent)
        raise Launched

    monkeypatch.setattr(real_run, "run_training", launch)
    with pytest.raises(Launched):
        runner.run_at_cap(cuda_spec(tmp_path), tmp_path / "run")
    assert (len(options), len(training)) == (1, 1)
    assert (
        launched["config"]["outdir"] == launched["outdir"] and launched["config"]["max_steps"] == 12
    )


def test_a_parsed_spec_is_not_parsed_again(tmp_path, monkeypatch):
    spec = RunSpec.of(cuda_spec(tmp_path))
    options = counted(monkeypatch, real_run.RunOptions)
    assert RunSpec.of(spec) is spec and options == []
    assert spec.train_config(tmp_path).outdir == str(tmp_path) and spec.train.outdir == "."


def test_the_one_run_sweep_trains_as_long_as_the_separate_sweep(tmp_path):
    spec = RunSpec.of(cuda_spec(tmp_path))
    longer = spec.with_duration(600.0)
    assert (longer.train.duration_s, longer.raw["run"]["duration_s"], longer.duration_s) == (
        600.0,
        600.0,
        600.0,
    )
    assert spec.train.duration_s == 120.0 and longer.options is spec.options


def test_a_spec_without_a_backend_is_refused_at_run_at_cap(tmp_path):
    spec = {k: v for k, v in cuda_spec(tmp_path).items() if k != "backend"}
    with pytest.raises(ValueError, match="unknown backend None"):
        runner.run_at_cap(spec, tmp_path / "run")
    assert not (tmp_path / "run").exists()
