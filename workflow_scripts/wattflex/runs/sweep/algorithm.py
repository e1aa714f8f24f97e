"""The one-run sweep's algorithm: the in-run staircase and the adaptive grid, on any live run.

The paper ran each cap of a sweep group as its own 30-minute job, paying start-up, model
load and warm-up every time. Here one training run steps through the caps:

    set cap -> wait until steady (``wattflex.runs.sweep.steady.assess``) -> measure until both means
    reach the target standard error -> next cap

so start-up is paid once and each point takes only as long as the job's noise requires.

*Staircase* (``sweep: staircase``) visits the group's caps once, lowest first: whatever is
left of the job's warm-up then lands on the deepest cap, whose Eq. 1 term barely depends
on its throughput (a 1 % error there moves the term by ~0.4 %), and the uncapped reference,
which enters every term, is measured last, long after start-up. *Adaptive* (``sweep: adaptive``)
starts with the same pass, then keeps revisiting the cap whose noise contributes most to
the PFI's variance per second of extra measurement (delta method on ``pfi.pfi_ratio``:
usually the uncapped reference and the mildest cap, whose Eq. 1 term divides by a small
throughput loss), and stops when the 95 % Monte Carlo CI of the PFI is narrower than a
target or a time budget is spent. The cap grid itself stays the group's grid: PFI depends
on which caps are swept (paper Table 9), so adding caps would change the quantity measured.

Both backends drive the same controller through two small interfaces: a device with
``set_cap(W) -> enforced W`` and ``restore()`` (``CapDevice``) and a live run (``LiveRun``:
``now_s``, ``advance(dt)``, ``series()``, ``steps()``, ``stop()``); the emulated one is in
``wattflex.runs.sweep.emulated``, the real one in ``wattflex.runs.sweep.real``.
``restored_on_exit`` restores the original cap on normal exit, on an exception and on
SIGINT/SIGTERM/SIGHUP. It lives here, not with the real backend, because the controller
itself relies on it and the emulated device's restore is part of the emulated record.

``sweep_spec`` (the run spec ``rules/common/params.smk`` builds per group and mode) and
``run_controller`` turn the config's ``staircase:`` section (parsed into ``RunSpec.steady`` and
``RunSpec.sweep_settings``, ``wattflex.runs.sweep.steady``) into a controller run; both backends
share them, so they live with the algorithm.
"""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np
import pandas as pd

from wattflex.config import groups, run_spec
from wattflex.pfi import pfi_ratio, pfi_table
from wattflex.run_ids import run_id
from wattflex.runs.devices.caps import SIGNALS, CapSignal
from wattflex.runs.spec import ONE_RUN_SWEEPS, RunSpec
from wattflex.runs.sweep.steady import SteadyCriteria, Window, assess, se_mean_ar1
from wattflex.schema import section_defaults
from wattflex.telemetry import SummaryProtocol

MODES = ONE_RUN_SWEEPS
# the controller's defaults: the functions below
_STAIRCASE = section_defaults("staircase")
_SEED = section_defaults()["seed"]  # the campaign's seed, the PFI CIs' resampling seed


# ---------------------------------------------------------------------------------------
# Interfaces and the restore guarantee
# ---------------------------------------------------------------------------------------


class CapDevice(Protocol):
    """What the controller caps: the job's GPUs as one device."""

    def set_cap(self, cap_w: float) -> float:
        """Cap every GPU at ``cap_w`` W. Returns the enforced limit read back, in W."""

    def restore(self) -> None:
        """Put back the original limits (raises when any cannot be)."""


class LiveRun(Protocol):
    """A running job the controller steers: its cap device, its clock ``now_s`` (s since the
    start), how often it is polled and how long it may run (s).
    """

    device: CapDevice
    now_s: float
    poll_s: float
    max_duration_s: float

    def advance(self, dt_s: float) -> None:
        """Let ``dt_s`` s of the run pass (sleep, or simulate)."""

    def series(self) -> pd.DataFrame:
        """The job-level telemetry so far (``t_s, power_w``...)."""

    def steps(self) -> pd.DataFrame:
        """The step log so far (``step, t_end_s, tokens, loss``)."""

    def stop(self) -> None:
        """End the run."""


RESTORE_SIGNALS = tuple(getattr(signal, s) for s in SIGNALS)  # the ones CapGuard restores on too


