"""``RunSpec`` (wattflex.runs.spec): a run's spec parsed once. On the walk from
``runner.run_at_cap`` to the training's launch, ``RunOptions.from_spec`` and
``TrainConfig.from_spec`` each run once (before RunSpec: twice each, in ``run_real`` and
again in ``run_node``), and the launched job's config is the parsed one with the run's
directory. The launch is stopped (no torchrun): real CPU spec of tests/unit/runs/test_real_run.py.

The walks of a cap run, a clock run and a one-run sweep, emulated and on the cuda backend (the
group's own command on FAKE NVML GPUs, tests/fakes/fake_pynvml.py; a training run stopped at
its launch), parse the spec once (``RunSpec.of`` on a dict, and each section's parser once) and
read no key of ``RunSpec.raw`` below the edge: ``raw`` is wrapped in a dict that records the
keys read from it. The plan's precision and torchrun layout are the harness's."""

import dataclasses
import json
from collections import Counter
from types import SimpleNamespace

import pytest

from tests.fakes.nvml_fixture import fake_nvml  # noqa: F401 (fixture)
from tests.unit.runs.sweep import test_sweep_real as real_sweep
from tests.unit.runs.test_command_run import command_spec
from tests.unit.runs.test_real_run import cuda_spec
from wattflex.config import groups, run_spec
from wattflex.provenance import read_json
from wattflex.run_ids import run_id
from wattflex.runs import plan, real_run, runner
from wattflex.runs.options import RunOptions
from wattflex.runs.spec import RunSpec
from wattflex.runs.sweep.algorithm import sweep_spec
from wattflex.runs.sweep.emulated import write_sweep_run
from wattflex.runs.sweep.real import write_real_sweep_run
from wattflex.runs.sweep.steady import SteadyCriteria, SweepSettings
from wattflex.runs.training.train_config import TrainConfig
from wattflex.telemetry import SummaryProtocol

SWEEP_GROUP = "moe-pt-gptoss20b-x8-ep8-nocompile"
PARSERS = {
    "RunOptions": (RunOptions, "from_spec"),
    "TrainConfig": (TrainConfig, "from_spec"),
    "SteadyCriteria": (SteadyCriteria, "from_config"),
    "SweepSettings": (SweepSettings, "from_config"),
    "SummaryProtocol": (SummaryProtocol, "from_config"),
}


class Launched(Exception):
    """Raised where torchrun would start."""


def counted(monkeypatch, cls, name="from_spec") -> list:
    calls = []
    parse = getattr(cls, name).__func__
    monkeypatch.setattr(cls, name, classmethod(lambda c, *a: calls.append(a) or parse(c, *a)))
    return calls


class RecordedLookups(dict):
    """A spec dict that records every key read from it one at a time (``[]``, ``get``, ``in``);
    copies (``{**d}``), JSON and iteration read it whole and are not recorded."""

    def __init__(self, spec, keys: list) -> None:
        super().__init__(spec)
        self.keys = keys

    def __getitem__(self, key):
        self.keys.append(key)
        return super().__getitem__(key)

    def get(self, key, default=None):
        self.keys.append(key)
        return super().get(key, default)

    def __contains__(self, key):
        self.keys.append(key)
        return super().__contains__(key)


@pytest.fixture()
def walk(monkeypatch):
    """What a run's walk parses: ``parses`` (``RunSpec.of`` on a dict), ``sections`` (each
    section parser's calls) and ``raw_keys`` (keys read from ``RunSpec.raw`` after the parse)."""
    seen = SimpleNamespace(parses=0, raw_keys=[], sections=Counter())
    of, with_duration = RunSpec.of.__func__, RunSpec.with_duration

    def watched_of(cls, spec, backend="cuda"):
        if isinstance(spec, RunSpec):
            return spec
        seen.parses += 1
        parsed = of(cls, spec, backend)
        return dataclasses.replace(parsed, raw=RecordedLookups(parsed.raw, seen.raw_keys))

    def watched_with_duration(self, duration_s):
        longer = with_duration(self, duration_s)
        return dataclasses.replace(longer, raw=RecordedLookups(longer.raw, seen.raw_keys))

    monkeypatch.setattr(RunSpec, "of", classmethod(watched_of))
    monkeypatch.setattr(RunSpec, "with_duration", watched_with_duration)
    for label, (cls, name) in PARSERS.items():
        parse = getattr(cls, name).__func__

        def count(c, *a, _parse=parse, _label=label):
            seen.sections[_label] += 1
            return _parse(c, *a)

        monkeypatch.setattr(cls, name, classmethod(count))
    return seen


def walked(walk) -> tuple:
    """(parses of the dict, each section parser's calls, keys read from ``raw``)."""
    return walk.parses, dict(walk.sections), walk.raw_keys


def once(*sections: str) -> tuple:
    """``walked`` of a spec parsed once: ``sections`` parsed once each, no other, no raw lookup."""
    return 1, dict.fromkeys(sections, 1), []


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


