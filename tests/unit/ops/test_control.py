"""The controller (wattflex.ops.controller): budget accounting, device constraints, the
stale-telemetry fallback, online learning; and the control loop (wattflex.ops.services.node_agent):
caps restored on every exit path, on emulated devices and on FAKE NVML GPUs
(tests/fakes/fake_pynvml.py)."""

import math
import signal
import sys
import types
from dataclasses import fields, replace
from pathlib import Path

import numpy as np
import pytest

from tests.fakes import fake_pynvml
from tests.fakes.nvml_fixture import control_process, fake_nvml, limits_w  # noqa: F401 (fixture)
from wattflex import cli
from wattflex.allocation.allocator import predicted_curves
from wattflex.allocation.curves import Curves
from wattflex.errors import UserError
from wattflex.gpus import GPUS
from wattflex.ops.controller import (
    ControlConfig,
    Controller,
    JobTable,
    Readings,
    round_caps,
)
from wattflex.ops.events import read_signal
from wattflex.ops.services.node_agent import NodeAgentSettings, NodeJob, run_loop, run_node_agent
from wattflex.policies import CONTROL_POLICIES
from wattflex.runs.emulator.device import EmulatedDevice

FAKES = Path(fake_pynvml.__file__).resolve().parent
REPO = FAKES.parents[1]


def jobs_table(n=6, seed=0, declared=True):
    rng = np.random.default_rng(seed)
    gpus = rng.choice([8, 16], n)
    p_max = gpus * rng.uniform(600, 690, n)
    return JobTable(
        uid=np.arange(n),
        gpus=gpus,
        min_cap_w=np.full(n, 200.0),
        max_cap_w=np.full(n, 700.0),
        moe_ft=rng.random(n) < 0.3,
        p_max_w=p_max if declared else np.full(n, np.nan),
        t_max=gpus * rng.uniform(2e3, 2e4, n) if declared else np.full(n, np.nan),
        dram_copy_product=rng.uniform(5, 40, n),
        pfi=rng.uniform(1.1, 2.0, n),
    )


def readings(power_w, tokens=None, age_s=0.0, util=99.0, idle_w=0.0, idle_gpus=0):
    power_w = np.asarray(power_w, float)
    tokens = np.full_like(power_w, 1e4) if tokens is None else np.asarray(tokens, float)
    total = np.atleast_2d(power_w).sum(-1) + idle_w
    return Readings(
        power_w,
        tokens,
        np.full_like(power_w, util),
        np.broadcast_to(np.asarray(age_s, float), power_w.shape).copy(),
        total,
        np.full(total.shape, idle_w),
        idle_gpus,
    )


# ---- signal --------------------------------------------------------------------------------


def test_signal_steps_ramps_and_holds(tmp_path):
    path = tmp_path / "s.csv"
    path.write_text("# a comment\ntime_s,fraction\n0,1.0\n100,1.0\n100,0.7\n200,0.7\n300,0.9\n")
    sig = read_signal(path)
    assert sig.duration_s == 300
    assert sig.at(99.9) == pytest.approx(1.0) and sig.at(100) == pytest.approx(0.7)  # a step
    assert sig.at(250) == pytest.approx(0.8)  # a ramp
    assert sig.at(1e6) == pytest.approx(0.9)  # the last value holds


@pytest.mark.parametrize(
    "text, match",
    [
        ("time_s,frac\n0,1\n", "missing column.*fraction"),
        ("time_s,fraction\n0,1\n10,0.5\n5,0.5\n", "must not decrease"),
        ("time_s,fraction\n0,1\n10,-0.5\n", "fraction must be in"),
        (
            "time_s,fraction\n-100,0.5\n-50,0.6\n",
            "time_s ends at -50 s, before the start",
        ),  # would run "for -50 s"
    ],
)
def test_bad_signal_is_refused_clearly(tmp_path, text, match):
    path = tmp_path / "bad.csv"
    path.write_text(text)
    with pytest.raises(ValueError, match=match):
        read_signal(path)


# ---- one decision ---------------------------------------------------------------------------


