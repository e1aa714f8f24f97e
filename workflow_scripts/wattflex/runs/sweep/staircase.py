"""A whole power-throughput curve in one run: the in-run staircase and the adaptive grid.

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
``set_cap(W) -> enforced W`` and ``restore()`` (``devices.emulated.EmulatedDevice``, the
NVML device), and a live run (``LiveRun``: ``now_s``, ``advance(dt)``, ``series()``,
``steps()``, ``stop()``). ``EmulatedRun`` is the emulated live run: it re-simulates from the
cap schedule so far and reveals data only up to ``now_s``, keeping what was already revealed
(the controller never sees the future, and the record is exactly what it saw).
``PollingRun`` is the live run of real training (``run_real_sweep``, ``backend: cuda``): it
sleeps and polls the NVML telemetry sampler and the trainer's live step log
(``steps.live.csv``); ``GpuSet`` makes a job's NVML GPUs one device. ``restored_on_exit``
restores the original cap on normal exit, on an exception and on SIGINT/SIGTERM/SIGHUP
(inside ``caps.CapGuard`` on real GPUs, which adds the state file for restores after a
SIGKILL).
"""

from __future__ import annotations

import contextlib
import io
import signal
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator, Protocol, Sequence

import numpy as np
import pandas as pd

from wattflex.runs.devices.caps import CapError, CapSignal, restore_each
from wattflex.runs.sweep.steady import SteadyCriteria, Window, assess, se_mean_ar1
from wattflex.telemetry import SummaryProtocol, job_series

MODES = ("staircase", "adaptive")


# ---------------------------------------------------------------------------------------
# Interfaces and the restore guarantee
# ---------------------------------------------------------------------------------------

class CapDevice(Protocol):
    def set_cap(self, cap_w: float) -> float: ...
    def restore(self) -> None: ...


class LiveRun(Protocol):
    device: CapDevice
    now_s: float
    poll_s: float
    max_duration_s: float

    def advance(self, dt_s: float) -> None: ...
    def series(self) -> pd.DataFrame: ...
    def steps(self) -> pd.DataFrame: ...
    def stop(self) -> None: ...


RESTORE_SIGNALS = tuple(getattr(signal, s) for s in ("SIGINT", "SIGTERM", "SIGHUP") if hasattr(signal, s))


@contextlib.contextmanager
def restored_on_exit(device: CapDevice, signals: Sequence[int] = RESTORE_SIGNALS) -> Iterator[CapDevice]:
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


class GpuSet:
    """A job's GPUs as one ``CapDevice``: the same cap on each (the enforced limit reported
    is the lowest read back); restore tries every GPU and then reports any that failed."""

    def __init__(self, gpus: Sequence[CapDevice]) -> None:
        self.gpus = list(gpus)

    def set_cap(self, cap_w: float) -> float:
        return min(g.set_cap(cap_w) for g in self.gpus)

    def restore(self) -> None:
        errors = restore_each(self.gpus)
        if errors:
            raise CapError("could not restore every power limit: " + "; ".join(errors))


# ---------------------------------------------------------------------------------------
# The controller
# ---------------------------------------------------------------------------------------

@dataclass
class Visit:
    cap_w: float
    enforced_w: float
    window: Window

    def record(self) -> dict[str, Any]:
        return {"cap_w": self.cap_w, "enforced_limit_w": self.enforced_w, **self.window.record()}


@dataclass
class Result:
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
            p = np.concatenate([np.asarray(w.power_samples, float) for w in vs]) if vs else np.array([])
            r = np.concatenate([np.asarray(w.step_rates, float) for w in vs]) if vs else np.array([])
            rows.append({"cap_w": cap, "n_visits": len(vs), "n_samples": p.size, "n_steps": r.size,
                         "measured_s": float(sum(w.t_end_s - w.t_settled_s for w in vs if np.isfinite(w.t_settled_s))),
                         "power_w": p.mean() if p.size else np.nan, "power_se_own_w": se_mean_ar1(p),
                         "tokens_per_s": r.mean() if r.size else np.nan, "tokens_per_s_se_own": se_mean_ar1(r)})
        df = pd.DataFrame(rows)
        for value, own, n, se in (("power_w", "power_se_own_w", "n_samples", "power_se_w"),
                                  ("tokens_per_s", "tokens_per_s_se_own", "n_steps", "tokens_per_s_se")):
            rel_var = (df[own] / df[value]) ** 2 * df[n]  # per-sample relative variance (effective)
            dof = (df[n] - 1).clip(lower=0).where(rel_var.notna(), 0)
            pooled = float((rel_var.fillna(0) * dof).sum() / dof.sum()) if dof.sum() else np.nan
            df[se] = np.fmax(df[own], np.sqrt(pooled / df[n].where(df[n] > 0)) * df[value])
        return df

    def record(self) -> dict[str, Any]:
        return {"sweep_mode": self.mode, "caps": self.caps, "stop_reason": self.stop_reason,
                "duration_s": self.duration_s, "visits": [v.record() for v in self.visits],
                "history": self.history}