def emulated_spec(cfg, **extra):
    g = groups(cfg)[0]
    return {**run_spec(cfg, g["id"], run_id(max(g["caps"]), 0)), **extra}


@pytest.mark.parametrize("clock", [None, 1185])
def test_an_emulated_run_parses_its_spec_once(walk, default_config, tmp_path, clock):
    extra = {} if clock is None else {"clock_mhz": clock}
    out = runner.run_at_cap(emulated_spec(default_config, **extra), tmp_path / "run")
    run = read_json(out / "run.json")
    assert walked(walk) == once()
    assert (run.get("knob"), run.get("clock_mhz")) == (
        (None, None) if clock is None else ("clock", clock)
    )
    assert clock is None or run["clock_lock"]["clock_mhz_requested"] == clock


def test_an_emulated_one_run_sweep_parses_its_spec_once(walk, default_config, tmp_path):
    spec = sweep_spec(default_config, SWEEP_GROUP, "staircase")
    run = read_json(write_sweep_run(spec, tmp_path / "sweep") / "run.json")
    assert walked(walk) == once("SteadyCriteria", "SweepSettings", "SummaryProtocol")
    assert run["criteria"] == SteadyCriteria.from_config(spec["staircase"]).__dict__
    assert run["settings"] == SweepSettings.from_config(spec["staircase"]).__dict__


@pytest.mark.fake_gpu
@pytest.mark.parametrize("clock", [None, 1395.0])
def test_fake_nvml_cuda_command_run_parses_its_spec_once(walk, fake_nvml, tmp_path, clock):
    spec = command_spec(tmp_path) | ({} if clock is None else {"clock_mhz": clock})
    spec["group"]["command"]["launch"][3] = "4"  # steps: two throughput lines or more
    run = read_json(runner.run_at_cap(spec, tmp_path / "run") / "run.json")
    assert walked(walk) == once("RunOptions")
    assert run.get("clock_mhz") == clock and run["launch"] == "command"


def test_cuda_clock_run_parses_its_spec_once_up_to_the_launch(walk, tmp_path, monkeypatch):
    """The training path of a clock run, stopped at the launch: the SM clock is locked (observe
    mode on CPU: recorded, nothing set) from the parsed spec."""
    locked, clock_guard = [], real_run.clock_guard

    def launch(*a, **k):
        raise Launched

    monkeypatch.setattr(real_run, "run_training", launch)
    monkeypatch.setattr(
        real_run, "clock_guard", lambda clock, *a: locked.append(clock) or clock_guard(clock, *a)
    )
    with pytest.raises(Launched):
        runner.run_at_cap({**cuda_spec(tmp_path), "clock_mhz": 1395.0}, tmp_path / "run")
    assert walked(walk) == once("RunOptions", "TrainConfig") and locked == [1395.0]


@pytest.mark.fake_gpu
def test_fake_nvml_cuda_one_run_sweep_parses_its_spec_once(walk, fake_nvml, tmp_path):
    spec = real_sweep.sweep_spec(tmp_path, "staircase")
    spec["group"]["command"] = command_spec(tmp_path)["group"]["command"]
    spec["group"]["command"]["launch"][3] = "100000"
    run = read_json(write_real_sweep_run(spec, tmp_path / "sweep") / "run.json")
    assert walked(walk) == once("RunOptions", "SteadyCriteria", "SweepSettings", "SummaryProtocol")
    assert [v["cap_w"] for v in run["visits"]] == real_sweep.CAPS
    assert run["criteria"]["min_steps"] == spec["staircase"]["min_steps"]


@pytest.mark.parametrize(
    ("group", "cuda"),
    [
        ({"gpus": 16}, {}),
        ({"gpus": 4}, {"device": "cpu"}),
        ({"gpus": 2, "precision": "bf16"}, {"nproc_per_node": 8, "precision": "fp32"}),
        ({"gpus": 8}, {"precision": "fp32", "nnodes": 2, "nproc_per_node": 4}),
    ],
)
def test_the_plan_budgets_the_precision_and_layout_the_harness_runs(
    tmp_path, monkeypatch, group, cuda
):
    ranks, host_gb_per_node = [], plan.host_gb_per_node
    monkeypatch.setattr(
        plan, "host_gb_per_node", lambda *a: ranks.append(a[4]) or host_gb_per_node(*a)
    )
    spec = cuda_spec(tmp_path, model="Llama-3.1-70B", task="pt")
    spec["group"].update(group)
    spec["cuda"] = {k: v for k, v in spec["cuda"].items() if k not in ("device", "nproc_per_node")}
    spec["cuda"].update(cuda)
    parsed = RunSpec.of(spec)
    planned = plan.plan_group(spec["group"], spec["model_facts"], spec["cuda"])
    assert (planned.precision, ranks[0], planned.nodes) == (
        parsed.train.dtype_policy,
        parsed.options.nproc_per_node,
        parsed.options.nnodes,
    )