@pytest.mark.parametrize("policy", CONTROL_POLICIES)
def test_caps_stay_in_device_range_on_the_grid_and_sum_under_the_budget(policy):
    cfg = ControlConfig()
    jobs = jobs_table(8, seed=3)
    jobs.min_cap_w[2], jobs.max_cap_w[5] = 250.0, 600.0
    budget = 0.7 * jobs.p_max_w.sum()
    ctl = Controller([policy], cfg, len(jobs.uid))
    caps = ctl.step(
        0.0, budget, jobs, readings(jobs.p_max_w[None] * 0.9, idle_w=300.0, idle_gpus=4)
    )[0]
    assert np.all(caps >= jobs.min_cap_w) and np.all(caps <= jobs.max_cap_w)
    assert np.allclose(caps % cfg.cap_step_w, 0)
    # power is at most gpus * cap (the firmware's guarantee): the caps alone keep the budget
    charged = (
        (jobs.gpus * np.minimum(caps, jobs.p_max_w / jobs.gpus)).sum()
        + 300
        + cfg.idle_headroom_w * 4
    )
    assert charged <= budget * (1 - cfg.target_margin) + 1e-6
    assert (
        charged >= budget * (1 - cfg.target_margin) - len(caps) * 16 * cfg.cap_step_w
    )  # and uses it


def test_policies_split_the_cut_differently():
    jobs = jobs_table(8, seed=4)
    jobs.moe_ft[:] = [True, True] + [False] * 6
    ctl = Controller(list(CONTROL_POLICIES), ControlConfig(), len(jobs.uid))
    caps = ctl.step(
        0.0,
        0.7 * jobs.p_max_w.sum(),
        jobs,
        readings(np.tile(jobs.p_max_w, (len(CONTROL_POLICIES), 1))),
    )
    assert len({tuple(c) for c in caps}) >= 4
    weights_moe = caps[CONTROL_POLICIES.index("moe-ft-weighted")]
    equal = caps[CONTROL_POLICIES.index("equal-weight")]
    assert np.all(weights_moe[jobs.moe_ft] <= equal[jobs.moe_ft]) and np.all(
        weights_moe[~jobs.moe_ft] >= equal[~jobs.moe_ft]
    )


def test_no_budget_means_every_job_uncapped():
    jobs = jobs_table(4)
    caps = Controller(["online-learning"], ControlConfig(), 4).step(
        0.0, math.inf, jobs, readings(jobs.p_max_w[None])
    )
    assert np.all(caps == 700.0)


def test_stale_telemetry_gets_the_safe_equal_weight_cap_and_the_others_share_the_rest():
    cfg = ControlConfig()
    jobs = jobs_table(6, seed=1)
    budget = 0.6 * jobs.p_max_w.sum()
    safe = round_caps(
        np.array(budget * (1 - cfg.target_margin) / jobs.gpus.sum()), 200.0, 700.0, cfg.cap_step_w
    )
    ctl = Controller(["curve-aware"], cfg, 6)
    age = np.zeros((1, 6))
    age[0, 2] = cfg.stale_after_s + 1  # one feed stopped
    power = jobs.p_max_w[None].copy()
    power[0, 4] = np.nan  # one reading missing
    caps = ctl.step(0.0, budget, jobs, readings(power, age_s=age))[0]
    assert caps[2] == safe and caps[4] == safe
    assert ctl.fallback[0].tolist() == [False, False, True, False, True, False]
    assert (jobs.gpus * np.minimum(caps, jobs.p_max_w / jobs.gpus)).sum() <= budget * (
        1 - cfg.target_margin
    ) + 1e-6
    fresh = [0, 1, 3, 5]
    assert not np.all(caps[fresh] == safe)  # the fresh jobs are still optimised
    # every feed stale: every job on the same safe cap
    caps = ctl.step(5.0, budget, jobs, readings(jobs.p_max_w[None], age_s=np.inf))[0]
    assert np.all(caps == safe) and ctl.fallback.all()


def test_undeclared_profile_is_taken_from_uncapped_telemetry():
    jobs = jobs_table(3, declared=False)
    ctl = Controller(["equal-weight"], ControlConfig(), 3, predict_pfi=lambda d: 1.0 + 0.01 * d)
    true_p = np.array([5000.0, 10000.0, 5400.0])
    read = readings(true_p[None], tokens=np.array([[1e4, 3e4, 2e4]]))
    read.dram_active, read.mem_copy_util = np.full((1, 3), 0.5), np.full((1, 3), 40.0)
    for t in (0.0, 5.0, 10.0, 15.0):  # uncapped (no budget) until steady
        ctl.step(t, math.inf, jobs, read)
    assert ctl.known.all()
    assert np.allclose(ctl.profile.p_max_w, true_p) and np.allclose(ctl.profile.pfi, 1.2)
    assert ctl.knots_w[1, -1] == pytest.approx(10000.0)