def measure_at(run: LiveRun, cap_w: float, criteria: SteadyCriteria, protocol: SummaryProtocol,
               max_dwell_s: float, enough: Callable[[Window], bool] | None = None) -> Visit:
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


def staircase(run: LiveRun, caps: Sequence[float], criteria: SteadyCriteria = SteadyCriteria(),
              protocol: SummaryProtocol = SummaryProtocol(), max_dwell_s: float = 900.0) -> Result:
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


def pfi_with_ci(points: pd.DataFrame, mc_samples: int = 2000, seed: int = 0) -> tuple[float, float, float]:
    """(pfi_ratio, ci95_low, ci95_high) of pooled staircase points (``Result.points``)."""
    from wattflex.analysis.pfi import pfi_table

    table = pfi_table(points.assign(group="g"), throughput_col="tokens_per_s", power_sem_col="power_se_w",
                      throughput_sem_col="tokens_per_s_se", gpus_col=None, mc_samples=mc_samples, seed=seed)
    row = table.iloc[0]
    return float(row["pfi_ratio"]), float(row["ci95_low"]), float(row["ci95_high"])


def variance_shares(points: pd.DataFrame) -> np.ndarray:
    """Each cap's contribution to var(pfi_ratio) by the delta method (numerical gradient)."""
    from wattflex.analysis.pfi import pfi_ratio

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


def adaptive(run: LiveRun, caps: Sequence[float], criteria: SteadyCriteria = SteadyCriteria(),
             protocol: SummaryProtocol = SummaryProtocol(), max_dwell_s: float = 900.0,
             target_ci_rel: float = 0.02, budget_s: float | None = None, mc_samples: int = 2000,
             seed: int = 0) -> Result:
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
            half = (hi - lo) / 2 / abs(pfi) if np.isfinite([pfi, lo, hi]).all() and pfi else float("inf")
            result.history.append({k: (v if np.isfinite(v) else None) for k, v in dict(
                t_s=run.now_s, pfi_ratio=pfi, ci95_low=lo, ci95_high=hi, ci_half_rel=half).items()})
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
            result.visits.append(measure_at(
                run, float(pts["cap_w"].iloc[j]), criteria, protocol, min(max_dwell_s, budget_s - run.now_s),
                enough=lambda w: w.n_samples >= goal_samples and w.n_steps >= goal_steps))
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
# Live runs: emulated, and the polling hook for real ones
# ---------------------------------------------------------------------------------------

