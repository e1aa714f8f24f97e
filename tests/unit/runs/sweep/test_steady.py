"""The steady-state detector on constructed series: step changes, transients, drifts, dips."""

import numpy as np
import pandas as pd
import pytest

from wattflex.runs.sweep.steady import (
    SteadyCriteria,
    assess,
    dip_mask,
    drift,
    leading_slow,
    mser_truncation,
    se_mean_ar1,
)

PERIOD = 5.0


def ar1(rng, n, sd, phi=0.6):
    x = np.empty(n)
    x[0] = rng.normal(0, sd)
    for i in range(1, n):
        x[i] = phi * x[i - 1] + rng.normal(0, sd * np.sqrt(1 - phi**2))
    return x


def series_and_steps(
    level,
    t_end=900.0,
    rate=lambda t: np.full_like(t, 1000.0),
    step_s=4.0,
    noise=0.004,
    step_noise=0.008,
    util=None,
    seed=0,
    train_from=20.0,
):
    """A job-level series (one sample every PERIOD s) whose power is ``level(t)`` plus AR(1)
    noise, and a step log whose tokens/s is ``rate(t)`` with i.i.d. noise. Training (util
    99 %) from ``train_from``; ``util(t)`` overrides utilisation."""
    rng = np.random.default_rng(seed)
    t = np.arange(PERIOD, t_end + 1e-9, PERIOD)
    p = level(t) * (1 + ar1(rng, t.size, noise))
    u = np.where(t > train_from, 99.0, 0.0) if util is None else util(t)
    series = pd.DataFrame({"t_s": t, "power_w": p, "gpu_util": u, "fb_used_gib": 40.0})
    ends, tokens, now = [], [], train_from
    while now < t_end:
        r = float(rate(np.array([now]))[0]) * (1 + rng.normal(0, step_noise))
        now += step_s
        ends.append(now)
        tokens.append(r * step_s)
    steps = pd.DataFrame(
        {
            "step": np.arange(1, len(ends) + 1),
            "t_end_s": ends,
            "tokens": np.round(tokens).astype(np.int64),
            "loss": 1.0,
        }
    )
    return series, steps


def first_done(series, steps, t_change, criteria=SteadyCriteria(), until=None):
    """Poll like the controller: the first time the window at t_change is steady and precise."""
    for now in np.arange(t_change + PERIOD, (until or series["t_s"].max()) + 1e-9, PERIOD):
        w = assess(
            series[series["t_s"] <= now], steps[steps["t_end_s"] <= now], t_change, now, criteria
        )
        if w.done:
            return w
    return w


# ---- single-series statistics ------------------------------------------------------------


def test_ar1_standard_error_matches_the_spread_of_means():
    rng = np.random.default_rng(1)
    means, ses = [], []
    for _ in range(400):
        x = ar1(rng, 60, 1.0, phi=0.6)
        means.append(x.mean())
        ses.append(se_mean_ar1(x))
    naive = 1 / np.sqrt(60)
    assert np.std(means) > 1.6 * naive  # autocorrelation matters...
    assert np.median(ses) == pytest.approx(np.std(means), rel=0.25)  # ...and is corrected for


def test_mser_cuts_an_exponential_transient_and_not_stationary_noise():
    rng = np.random.default_rng(2)
    t = np.arange(60.0)
    x = 100 + 8 * np.exp(-t / 4) + rng.normal(0, 0.3, t.size)
    d, settled = mser_truncation(x)
    assert settled and 8 <= d <= 25
    assert abs(x[d:].mean() - 100) < 3 * 0.3 / np.sqrt(t.size - d)  # what remains is within noise
    d0, settled0 = mser_truncation(100 + rng.normal(0, 0.3, 60))
    assert settled0 and d0 < 15


def test_mser_says_not_settled_while_the_series_is_still_moving():
    x = 100 + 10 * np.exp(-np.arange(30.0) / 40)  # a slow transient, far from over
    assert mser_truncation(x)[1] is False


def test_leading_slow_drops_warmup_steps_only():
    rates = np.array([0.70, 0.93, 0.995, 1.004, 0.998, 1.002, 0.999, 1.001])
    assert leading_slow(rates) == 2
    rng = np.random.default_rng(3)
    assert leading_slow(1 + rng.normal(0, 0.008, 12)) == 0


def test_drift_needs_significance_and_size():
    t = np.arange(40) * PERIOD
    rng = np.random.default_rng(4)
    noise = rng.normal(0, 0.5, t.size)
    assert drift(t, 1000 + 0.1 * t + noise, 3.0, tolerance=5.0)  # 20 W over the window: large
    assert not drift(t, 1000 + 0.01 * t + noise, 3.0, tolerance=5.0)  # significant but 2 W: small
    assert not drift(t, 1000 + noise, 3.0, tolerance=0.01)  # no trend