def _true_curve(p_max, t_max, floor):
    """A smooth concave power -> tokens/s curve unlike the prior family's shape."""
    x = lambda p: (p - floor) / (p_max - floor)  # noqa: E731
    return lambda p: t_max * (0.25 + 0.75 * np.sqrt(np.clip(x(p), 0, 1)))


def test_online_learning_refines_the_curve_from_its_own_cap_changes():
    cfg = ControlConfig()
    jobs = jobs_table(1, seed=2)
    jobs.gpus[:] = 8
    jobs.p_max_w[:], jobs.t_max[:], jobs.pfi[:] = 5500.0, 1e5, 1.3
    truth = _true_curve(5500.0, 1e5, 1600.0)
    ctl = Controller(["online-learning"], cfg, 1)
    rng = np.random.default_rng(0)
    visited = []
    for k in range(200):
        budget = [3000.0, 4000.0, 5000.0, 2500.0][
            (k // 20) % 4
        ]  # the budget moves the job along its curve
        caps = ctl.caps[0] if k else np.array([700.0])
        power = np.minimum(caps * 8 * 0.97, 5500.0)
        visited.append(power[0])
        obs = truth(power) * (1 + rng.normal(0, 0.005, 1))
        ctl.step(5.0 * k, budget, jobs, readings(power[None], tokens=obs[None]))
    at = np.unique(np.round(visited))
    learned = ctl.learned_curves()[0, 0]
    err = lambda curve: np.abs(np.interp(at, ctl.knots_w[0], curve) - truth(at)).mean()  # noqa: E731
    assert ctl.n_obs[0, 0] > 50
    assert err(learned) < 0.2 * err(ctl.prior_t[0])  # where it has been, it knows the curve
    assert err(learned) < 0.01 * 1e5
    assert np.all(np.diff(learned) >= 0)


def test_power_ratio_learning_reclaims_slack_but_never_overshoots_the_share():
    cfg = ControlConfig()
    jobs = jobs_table(2, seed=5)
    jobs.gpus[:] = 8
    jobs.p_max_w[:] = 5500.0
    ctl = Controller(["equal-weight"], cfg, 2)
    true_ratio = np.array([0.96, 0.99])
    budget = 6000.0
    for k in range(120):
        caps = ctl.caps[0] if k else np.full(2, 700.0)
        power = np.minimum(caps * 8 * true_ratio, 5500.0)
        ctl.step(5.0 * k, budget, jobs, readings(power[None]))
    power = np.minimum(ctl.caps[0] * 8 * true_ratio, 5500.0)
    assert np.all(ctl.ratio[0] >= true_ratio - 1e-9)  # upper envelope: safe side
    assert power.sum() <= budget * (1 - cfg.target_margin) + 1e-6
    assert (
        power.sum() >= budget * (1 - cfg.target_margin) - 2 * 8 * cfg.cap_step_w
    )  # slack reclaimed


def test_trim_lowers_the_budget_when_power_stays_above_it():
    cfg = ControlConfig()
    jobs = jobs_table(3, seed=6)
    ctl = Controller(["pfi-aware"], cfg, 3)
    budget = 0.7 * jobs.p_max_w.sum()
    over = Readings(
        np.atleast_2d(jobs.p_max_w * 0.7),
        np.full((1, 3), 1e4),
        np.full((1, 3), 99.0),
        np.zeros((1, 3)),
        np.array([budget * 1.03]),
        np.zeros(1),
        0,
    )
    ctl.step(0.0, budget, jobs, over)
    first = (jobs.gpus * ctl.caps[0]).sum()
    for t in (15.0, 20.0):  # settled, still 3 % over (an unmodelled load)
        ctl.step(t, budget, jobs, over)
    assert ctl.trim[0] < 0 and (jobs.gpus * ctl.caps[0]).sum() < first


# ---- the loop on devices: caps restored on every exit path -------------------------------------


def emulated_jobs(n=2, gpus=2, demand_w=650.0, fail_at=None):
    devs = [[EmulatedDevice(GPUS["H200"]) for _ in range(gpus)] for _ in range(n)]
    calls = {"n": 0}

    def reader(ds):
        def read(t):
            calls["n"] += 1
            if fail_at is not None and calls["n"] > fail_at:
                raise KeyboardInterrupt("operator stopped the controller")  # not a telemetry error
            return {
                "t_s": t,
                "power_w": sum(min(d.limit_w, demand_w) for d in ds),
                "tokens_per_s": 1e4,
                "gpu_util": 99.0,
            }

        return read

    return devs, [NodeJob(f"job{i}", ds, reader(ds)) for i, ds in enumerate(devs)]


class FakeClock:
    def __init__(self):
        self.t = 0.0

    def __call__(self):
        return self.t

    def sleep(self, s):
        self.t += max(s, 0.0)


def test_loop_on_emulated_gpus_follows_the_signal_then_restores(tmp_path):
    devs, jobs = emulated_jobs()
    clock = FakeClock()
    seen = []
    budget_at = lambda t: 1800.0 if t >= 10 else math.inf  # noqa: E731
    rec = run_loop(
        jobs,
        budget_at,
        "equal-weight",
        ControlConfig(),
        40.0,
        state_dir=tmp_path,
        clock=clock,
        sleep=clock.sleep,
        on_period=lambda r: seen.append([d.limit_w for ds in devs for d in ds]),
    )
    assert seen[0] == [700.0] * 4  # no budget yet: uncapped
    assert all(sum(s) <= 1800.0 for s in seen[3:])  # under the budget once it applies
    assert all(200 <= c <= 700 for s in seen for c in s)
    assert [d.limit_w for ds in devs for d in ds] == [700.0] * 4  # restored
    assert not list(tmp_path.glob("caps-*.json"))
    assert len(rec.t_s) == 9 and rec.budget_w[-1] == 1800.0


def test_loop_exception_restores_caps_and_propagates(tmp_path):
    devs, jobs = emulated_jobs(fail_at=6)
    clock = FakeClock()
    with pytest.raises(KeyboardInterrupt, match="operator stopped"):
        run_loop(
            jobs,
            lambda t: 1500.0,
            "pfi-aware",
            ControlConfig(),
            100.0,
            state_dir=tmp_path,
            clock=clock,
            sleep=clock.sleep,
        )
    assert [d.limit_w for ds in devs for d in ds] == [700.0] * 4
    assert not list(tmp_path.glob("caps-*.json"))


def test_failing_telemetry_is_stale_not_fatal(tmp_path):
    devs, jobs = emulated_jobs()
    broken = jobs[1].read

    def flaky(t):
        if 10 <= t < 30:
            raise OSError("exporter unreachable")
        return broken(t)

    jobs[1].read = flaky
    clock = FakeClock()
    rec = run_loop(
        jobs,
        lambda t: 1600.0,
        "curve-aware",
        ControlConfig(),
        40.0,
        state_dir=tmp_path,
        clock=clock,
        sleep=clock.sleep,
    )
    during = [f for t, f in zip(rec.t_s, rec.fallback) if 10 <= t < 30]
    assert during and all(f == [False, True] for f in during)
    assert [d.limit_w for ds in devs for d in ds] == [700.0] * 4


@pytest.mark.fake_gpu
def test_fake_nvml_control_command_caps_during_the_signal_and_restores(fake_nvml, tmp_path, capsys):
    sig = tmp_path / "s.csv"
    sig.write_text("time_s,fraction\n0,0.6\n0.6,0.6\n")
    assert (
        cli.main(
            [
                "control",
                "--signal",
                str(sig),
                "--period-s",
                "0.1",
                "--state-dir",
                str(tmp_path / "st"),
            ]
        )
        == 0
    )
    out = capsys.readouterr().out
    assert "controlling 2 GPU(s)" in out and "power limits restored" in out
    calls = fake_nvml.state()["set_calls"]
    capped = [mw / 1000 for _, mw in calls if mw < 700_000]
    assert capped and max(capped) <= 0.6 * 700 and limits_w() == [700.0, 700.0]
    assert not list((tmp_path / "st").glob("caps-*.json"))


@pytest.mark.fake_gpu
def test_the_node_agent_is_library_code_one_call_on_its_settings_fake_nvml(
    fake_nvml, tmp_path, capsys
):
    """The service without the command: run_node_agent on a NodeAgentSettings (no argparse)
    follows a signal on two FAKE GPUs, caps under it and restores; a bad setting is the same
    one-line UserError the command prints."""
    sig = tmp_path / "s.csv"
    sig.write_text("time_s,fraction\n0,0.6\n0.6,0.6\n")
    settings = NodeAgentSettings(
        jobs=[[0], [1]], state_dir=tmp_path / "st", signal=str(sig), period_s=0.1
    )
    assert run_node_agent(settings) == 0
    assert "controlling 2 GPU(s) in 2 job(s) with equal-weight" in capsys.readouterr().out
    capped = [mw / 1000 for _, mw in fake_nvml.state()["set_calls"] if mw < 700_000]
    assert capped and max(capped) <= 0.6 * 700 and limits_w() == [700.0, 700.0]
    with pytest.raises(
        UserError, match=r"GPU index 5 does not exist \(this node has 2 GPUs: 0-1\)"
    ):
        run_node_agent(replace(settings, jobs=[[5]]))
    assert limits_w() == [700.0, 700.0]


def test_the_node_agents_defaults_are_the_commands():
    """A library caller who leaves a setting out gets what `wattflex control` gives it."""
    args = cli.build_parser().parse_args(["control", "--budget-w", "100"])
    settings = NodeAgentSettings(jobs=None, state_dir=Path("st"), budget_w=100.0)
    given = {"jobs", "state_dir", "model", "params", "moe_ft", "throughput_log"}
    differ = {
        f.name: (getattr(settings, f.name), getattr(args, f.name))
        for f in fields(NodeAgentSettings)
        if f.name not in given and getattr(settings, f.name) != getattr(args, f.name)
    }
    assert not differ, differ


@pytest.mark.fake_gpu
def test_fake_nvml_dry_run_prints_caps_and_touches_nothing(fake_nvml, tmp_path, capsys):
    fake_nvml.update_gpu(1, demand_w=400.0)
    line = (REPO / "tests/data/logs/torchtitan/metrics_plain.log").read_text().splitlines()[2]
    logs = [tmp_path / "train0.log", tmp_path / "train1.log"]
    for log in logs:  # each job's training log, torchtitan's line (curve-aware needs tokens/s)
        log.write_text(line + "\n")
    assert (
        cli.main(
            ["control", "--dry-run", "--budget-w", "900", "--policy", "curve-aware"]
            + [f"--throughput-log={log}" for log in logs]
            + ["--throughput-preset", "torchtitan"]
        )
        == 0
    )
    out = capsys.readouterr().out
    rows = [line.split() for line in out.splitlines() if line.startswith("gpu")]
    caps = [float(r[4]) for r in rows]
    power = [float(r[2]) for r in rows]  # a job left uncapped draws what it draws
    assert (
        len(rows) == 2 and sum(map(min, caps, power)) <= 900 and all(200 <= c <= 700 for c in caps)
    )
    assert "no power limit was changed" in out
    assert fake_nvml.state()["set_calls"] == [] and limits_w() == [700.0, 700.0]


def test_control_command_without_nvml_says_so_and_exits_2(monkeypatch, capsys):
    broken = types.ModuleType("pynvml")

    class NVMLError(Exception):
        pass

    def init():
        raise NVMLError("NVML Shared Library Not Found")

    broken.NVMLError, broken.nvmlInit = NVMLError, init
    monkeypatch.setitem(sys.modules, "pynvml", broken)
    monkeypatch.setattr("wattflex.runs.devices.nvml._initialised", False)
    assert cli.main(["control", "--dry-run", "--budget-w", "1000"]) == 2
    err = capsys.readouterr().err
    assert "no NVML on this machine" in err and "Shared Library Not Found" in err


@pytest.mark.fake_gpu
def test_fake_nvml_sigterm_during_control_restores_caps(fake_nvml, tmp_path):
    proc = control_process(
        tmp_path,
        "--budget-w",
        "700",
        "--duration-s",
        "120",
        "--period-s",
        "0.2",
        "--state-dir",
        str(tmp_path / "st"),
    )
    assert max(limits_w()) <= 350 and list((tmp_path / "st").glob("caps-*.json"))
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=30) == 128 + signal.SIGTERM, proc.stderr.read()
    assert limits_w() == [700.0, 700.0]
    assert not list((tmp_path / "st").glob("caps-*.json"))