class EmulatedRun:
    """An emulated training run that the controller steers while it runs.

    The emulator simulates a whole trace from a cap schedule; here the schedule grows as
    the controller sets caps at ``now_s``. After each change the run is re-simulated from
    the new schedule (same seeds: per-run factors, silicon and step noise are unchanged),
    and only the part after the change is taken from it: everything revealed before stays
    as it was seen. Telemetry settles after a change with the emulator's transient.
    """

    def __init__(self, spec: dict[str, Any], max_duration_s: float) -> None:
        from wattflex.runs.devices.emulated import EmulatedDevice
        from wattflex.runs.emulator import GPUS

        run_cfg = dict(spec.get("run", {}))
        run_cfg["duration_s"] = float(max_duration_s)
        self.spec = {**spec, "run": run_cfg}
        self.max_duration_s = float(max_duration_s)
        self.poll_s = float(run_cfg.get("sample_period_s", 5))
        self.now_s = 0.0
        self.stopped_s: float | None = None
        run = self

        class Device(EmulatedDevice):
            """The virtual GPUs' power-limit interface; a change takes effect at ``now_s``."""

            def set_cap(self, cap_w: float) -> float:
                enforced = super().set_cap(cap_w)
                run._on_cap(self.limit_w)
                return enforced

            def restore(self) -> None:
                super().restore()
                run._on_cap(self.limit_w)

        self.device = Device(GPUS[spec["group"].get("gpu", "H200")])
        self._schedule: list[tuple[float, float]] = [(0.0, float(self.device.limit_w))]
        self._frozen: list[tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame]] = []  # (tel, steps, series)
        self._frozen_until = 0.0
        self._sim: tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame, dict[str, Any]] | None = None
        self._cache: dict[str, Any] = {}

    # -- the controller's view ------------------------------------------------------------
    def advance(self, dt_s: float) -> None:
        if self.stopped_s is not None:
            raise RuntimeError("the run has stopped")
        self.now_s = min(self.now_s + float(dt_s), self.max_duration_s)

    def series(self) -> pd.DataFrame:
        return self._revealed()[2]

    def steps(self) -> pd.DataFrame:
        return self._revealed()[1]

    def stop(self) -> None:
        if self.stopped_s is None:
            self.stopped_s = self.now_s

    # -- the record -----------------------------------------------------------------------
    def artifacts(self) -> tuple[pd.DataFrame, pd.DataFrame, dict[str, Any]]:
        """Telemetry, step log and run facts of what ran, up to the stop."""
        tel, steps, _ = self._revealed()
        tel = tel.sort_values(["t_s", "node", "gpu"]).reset_index(drop=True)
        dt = np.diff(np.r_[0.0, np.unique(tel["t_s"].to_numpy())]).mean() if len(tel) else self.poll_s
        tel["energy_j"] = tel.groupby(["node", "gpu"])["power_w"].cumsum() * dt  # continuous across splices
        facts = dict(self._current()[3])
        end = self.now_s
        facts["cap_schedule"] = [{"t_s": t, "cap_w": c} for t, c in self._schedule if t <= end]
        facts["events"] = [e for e in facts.get("events", []) if e["t_s"] < end]
        facts["n_steps"] = int(len(steps))
        facts["duration_s"] = end
        for k in ("enforced_limit_w", "model_tokens_per_s", "model_power_w"):
            facts[k] = facts.get(k, [])[: len(facts["cap_schedule"])]
        facts["limit_restored_w"] = float(self.device.limit_w)
        return tel, steps.reset_index(drop=True), facts

    # -- machinery ------------------------------------------------------------------------
    def _on_cap(self, cap_w: float) -> None:
        if self._schedule[-1][1] == cap_w:
            return
        if self.now_s > self._frozen_until:
            tel, steps, series = self._window(self._current(), self._frozen_until, self.now_s)
            self._frozen.append((tel, steps, series))
            self._frozen_until = self.now_s
        self._schedule = [(t, c) for t, c in self._schedule if t < self.now_s] + [(self.now_s, float(cap_w))]
        self._sim, self._cache = None, {}

    def _current(self) -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame, dict[str, Any]]:
        if self._sim is None:
            from wattflex.runs.devices.emulated import run_emulated

            tel, steps, facts = run_emulated({**self.spec, "cap_schedule": self._schedule})
            self._sim = (tel, steps, job_series(tel), facts)
        return self._sim

    @staticmethod
    def _window(sim: tuple, t0: float, t1: float) -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame]:
        tel, steps, series = sim[0], sim[1], sim[2]
        return (tel[(tel["t_s"] > t0) & (tel["t_s"] <= t1)], steps[(steps["t_end_s"] > t0) & (steps["t_end_s"] <= t1)],
                series[(series["t_s"] > t0) & (series["t_s"] <= t1)])

    def _revealed(self) -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame]:
        end = self.now_s if self.stopped_s is None else self.stopped_s
        if self._cache.get("t") != end:
            parts = self._frozen + [self._window(self._current(), self._frozen_until, end)]
            self._cache = {"t": end, "data": tuple(pd.concat([p[i] for p in parts], ignore_index=True)
                                                   for i in range(3))}
        return self._cache["data"]