@contextlib.contextmanager
def restored_on_exit(
    device: CapDevice, signals: Sequence[int] = RESTORE_SIGNALS
) -> Iterator[CapDevice]:
    """Restore ``device``'s original cap when the block ends: normally, by an exception or by
    one of ``signals`` (raised as ``caps.CapSignal``, a SystemExit with status 128 + signal,
    so every ``finally`` runs; handlers only in the main thread). Around real GPUs, nest it
    in ``caps.CapGuard``, which also leaves a state file for restores after SIGKILL."""
    previous: dict[int, Any] = {}

    def handler(signum: int, frame: Any) -> None:
        raise CapSignal(signum)

    if threading.current_thread() is threading.main_thread():
        for s in signals:
            previous[s] = signal.signal(s, handler)
    try:
        yield device
    finally:
        pending: list[int] = []  # a second signal must not interrupt the restore itself
        for s in previous:
            signal.signal(s, lambda signum, frame: pending.append(signum))
        try:
            device.restore()
        finally:
            for s, h in previous.items():
                signal.signal(s, h)
        if pending:
            raise CapSignal(pending[0])


# ---------------------------------------------------------------------------------------
# The controller
# ---------------------------------------------------------------------------------------


@dataclass
class Visit:
    """One stay at one cap: the cap asked for and the limit enforced (W), and the verdict on its
    window of data.
    """

    cap_w: float
    enforced_w: float
    window: Window

    def record(self) -> dict[str, Any]:
        """The visit for run.json: cap, enforced limit and its window's record."""
        return {"cap_w": self.cap_w, "enforced_limit_w": self.enforced_w, **self.window.record()}


@dataclass
class Result:
    """What a sweep did: its mode, caps and visits, why it stopped, how long it took (s), and, for
    the adaptive grid, the PFI and its CI after each round.
    """

    mode: str
    caps: list[float]
    visits: list[Visit] = field(default_factory=list)
    stop_reason: str = ""
    duration_s: float = float("nan")
    history: list[dict[str, Any]] = field(default_factory=list)  # adaptive: PFI/CI after each round

    def points(self) -> pd.DataFrame:
        """One row per cap: plain means pooled over its visits, and standard errors.

        A cap's own SE rests on a handful of steps and can understate the noise by chance,
        which would stop the adaptive grid early; relative noise is much the same at every
        cap of one job, so each SE is the larger of the cap's own (AR(1)-corrected) and the
        one implied by the relative variance pooled over all caps (weighted by dof)."""
        rows = []
        for cap in self.caps:
            vs = [v.window for v in self.visits if v.cap_w == cap]
            p = (
                np.concatenate([np.asarray(w.power_samples, float) for w in vs])
                if vs
                else np.array([])
            )
            r = (
                np.concatenate([np.asarray(w.step_rates, float) for w in vs])
                if vs
                else np.array([])
            )
            rows.append(
                {
                    "cap_w": cap,
                    "n_visits": len(vs),
                    "n_samples": p.size,
                    "n_steps": r.size,
                    "measured_s": float(
                        sum(w.t_end_s - w.t_settled_s for w in vs if np.isfinite(w.t_settled_s))
                    ),
                    "power_w": p.mean() if p.size else np.nan,
                    "power_se_own_w": se_mean_ar1(p),
                    "tokens_per_s": r.mean() if r.size else np.nan,
                    "tokens_per_s_se_own": se_mean_ar1(r),
                }
            )
        df = pd.DataFrame(rows)
        for value, own, n, se in (
            ("power_w", "power_se_own_w", "n_samples", "power_se_w"),
            ("tokens_per_s", "tokens_per_s_se_own", "n_steps", "tokens_per_s_se"),
        ):
            rel_var = (df[own] / df[value]) ** 2 * df[n]  # per-sample relative variance (effective)
            dof = (df[n] - 1).clip(lower=0).where(rel_var.notna(), 0)
            pooled = float((rel_var.fillna(0) * dof).sum() / dof.sum()) if dof.sum() else np.nan
            df[se] = np.fmax(df[own], np.sqrt(pooled / df[n].where(df[n] > 0)) * df[value])
        return df

    def record(self) -> dict[str, Any]:
        """The sweep for run.json: mode, caps, stop reason, duration, visits and history."""
        return {
            "sweep_mode": self.mode,
            "caps": self.caps,
            "stop_reason": self.stop_reason,
            "duration_s": self.duration_s,
            "visits": [v.record() for v in self.visits],
            "history": self.history,
        }