def test_prior_curve_matches_the_predicted_pfi():
    jobs = jobs_table(5, seed=7)
    ctl = Controller(["curve-aware"], ControlConfig(), 5)
    ctl.step(0.0, math.inf, jobs, readings(jobs.p_max_w[None]))
    ref = predicted_curves(
        Curves(
            np.stack([jobs.gpus * 200.0, jobs.p_max_w], -1), np.stack([np.zeros(5), jobs.t_max], -1)
        ),
        jobs.pfi,
        ControlConfig().knots,
    )
    assert np.allclose(ctl.prior_t, ref.throughput) and np.allclose(ctl.knots_w, ref.power_w)


def test_loop_never_raises_a_gpu_above_the_limit_it_had(tmp_path):
    devs, jobs = emulated_jobs()
    devs[1][0].original_limit_w = devs[1][0].limit_w = 450.0  # an operator's lower limit on one GPU
    clock = FakeClock()
    seen = []
    run_loop(
        jobs,
        lambda t: math.inf,
        "equal-weight",
        ControlConfig(),
        20.0,
        state_dir=tmp_path,
        clock=clock,
        sleep=clock.sleep,
        on_period=lambda r: seen.append([d.limit_w for ds in devs for d in ds]),
    )
    assert all(s[2] <= 450.0 and s[3] <= 450.0 for s in seen)  # that job's GPUs stay at or below it
    assert seen[-1][:2] == [700.0, 700.0]
    assert [d.limit_w for ds in devs for d in ds] == [700.0, 700.0, 450.0, 700.0]