class PollingRun:
    """The live-run hook for real training: wall-clock time, a telemetry source and the
    trainer's step log, read while the job runs.

    ``read_series()`` returns the job-level series so far (``telemetry.job_series`` of the
    sampler's rows), ``read_steps()`` the step log so far (``step, t_end_s, tokens, loss`` on
    the sampler's clock), ``stop_training()`` ends the job. ``device`` is the NVML device
    (or any ``CapDevice``) of the job's GPUs. ``ended()`` (optional) says the job has
    finished by itself (it raises if the job failed): the run then ends now, so the
    controller stops waiting for data that will not come. ``clock``/``sleep`` are
    injectable for tests.
    """

    def __init__(self, device: CapDevice, read_series: Callable[[], pd.DataFrame],
                 read_steps: Callable[[], pd.DataFrame], stop_training: Callable[[], None],
                 max_duration_s: float, poll_s: float = 5.0, t0: float | None = None,
                 clock: Callable[[], float] = time.monotonic, sleep: Callable[[float], None] = time.sleep,
                 ended: Callable[[], bool] | None = None) -> None:
        self.device, self.poll_s, self.max_duration_s = device, float(poll_s), float(max_duration_s)
        self._read_series, self._read_steps, self._stop = read_series, read_steps, stop_training
        self._clock, self._sleep, self._ended = clock, sleep, ended
        self._t0 = clock() if t0 is None else t0

    @property
    def now_s(self) -> float:
        return self._clock() - self._t0

    def advance(self, dt_s: float) -> None:
        self._sleep(max(0.0, min(dt_s, self.max_duration_s - self.now_s)))
        if self._ended is not None and self._ended():
            self.max_duration_s = min(self.max_duration_s, self.now_s)

    def series(self) -> pd.DataFrame:
        return self._read_series()

    def steps(self) -> pd.DataFrame:
        return self._read_steps()

    def stop(self) -> None:
        self._stop()


# ---------------------------------------------------------------------------------------
# One group's sweep in one run, and its per-cap rows in the runs.parquet contract
# ---------------------------------------------------------------------------------------

@dataclass(frozen=True)
class SweepSettings:
    """Config ``staircase:`` (steady-state criteria are read from the same section)."""
    max_dwell_s: float = 900.0       # give up waiting for one cap after this long
    target_ci_rel: float = 0.02      # adaptive: stop at a PFI 95 % CI half-width of 2 %
    budget_fraction: float = 0.10    # adaptive: revisits end by this fraction of a separate sweep's run time
    mc_samples: int = 2000           # adaptive: Monte Carlo samples of each CI check

    @classmethod
    def from_config(cls, cfg: dict[str, Any] | None) -> "SweepSettings":
        return cls(**{k: v for k, v in (cfg or {}).items() if k in cls.__dataclass_fields__})


def sweep_spec(cfg: dict[str, Any], group_id: str, mode: str) -> dict[str, Any]:
    """The run spec of a group's one-run sweep: ``config.run_spec`` of its uncapped run, with
    ``run_id`` = the mode, the cap grid and the ``staircase:`` settings."""
    from wattflex.config import groups, run_id, run_spec

    if mode not in MODES:
        raise ValueError(f"unknown sweep mode {mode!r} (one of {', '.join(MODES)})")
    g = next(g for g in groups(cfg) if g["id"] == group_id)
    spec = run_spec(cfg, group_id, run_id(max(g["caps"]), 0))
    phases = {k: v for k, v in cfg.get("summary", {}).items() if k in ("train_util_threshold", "warmup_fb_gib")}
    spec.update(run_id=mode, sweep=mode, caps=list(g["caps"]), staircase=dict(cfg.get("staircase", {})),
                phases=phases)
    return spec


def _control(run: LiveRun, spec: dict[str, Any], caps: list[float], separate_s: float) -> Result:
    """The spec's controller (``sweep: staircase | adaptive``) on a live run of either backend."""
    protocol = SummaryProtocol.from_config(spec.get("phases"))
    criteria = SteadyCriteria.from_config(spec.get("staircase"))
    settings = SweepSettings.from_config(spec.get("staircase"))
    if spec["sweep"] == "staircase":
        return staircase(run, caps, criteria, protocol, settings.max_dwell_s)
    return adaptive(run, caps, criteria, protocol, settings.max_dwell_s, settings.target_ci_rel,
                    budget_s=settings.budget_fraction * separate_s, mc_samples=settings.mc_samples,
                    seed=int(spec.get("seed", 0)))


def _sweep_facts(spec: dict[str, Any], result: Result) -> dict[str, Any]:
    return {**result.record(), "criteria": SteadyCriteria.from_config(spec.get("staircase")).__dict__,
            "settings": SweepSettings.from_config(spec.get("staircase")).__dict__}