def measure_at(
    run: LiveRun,
    cap_w: float,
    criteria: SteadyCriteria,
    protocol: SummaryProtocol,
    max_dwell_s: float,
    enough: Callable[[Window], bool] | None = None,
) -> Visit:
    """Set ``cap_w``, then advance the run until its window at this cap is steady and precise
    (and ``enough`` says so), the dwell limit passes or the run ends."""
    t_change = run.now_s
    enforced = run.device.set_cap(cap_w)
    while True:
        run.advance(run.poll_s)
        w = assess(run.series(), run.steps(), t_change, run.now_s, criteria, protocol)
        if w.done and (enough is None or enough(w)):
            return Visit(cap_w, enforced, w)
        out_of_time = run.now_s - t_change >= max_dwell_s
        if out_of_time or run.now_s + run.poll_s > run.max_duration_s:
            w.reason = ("max_dwell:" if out_of_time else "run_ended:") + w.reason
            return Visit(cap_w, enforced, w)


def staircase(
    run: LiveRun,
    caps: Sequence[float],
    criteria: SteadyCriteria = SteadyCriteria(),
    protocol: SummaryProtocol = SummaryProtocol(),
    max_dwell_s: float = _STAIRCASE["max_dwell_s"],
) -> Result:
    """Visit each cap once, lowest first; the original cap is restored however this ends."""
    result = Result("staircase", sorted(float(c) for c in caps))
    with restored_on_exit(run.device):
        for cap in result.caps:
            result.visits.append(measure_at(run, cap, criteria, protocol, max_dwell_s))
            if result.visits[-1].window.reason.startswith("run_ended"):
                result.stop_reason = "run_ended"
                break
        else:
            result.stop_reason = "all_caps_measured"
        run.stop()
    result.duration_s = run.now_s
    return result


def pfi_with_ci(
    points: pd.DataFrame, mc_samples: int = _STAIRCASE["mc_samples"], seed: int = _SEED
) -> tuple[float, float, float]:
    """(pfi_ratio, ci95_low, ci95_high) of pooled staircase points (``Result.points``)."""
    table = pfi_table(
        points.assign(group="g"),
        throughput_col="tokens_per_s",
        power_sem_col="power_se_w",
        throughput_sem_col="tokens_per_s_se",
        gpus_col=None,
        mc_samples=mc_samples,
        seed=seed,
    )
    row = table.iloc[0]
    return float(row["pfi_ratio"]), float(row["ci95_low"]), float(row["ci95_high"])


def variance_shares(points: pd.DataFrame) -> np.ndarray:
    """Each cap's contribution to var(pfi_ratio) by the delta method (numerical gradient)."""
    p, t = points["power_w"].to_numpy(float), points["tokens_per_s"].to_numpy(float)
    sp, st = points["power_se_w"].to_numpy(float), points["tokens_per_s_se"].to_numpy(float)
    base = pfi_ratio(p, t)
    out = np.zeros(len(points))
    for j in range(len(points)):
        for arr, se in ((p, sp), (t, st)):
            h = 1e-4 * arr[j]
            bumped = arr.copy()
            bumped[j] += h
            grad = ((pfi_ratio(bumped, t) if arr is p else pfi_ratio(p, bumped)) - base) / h
            out[j] += (grad * se[j]) ** 2 if np.isfinite(grad) and np.isfinite(se[j]) else 0.0
    return out