def test_controller_hulls_recomputed_only_for_changed_rows_equal_the_full_hull():
    from wattflex.allocation.oracle import concave_hull
    from wattflex.ops.controller import Controller

    rng = np.random.default_rng(5)
    ctl = Controller.__new__(Controller)  # only the hull cache is exercised
    ctl._last_hull = None
    P = np.cumsum(rng.uniform(50, 300, (2, 9, 8)), -1)
    T = np.cumsum(rng.uniform(-1, 5, (2, 9, 8)), -1)
    for step in range(4):
        np.testing.assert_array_equal(ctl._hull(P, T), concave_hull(P, T))
        P, T = P.copy(), T.copy()
        rows = rng.integers(0, 9, 2)
        T[step % 2, rows] = np.cumsum(rng.uniform(-1, 5, (2, 8)), -1)  # relearned curves
        P[:, rows[0]] = 0.0  # a job left


def test_an_electrical_limit_holds_in_every_period_whatever_the_ramp(tmp_path):
    """A limit (the node's share of its rack) that drops at t=10 s while the event's ramp
    allows 10 W/s: the ramp paces the budget, never the limit. Every period from t=10 s the
    GPUs' limits sum under it (power <= cap), during the event and at its restore too."""
    devs, jobs = emulated_jobs()
    clock = FakeClock()
    seen = []
    limit_at = lambda t: 1600.0 if t >= 10 else math.inf  # noqa: E731
    budget_at = lambda t: 1400.0 if 20 <= t < 40 else math.inf  # noqa: E731
    rec = run_loop(
        jobs,
        budget_at,
        "equal-weight",
        ControlConfig(),
        60.0,
        state_dir=tmp_path,
        clock=clock,
        sleep=clock.sleep,
        ramp_at=lambda t: 10.0,
        limit_at=limit_at,
        on_period=lambda r: seen.append((r.t_s[-1], sum(d.limit_w for ds in devs for d in ds))),
    )
    assert seen[0] == (0.0, 2800.0)
    held = [s for t, s in seen if t >= 10]
    assert held and max(held) <= 1600.0  # the first period of the limit included
    assert min(s for t, s in seen if 20 <= t < 40) < 1600.0  # the event still cut below it (ramped)
    assert rec.limit_w[-1] == 1600.0
    assert [d.limit_w for ds in devs for d in ds] == [700.0] * 4  # restored at the end