def _separate_seconds(spec: dict[str, Any]) -> float:
    """Run time of the group's separate sweep: the one-run sweep never runs longer."""
    return len(spec["caps"]) * float(spec.get("run", {}).get("duration_s", 1800))


def run_sweep(spec: dict[str, Any]) -> tuple[pd.DataFrame, pd.DataFrame, dict[str, Any]]:
    """Run one group's whole sweep in one run: telemetry, step log and the run record
    (run facts + the controller's visits). ``backend: cuda`` runs ``run_real_sweep`` in a
    scratch directory and reads its files back (``write_sweep_run`` keeps them, train.log too)."""
    if spec["backend"] == "cuda":
        from wattflex.provenance import read_json, read_parquet

        with tempfile.TemporaryDirectory(prefix="wattflex-sweep-") as tmp:
            run_real_sweep(spec, tmp)
            return (read_parquet(Path(tmp) / "telemetry.parquet"), read_parquet(Path(tmp) / "steps.parquet"),
                    read_json(Path(tmp) / "run.json"))
    if spec["backend"] != "emulated":
        raise ValueError(f"unknown backend {spec['backend']!r} (emulated | cuda)")
    caps = [float(c) for c in spec["caps"]]
    run = EmulatedRun(spec, max_duration_s=_separate_seconds(spec))
    result = _control(run, spec, caps, _separate_seconds(spec))
    tel, steps, facts = run.artifacts()
    record = {**facts, **_sweep_facts(spec, result), "original_limit_w": float(run.device.original_limit_w)}
    return tel, steps, record


def write_sweep_run(spec: dict[str, Any], outdir: str | Path) -> Path:
    """``run_sweep`` and its files (telemetry.parquet, steps.parquet, run.json; train.log on
    the cuda backend) written atomically into ``outdir`` (``runner.atomic_run_dir``)."""
    from wattflex.runs.runner import atomic_run_dir, write_run_files

    with atomic_run_dir(outdir) as tmp:
        if spec["backend"] == "cuda":
            run_real_sweep(spec, tmp)
        else:
            tel, steps, record = run_sweep(spec)
            write_run_files(tmp, spec, tel, steps, record, cap_w=max(spec["caps"]), repeat=0)
    return Path(outdir)


# ---------------------------------------------------------------------------------------
# The real backend: one training run on NVML GPUs, steered while it runs
# ---------------------------------------------------------------------------------------

STOP_GRACE_S = 300.0  # a stop waits for the current step, or an eval/checkpoint in progress


def read_live_steps(path: str | Path) -> pd.DataFrame:
    """The trainer's live step log so far (``step, t_end_s, tokens, loss``): complete lines
    only, as the last one may be half-written while it is read."""
    try:
        text = Path(path).read_text()
    except FileNotFoundError:
        text = ""
    text = text[: text.rfind("\n") + 1]
    if text.count("\n") < 2:  # header only, or nothing yet
        return pd.DataFrame({c: pd.Series(dtype=float) for c in ("step", "t_end_s", "tokens", "loss")})
    return pd.read_csv(io.StringIO(text))


class _Training:
    """The torchrun training process of a real sweep, seen from the controller."""

    def __init__(self, proc: Any, log_path: Path, outdir: Path) -> None:
        from wattflex.runs.training.loop import LIVE_STEPS_FILE, STOP_FILE

        self.proc, self.log_path = proc, log_path
        self.live_path, self.stop_path = outdir / LIVE_STEPS_FILE, outdir / STOP_FILE

    def ended(self) -> bool:
        """True once training has exited by itself; raises with the root cause if it failed."""
        from wattflex.runs.real_run import training_error

        rc = self.proc.poll()
        if rc is not None and rc != 0:
            raise training_error(rc, self.log_path)
        return rc is not None

    def steps(self) -> pd.DataFrame:
        return read_live_steps(self.live_path)

    def request_stop(self) -> None:
        self.stop_path.touch()  # rank 0 ends the loop after the current step and writes its files

    def wait_first_step(self, timeout_s: float, poll_s: float) -> None:
        """Start-up (model load, first step) is paid before the controller's clock starts."""
        deadline = time.monotonic() + timeout_s
        while self.steps().empty and not self.ended():
            if time.monotonic() > deadline:
                raise RuntimeError(f"no training step within {timeout_s:g} s (see {self.log_path})")
            time.sleep(poll_s)

    def finish(self, grace_s: float = STOP_GRACE_S) -> None:
        """Wait for the stopped training to write its outputs; raise if it failed."""
        import subprocess

        from wattflex.runs.real_run import training_error

        try:
            rc = self.proc.wait(grace_s)
        except subprocess.TimeoutExpired as exc:
            raise RuntimeError(f"training did not stop within {grace_s:g} s of the stop request "
                               f"(see {self.log_path})") from exc
        if rc != 0:
            raise training_error(rc, self.log_path)