# ---- assess on constructed runs ----------------------------------------------------------


def test_step_change_window_starts_after_the_change_and_reads_the_new_level():
    level = lambda t: np.where(t < 300, 5000.0, 3000.0)  # cap lowered at 300 s
    rate = lambda t: np.where(t < 300, 1000.0, 800.0)
    series, steps = series_and_steps(level, rate=rate)
    w = first_done(series, steps, t_change=300.0)
    assert w.done and w.reason == "ok"
    assert w.t_settled_s >= 300 + SteadyCriteria().min_settle_s
    assert w.power_w == pytest.approx(3000, rel=0.005)
    assert w.tokens_per_s == pytest.approx(800, rel=0.01)
    assert w.t_end_s < 300 + 180  # measured in minutes, not a 30-minute run


def test_slow_transient_is_waited_out_not_averaged_in():
    # Power falls to its new level with a 40 s time constant (slow firmware/thermal response).
    level = lambda t: np.where(
        t < 300, 5000.0, 3000.0 + 2000.0 * np.exp(-np.clip(t - 300, 0, None) / 40)
    )
    series, steps = series_and_steps(level, noise=0.002)
    w = first_done(series, steps, t_change=300.0)
    assert w.done
    assert w.t_settled_s >= 300 + 80  # two time constants at least
    assert w.power_w == pytest.approx(3000, rel=0.01)


def test_a_large_drift_keeps_the_window_open():
    level = lambda t: 3000.0 * (1 + 0.0002 * np.clip(t - 300, 0, None))  # +1.2 % per minute
    series, steps = series_and_steps(level, noise=0.002)
    w = assess(series[series["t_s"] <= 500], steps[steps["t_end_s"] <= 500], 300.0, 500.0)
    assert not w.done and w.reason in ("drift_power", "settling")


def test_eval_dip_above_the_util_threshold_and_checkpoint_are_excluded():
    # Eval: power at 55 %, util 62 % (above the 50 % training threshold); checkpoint: util 4 %.
    eval_on = lambda t: (t > 400) & (t <= 445)
    ckpt_on = lambda t: (t > 520) & (t <= 545)
    level = lambda t: np.where(eval_on(t), 0.55 * 4000, np.where(ckpt_on(t), 900.0, 4000.0))
    util = lambda t: np.where(
        t <= 20, 0, np.where(eval_on(t), 62.0, np.where(ckpt_on(t), 4.0, 99.0))
    )
    rate = lambda t: np.where(eval_on(t) | ckpt_on(t), 100.0, 1000.0)
    series, steps = series_and_steps(level, rate=rate, util=util, t_end=700)
    w = assess(series, steps, t_change_s=380.0, t_now_s=700.0)
    used = np.asarray(w.sample_times)
    assert not ((used > 400) & (used <= 445 + SteadyCriteria().min_settle_s)).any()
    assert not ((used > 520) & (used <= 545 + SteadyCriteria().min_settle_s)).any()
    assert w.power_w == pytest.approx(4000, rel=0.005)
    assert w.tokens_per_s == pytest.approx(1000, rel=0.01)
    assert dip_mask(series, (series["t_s"] > 380).to_numpy())[
        (series["t_s"] > 400) & (series["t_s"] <= 445)
    ].all()


def test_window_length_adapts_to_the_noise():
    level = lambda t: np.full_like(t, 4000.0)
    criteria = SteadyCriteria(target_rel_se=0.005)
    quiet = first_done(
        *series_and_steps(level, noise=0.001, step_noise=0.002, t_end=1500), 100.0, criteria
    )
    noisy = first_done(
        *series_and_steps(level, noise=0.01, step_noise=0.06, t_end=1500), 100.0, criteria
    )
    assert quiet.done and noisy.done
    assert noisy.t_end_s - noisy.t_change_s > 3 * (quiet.t_end_s - quiet.t_change_s)
    for w in (quiet, noisy):
        assert max(w.rel_se) <= criteria.target_rel_se


def test_too_little_data_is_never_done():
    series, steps = series_and_steps(lambda t: np.full_like(t, 4000.0), t_end=200)
    w = assess(series, steps, t_change_s=150.0, t_now_s=200.0)
    assert not w.done and w.reason == "too_few_samples"


def test_a_visit_without_any_step_yet_is_not_done():
    series, steps = series_and_steps(lambda t: np.full_like(t, 4000.0), t_end=400, step_s=300.0)
    w = assess(series, steps[steps["t_end_s"] < 100], t_change_s=100.0, t_now_s=400.0)
    assert not w.done and w.n_steps == 0 and w.reason == "too_few_steps"