def adaptive(
    run: LiveRun,
    caps: Sequence[float],
    criteria: SteadyCriteria = SteadyCriteria(),
    protocol: SummaryProtocol = SummaryProtocol(),
    max_dwell_s: float = _STAIRCASE["max_dwell_s"],
    target_ci_rel: float = _STAIRCASE["target_ci_rel"],
    budget_s: float | None = None,
    mc_samples: int = _STAIRCASE["mc_samples"],
    seed: int = _SEED,
) -> Result:
    """The staircase pass, then revisit the cap that buys the most PFI precision per second
    until the CI half-width is at most ``target_ci_rel`` of the PFI, or the next revisit
    would end after ``budget_s`` of run time (the first pass always completes)."""
    budget_s = run.max_duration_s if budget_s is None else min(float(budget_s), run.max_duration_s)
    result = Result("adaptive", sorted(float(c) for c in caps))
    with restored_on_exit(run.device):
        for cap in result.caps:
            result.visits.append(measure_at(run, cap, criteria, protocol, max_dwell_s))
        while True:
            pts = result.points()
            pfi, lo, hi = pfi_with_ci(pts, mc_samples, seed)
            half = (
                (hi - lo) / 2 / abs(pfi)
                if np.isfinite([pfi, lo, hi]).all() and pfi
                else float("inf")
            )
            result.history.append(
                {
                    k: (v if np.isfinite(v) else None)
                    for k, v in dict(
                        t_s=run.now_s, pfi_ratio=pfi, ci95_low=lo, ci95_high=hi, ci_half_rel=half
                    ).items()
                }
            )
            if half <= target_ci_rel:
                result.stop_reason = "ci_target_met"
                break
            # Doubling cap j's data halves its variance share; it costs its measured time
            # again plus a settle and a lost step.
            gain = variance_shares(pts) / 2
            overhead = criteria.min_settle_s + 2 * run.poll_s + _step_seconds(result, pts)
            cost = pts["measured_s"].to_numpy() + overhead
            order = np.argsort(-gain / cost)
            fits = [j for j in order if gain[j] > 0 and run.now_s + cost[j] <= budget_s]
            if not fits:
                result.stop_reason = "budget_spent"
                break
            j = fits[0]
            goal_samples, goal_steps = int(pts["n_samples"].iloc[j]), int(pts["n_steps"].iloc[j])
            result.visits.append(
                measure_at(
                    run,
                    float(pts["cap_w"].iloc[j]),
                    criteria,
                    protocol,
                    min(max_dwell_s, budget_s - run.now_s),
                    enough=lambda w: w.n_samples >= goal_samples and w.n_steps >= goal_steps,
                )
            )
        run.stop()
    result.duration_s = run.now_s
    return result


def _step_seconds(result: Result, pts: pd.DataFrame) -> np.ndarray:
    """Typical step duration (s) at each cap, from the first visit's window."""
    out = []
    for cap in pts["cap_w"]:
        w = next(v.window for v in result.visits if v.cap_w == cap)
        n = max(w.n_steps, 1)
        out.append((w.t_end_s - w.t_settled_s) / n if np.isfinite(w.t_settled_s) else 0.0)
    return np.asarray(out)


# ---------------------------------------------------------------------------------------
# A group's sweep from the config: the run spec and the controller it asks for
# ---------------------------------------------------------------------------------------


def sweep_spec(cfg: dict[str, Any], group_id: str, mode: str) -> dict[str, Any]:
    """The run spec of a group's one-run sweep: ``config.run_spec`` of its uncapped run, with
    ``run_id`` = the mode, the cap grid and the ``staircase:`` settings."""
    if mode not in MODES:
        raise ValueError(f"unknown sweep mode {mode!r} (one of {', '.join(MODES)})")
    g = next(g for g in groups(cfg) if g["id"] == group_id)
    spec = run_spec(cfg, group_id, run_id(max(g["caps"]), 0))
    phases = {
        k: v for k, v in cfg["summary"].items() if k in ("train_util_threshold", "warmup_fb_gib")
    }
    spec.update(
        run_id=mode,
        sweep=mode,
        caps=list(g["caps"]),
        staircase=dict(cfg["staircase"]),
        phases=phases,
    )
    return spec


def run_controller(run: LiveRun, spec: RunSpec, caps: list[float], separate_s: float) -> Result:
    """The spec's controller (``sweep: staircase | adaptive``) on a live run of either backend."""
    settings = spec.sweep_settings
    if spec.sweep == "staircase":
        return staircase(run, caps, spec.steady, spec.phases, settings.max_dwell_s)
    return adaptive(
        run,
        caps,
        spec.steady,
        spec.phases,
        settings.max_dwell_s,
        settings.target_ci_rel,
        budget_s=settings.budget_fraction * separate_s,
        mc_samples=settings.mc_samples,
        seed=spec.seed,
    )


def sweep_record(spec: RunSpec, result: Result) -> dict[str, Any]:
    """The controller's part of run.json: its visits and stop reason, and the settings it ran with."""
    return {
        **result.record(),
        "criteria": spec.steady.__dict__,
        "settings": spec.sweep_settings.__dict__,
    }


def separate_sweep_seconds(spec: RunSpec) -> float:
    """Run time of the group's separate sweep: the one-run sweep never runs longer."""
    return len(spec.caps) * spec.duration_s