def run_real_sweep(spec: dict[str, Any], outdir: str | Path) -> None:
    """``backend: cuda``: one real training run (torchrun, as ``real_run``) whose NVML GPUs the
    controller steps through the cap grid, reading the sampler's telemetry and the trainer's
    live step log while it runs; training is stopped when the sweep ends. Everything runs
    inside ``caps.CapGuard`` (state file, signals, atexit) around ``restored_on_exit``, so
    the original limits come back on every exit path. Writes telemetry.parquet,
    steps.parquet, run.json (real_run's record + the controller's) and train.log.

    Needs caps that can change (``cuda.cap_control: nvml | command``), the NVML sampler
    (``cuda.sampler: true``) and one node (``nnodes: 1``)."""
    from wattflex.runs.devices import caps as cap_control
    from wattflex.runs.devices.base import check_cap
    from wattflex.runs.real_run import NodeSetup, RunOptions, assemble, start_training, terminate, utc_now
    from wattflex.runs.training.config import TrainConfig

    outdir = Path(outdir)
    outdir.mkdir(parents=True, exist_ok=True)
    opts = RunOptions.from_spec(spec)
    if opts.cap_control == "observe" or not opts.sampler:
        raise ValueError(f"sweep: {spec['sweep']} on the cuda backend steps the GPUs' power caps and reads "
                         f"their power: it needs cuda.cap_control nvml or command (got {opts.cap_control}) "
                         f"and cuda.sampler: true (got {opts.sampler}); use sweep: separate otherwise")
    if opts.nnodes != 1:
        raise NotImplementedError(f"sweep: {spec['sweep']} on the cuda backend runs on one node "
                                  f"(nnodes {opts.nnodes}); use sweep: separate for multi-node jobs")
    caps = sorted(float(c) for c in spec["caps"])
    separate_s = _separate_seconds(spec)
    # Training may run as long as the separate sweep would; the controller stops it sooner.
    train_spec = {**spec, "run": {**spec.get("run", {}), "duration_s": separate_s}}
    TrainConfig.from_spec(train_spec, outdir).validate()       # missing model/data: fail before any cap
    start_utc, t0 = utc_now(), time.time()
    node = NodeSetup.open(spec, outdir, opts, t0, train_spec=train_spec)
    if not node.gpus:
        raise RuntimeError("no NVML GPU to sweep")
    for gpu in node.gpus:                                        # refuse a bad grid before any cap
        for cap in caps:
            check_cap(gpu, cap)
    n_gpus = len(node.gpus)
    # The guard sets the lowest cap, where the staircase starts (so warm-up lands there too).
    guard = cap_control.CapGuard(node.gpus, caps[0], opts.cap_control, opts.state_dir, opts.cap_command)
    with guard:
        node.facts["gpus_after_set"] = [g.describe() for g in node.gpus]
        sampler = node.sampler().start()
        proc = None
        try:
            proc = start_training(node.cmd, node.log_path)
            training = _Training(proc, node.log_path, outdir)
            training.wait_first_step(separate_s, opts.sampler_period_s)

            def series() -> pd.DataFrame:
                s = job_series(sampler.frame())
                return s[s["n_gpus"] == n_gpus].reset_index(drop=True)  # not a sample read half-way

            run = PollingRun(GpuSet(node.gpus), series, training.steps, training.request_stop,
                             max_duration_s=separate_s, poll_s=opts.sampler_period_s, t0=t0, clock=time.time,
                             ended=training.ended)
            result = _control(run, spec, caps, separate_s)
            training.finish()
        finally:
            if proc is not None:
                terminate(proc)
            sampler.stop()
        node.facts["gpus_before_restore"] = [g.describe() for g in node.gpus]
    node.finish(guard, sampler)
    assemble(spec, outdir, opts, [node.facts], t0, start_utc, utc_now(), extra=_sweep_facts(spec, result))
