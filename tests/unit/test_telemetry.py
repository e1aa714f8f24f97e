import numpy as np
import pandas as pd
import pytest

from wattflex.telemetry import (
    DIP,
    STARTUP,
    TRAINING,
    WARMUP,
    SummaryProtocol,
    detect_phases,
    summarize_run,
)


def trace(n_warm=10, n_start=6, n_train=100, dip=(50, 6), power=600.0, gpus=2, period=5.0, seed=0):
    """A constructed run: warmup, startup, training with a dip, ``gpus`` GPUs."""
    rng = np.random.default_rng(seed)
    n = n_warm + n_start + n_train
    t = np.arange(1, n + 1) * period
    util = np.r_[np.zeros(n_warm + n_start), np.full(n_train, 99.0)]
    fb = np.r_[np.linspace(0.5, 8, n_warm), np.full(n_start + n_train, 40.0)]
    p = np.r_[np.full(n_warm + n_start, 80.0), np.full(n_train, power)]
    d0 = n_warm + n_start + dip[0]
    util[d0 : d0 + dip[1]] = 5.0
    p[d0 : d0 + dip[1]] = 110.0
    rows = []
    for g in range(gpus):
        noise = rng.normal(0, 1.0, n) * (util > 50)
        rows.append(
            pd.DataFrame(
                {
                    "t_s": t,
                    "node": 0,
                    "gpu": g,
                    "power_w": p + noise,
                    "gpu_util": util,
                    "fb_used_gib": fb,
                    "sm_clock_mhz": 1800.0,
                    "mem_clock_mhz": 3201.0,
                    "energy_j": np.cumsum(p) * period,
                }
            )
        )
    tel = pd.concat(rows, ignore_index=True)
    t0 = (n_warm + n_start) * period
    t_dip0, t_dip1 = t0 + dip[0] * period, t0 + (dip[0] + dip[1]) * period
    ends = [x for x in np.arange(t0 + 2.0, t[-1], 2.0) if not (t_dip0 < x < t_dip1)]
    steps = pd.DataFrame(
        {"step": np.arange(1, len(ends) + 1), "t_end_s": ends, "tokens": 1000, "loss": 1.0}
    )
    return tel, steps


def test_phases_on_constructed_trace():
    from wattflex.telemetry import job_series

    tel, _ = trace()
    labels = detect_phases(job_series(tel))
    assert list(labels[:10]) == [WARMUP] * 10
    assert list(labels[10:16]) == [STARTUP] * 6
    assert (labels[16:66] == TRAINING).all()
    assert (labels[66:72] == DIP).all()
    assert (labels[72:] == TRAINING).all()


def test_top10_aggregate_is_mean_of_top_decile_and_drops_dips():
    tel, steps = trace(n_train=100, power=600.0)
    s = summarize_run(tel, steps)
    job = tel.groupby("t_s")["power_w"].sum()
    train_vals = job[(job > 1000)].to_numpy()
    k = round(0.1 * train_vals.size)
    assert s["power_w"] == pytest.approx(np.sort(train_vals)[-k:].mean())
    assert s["power_w"] > s["power_w_mean"]  # top decile above the mean
    assert s["power_w_mean"] == pytest.approx(train_vals.mean())
    assert s["power_w_sem"] == pytest.approx(train_vals.std(ddof=1) / np.sqrt(train_vals.size))
    # steps every 2 s of 1000 tokens; the step spanning the dip is a stall and is dropped
    assert s["tokens_per_s"] == pytest.approx(500.0)
    assert s["power_per_gpu_w"] == pytest.approx(s["power_w"] / 2)
    assert s["dip_s"] == 30.0 and s["warmup_s"] == 50.0 and s["startup_s"] == 30.0


def test_mean_protocol_uses_plain_steady_state_mean():
    tel, steps = trace()
    s = summarize_run(tel, steps, SummaryProtocol(aggregate="mean"))
    assert s["power_w"] == pytest.approx(s["power_w_mean"])


def test_no_training_phase_is_a_clear_error():
    tel, steps = trace()
    tel["gpu_util"] = 10.0
    with pytest.raises(ValueError, match="no training phase"):
        summarize_run(tel, steps)


def test_host_power_is_reported_beside_gpu_power_when_rapl_columns_exist():
    tel, steps = trace(gpus=2)
    tel["host_cpu_w"] = float("nan")
    tel["host_dram_w"] = float("nan")
    first = tel["gpu"] == 0  # one value per node, on its first GPU's row
    tel.loc[first, "host_cpu_w"] = 150.0
    tel.loc[first, "host_dram_w"] = 30.0
    s = summarize_run(tel, steps)
    assert s["host_power_w"] == pytest.approx(180.0)
    assert s["power_gpu_host_w"] == pytest.approx(s["power_w"] + 180.0)
    assert "host_power_w" not in summarize_run(*trace())
