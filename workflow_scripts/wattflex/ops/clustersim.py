"""A cluster of emulated GPUs under a grid curtailment signal, controlled closed-loop.

**Jobs.** Training jobs drawn from a campaign's sweep groups arrive (Poisson, mean gap
``mean_interarrival_s``; the cluster starts full, its jobs part-way through), wait in a
FIFO queue for free GPUs, run for a log-normal wall-clock duration and leave. A job spends
``startup_s`` loading (near-idle power, no tokens), then trains, with a checkpoint pause of
``checkpoint_s`` every ``checkpoint_every_s``. The schedule depends only on the seed, so
every policy faces the same jobs; tokens differ. Arrivals and departures happen on control
period boundaries.

**Physics.** A training job at per-GPU cap ``c`` draws the power and delivers the tokens/s
of :func:`wattflex.runs.emulator.step.job_at_cap` for its group (same virtual nodes as the campaign's
runs), precomputed for every cap on the ``cap_step_w`` grid (:func:`truth_table`). After a
change (cap or phase) power approaches its new level with the firmware's time constant
(``runs.emulator.device.SETTLE_TAU_S``); on top, per-job AR(1) fluctuation (``power_noise``
per GPU), held under ``1.01 * cap`` as the firmware does. GPUs without a job draw idle power.
Everything is vectorised over (policy, job slot) and stepped in 1-s increments.

**Budget.** The signal gives a fraction of a basis: ``baseline`` (what the cluster would
draw uncapped, its running jobs' uncapped power plus idle GPUs, when the event starts,
held through the event: a demand-response baseline), ``uncapped`` (the same, following
the jobs as they come and go) or ``nominal`` (``nominal_w``). A fraction >= 1 is no event
(no budget). Compliance is judged against the *required* budget: the highest budget of the
last ``response_s`` seconds, so a cut must be met within ``response_s`` and a release is
usable at once. An event's ramp limit bounds the budget and, as on a real node, every cap
step of the controllers and the oracle (:func:`wattflex.ops.controller.ramp_caps`).

**Controllers.** Every policy of :mod:`wattflex.ops.controller` runs in its own copy of the
cluster, reading that copy's telemetry (period means; tokens/s with ``tokens_noise``) and
setting its caps. Two references run beside them: the **oracle**, the exact throughput-
maximising allocation (:func:`wattflex.allocation.allocator.allocate`, ``oracle``) on the *true*
curves with the exact cap -> power map and the signal known ahead (it moves one settling
time before a cut), under the same margin and reservations; and **uncapped**, no control
at all (the tokens a cut costs). Jobs running at t = 0 declare nothing: the controllers
read their profile from their uncapped telemetry before the event (``initial_profiles``);
an arriving job declares the uncapped telemetry of a previous run (``profile_noise``).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields
from typing import Any

import numpy as np
import pandas as pd
from scipy.ndimage import maximum_filter1d

from wattflex.allocation.allocator import allocate
from wattflex.allocation.curves import Curves
from wattflex.allocation.oracle import interp
from wattflex.gpus import DEFAULT_GPU, GPUS
from wattflex.ops.controller import (
    ControlConfig,
    Controller,
    JobTable,
    Readings,
    curve_pfi,
    pfi_from_model,
    ramp_caps,
)
from wattflex.ops.events import Schedule, Signal, ramp_at, read_schedule
from wattflex.pfi_model import dcgm_metrics, is_fitted, predict
from wattflex.policies import baseline, get, names, optimum, unlimited
from wattflex.runs.emulator.device import SETTLE_TAU_S, hardware_seed, stable_seed, steady_temp_c
from wattflex.runs.emulator.physics import PHYSICS, Physics
from wattflex.runs.emulator.step import JobSpec, gpu_leakages, job_at_caps, memory_footprint_gib
from wattflex.schema import section_defaults

log = logging.getLogger("wattflex.ops.clustersim")

# Per (group, cap) truth; the activity metrics are what a predictor of any feature set
# (wattflex.pfi_model.dcgm_metrics, from the metric registry) may ask of a job's
# uncapped profile. Their order is the order declared_profiles draws their noise in: kept as
# it was (the seeded study's numbers stay the same), a metric new to the registry drawn last.
_DRAW_ORDER = (
    "dram_active",
    "mem_copy_util",
    "sm_active",
    "gpu_util",
    "tensor_active",
    "sm_clock_mhz",
    "mem_clock_mhz",
    "power_per_gpu_w",
    "fb_used_gib",
    "temp_c",
)
TABLE_METRICS = [
    "power_w",
    "tokens_per_s",
    *sorted(
        dcgm_metrics(), key=lambda m: _DRAW_ORDER.index(m) if m in _DRAW_ORDER else len(_DRAW_ORDER)
    ),
]
STARTUP_EXTRA_W = 15.0  # per GPU above idle while weights load (emulated backend's start-up phase)
CHECKPOINT_EXTRA_W = 30.0  # per GPU above idle while a checkpoint is written
CHECKPOINT_UTIL = 4.0


# ---------------------------------------------------------------------------------------
# Truth: each group's steady state at every cap of the grid
# ---------------------------------------------------------------------------------------


def truth_table(
    groups: Sequence[Mapping[str, Any]],
    seed: int,
    cap_step_w: float = section_defaults("control")["cap_step_w"],
    physics: Physics = PHYSICS,
) -> pd.DataFrame:
    """One row per (group, cap): job power, tokens/s and mean activity from ``job_at_caps``.

    ``groups``: config groups (``wattflex.config.groups``) each with its ``model_facts``.
    The GPUs' silicon variation is the campaign's (same hardware seed as its runs); ``physics``
    the campaign's emulator (its calibration file's, ``emulator.calibration``, if it has one).
    """
    rows = []
    for g in groups:
        gpu = GPUS[g.get("gpu", DEFAULT_GPU)]
        job = JobSpec.from_config(g, g["model_facts"])
        leak = gpu_leakages(hardware_seed(seed, g["id"]), job.gpus, physics)
        caps = [float(c) for c in np.arange(gpu.min_limit_w, gpu.max_limit_w + 1e-9, cap_step_w)]
        # every cap at once: each GPU's (cap-independent) operating points computed once
        for cap, st in zip(caps, job_at_caps(job, gpu, caps, leak, physics=physics)):
            mean = lambda a: float(np.mean([getattr(o, a) for o in st.per_gpu]))  # noqa: E731
            rows.append(
                {
                    "group": g["id"],
                    "cap_w": float(cap),
                    "gpus": job.gpus,
                    "gpu": gpu.name,
                    "task": g["task"],
                    "cluster": g.get("cluster", ""),
                    "min_cap_w": gpu.min_limit_w,
                    "max_cap_w": gpu.max_limit_w,
                    "idle_w": gpu.idle_w,
                    "power_w": st.power_w,
                    "tokens_per_s": st.tokens_per_s,
                    "mem_clock_mhz": gpu.mem_clock_mhz,
                    "power_per_gpu_w": st.power_w / job.gpus,
                    "fb_used_gib": memory_footprint_gib(job, gpu, physics),
                    "temp_c": steady_temp_c(st.power_w / job.gpus),
                    **{
                        m: mean(m)
                        for m in (
                            "dram_active",
                            "mem_copy_util",
                            "sm_active",
                            "gpu_util",
                            "tensor_active",
                            "sm_clock_mhz",
                        )
                    },
                }
            )
    return pd.DataFrame(rows)


@dataclass
class Tables:
    """The truth table as arrays: groups (G rows) x caps (C)."""

    groups: pd.DataFrame
    cap_w: np.ndarray
    metrics: dict[str, np.ndarray]

    @classmethod
    def from_frame(cls, df: pd.DataFrame) -> Tables:
        caps = np.sort(df["cap_w"].unique())
        if len(caps) < 2 or not np.allclose(np.diff(caps), caps[1] - caps[0]):
            raise ValueError(
                "truth table: caps must be one evenly spaced grid shared by all groups"
            )
        groups = (
            df.groupby("group", sort=False)
            .first()
            .reset_index()[
                ["group", "gpus", "gpu", "task", "cluster", "min_cap_w", "max_cap_w", "idle_w"]
            ]
        )
        wide = {
            m: df.pivot(index="group", columns="cap_w", values=m).reindex(
                index=groups["group"], columns=caps
            )
            for m in TABLE_METRICS
        }
        if any(w.isna().any().any() for w in wide.values()):
            raise ValueError("truth table: every group needs every cap of the grid")
        return cls(groups, caps, {m: w.to_numpy(float) for m, w in wide.items()})

    @property
    def step_w(self) -> float:
        return float(self.cap_w[1] - self.cap_w[0])

    def index(self, cap_w: np.ndarray) -> np.ndarray:
        """Grid index of a cap (NaN -> the top: a GPU left at its default limit)."""
        c = np.where(np.isfinite(cap_w), cap_w, self.cap_w[-1])
        return np.clip(
            np.rint((c - self.cap_w[0]) / self.step_w).astype(int), 0, len(self.cap_w) - 1
        )


# ---------------------------------------------------------------------------------------
# Configuration
# ---------------------------------------------------------------------------------------


def _flat_cluster(cfg: Mapping[str, Any]) -> dict[str, Any]:
    """``control.cluster`` with its ``duration:`` mapping as ClusterConfig's ``duration_*`` fields."""
    flat = {}
    for key, val in cfg.items():
        if key == "duration":
            flat.update({f"duration_{k}": v for k, v in val.items()})
        else:
            flat[key] = val
    return flat


_CLUSTER = _flat_cluster(section_defaults("control", "cluster"))
# a scenario's defaults (control.scenarios.<name>, a mapping of any names)
_SCENARIO = section_defaults("control", "scenarios", "*")


@dataclass
class ClusterConfig:
    """The simulated cluster and its job stream (config ``control.cluster``; defaults: the schema's)."""

    gpus: int = _CLUSTER["gpus"]
    mix: str = _CLUSTER["mix"]  # random (uniform over groups) | production
    pretraining_fraction: float = _CLUSTER[
        "pretraining_fraction"
    ]  # production mix: share of pretraining jobs
    mean_interarrival_s: float = _CLUSTER["mean_interarrival_s"]
    duration_median_s: float = _CLUSTER["duration_median_s"]
    duration_sigma: float = _CLUSTER["duration_sigma"]
    duration_min_s: float = _CLUSTER["duration_min_s"]
    duration_max_s: float = _CLUSTER["duration_max_s"]
    startup_s: float = _CLUSTER["startup_s"]
    checkpoint_every_s: float = _CLUSTER["checkpoint_every_s"]
    checkpoint_s: float = _CLUSTER["checkpoint_s"]
    power_noise: float = _CLUSTER["power_noise"]  # per-GPU power fluctuation sd (AR(1), 5 s)
    tokens_noise: float = _CLUSTER["tokens_noise"]  # sd of one period's measured tokens/s
    profile_noise: float = _CLUSTER[
        "profile_noise"
    ]  # sd of a declared profile (a previous run's uncapped telemetry)
    initial_profiles: str = _CLUSTER[
        "initial_profiles"
    ]  # jobs running at t=0: observed live | declared

    @classmethod
    def from_dict(cls, cfg: Mapping[str, Any] | None) -> ClusterConfig:
        flat = _flat_cluster(dict(cfg or {}))
        unknown = set(flat) - {f.name for f in fields(cls)}
        if unknown:
            raise ValueError(f"unknown control.cluster key(s): {', '.join(sorted(unknown))}")
        out = cls(**flat)
        if out.mix not in ("random", "production") or out.initial_profiles not in (
            "observed",
            "declared",
        ):
            raise ValueError(
                "control.cluster: mix is random|production, initial_profiles observed|declared"
            )
        return out


@dataclass
class Scenario:
    """One curtailment event (config ``control.scenarios.<name>``)."""

    name: str
    signal: Signal | Schedule  # anything with budget(t, basis_w) and active(t)
    basis: str = "baseline"
    nominal_w: float | None = None
    response_s: float = _SCENARIO["response_s"]
    tail_s: float = 0.0  # simulated past the signal's end (an event's ramp back and restore)
    # telemetry outages: [{start_s, duration_s, fraction}] of jobs whose feed goes stale
    telemetry_dropouts: list[dict[str, float]] = field(default_factory=list)

    def __post_init__(self) -> None:
        if self.basis not in ("baseline", "uncapped", "nominal"):
            raise ValueError(f"scenario {self.name}: basis must be baseline, uncapped or nominal")
        if self.basis == "nominal" and not self.nominal_w:
            raise ValueError(f"scenario {self.name}: basis nominal needs nominal_w")


# ---------------------------------------------------------------------------------------
# The job stream
# ---------------------------------------------------------------------------------------


def draw_schedule(
    groups: pd.DataFrame,
    cc: ClusterConfig,
    horizon_s: float,
    period_s: float,
    rng: np.random.Generator,
) -> pd.DataFrame:
    """Jobs (uid, group index, gpus, arrive/start/end on the period grid, slot, initial).

    The cluster starts full: jobs drawn until one does not fit, each already part-way
    through its duration. Then Poisson arrivals, FIFO start when enough GPUs are free.
    Slots are positions of running jobs (at most ``gpus // smallest job``)."""
    gpus = groups["gpus"].to_numpy(int)
    if cc.gpus < gpus.min():
        raise ValueError(
            f"control.cluster.gpus = {cc.gpus}: smaller than the smallest job ({gpus.min()} GPUs)"
        )
    is_pt = (groups["task"] == "pt").to_numpy()
    pt, ft = np.flatnonzero(is_pt), np.flatnonzero(~is_pt)

    def pick() -> int:
        if cc.mix == "random" or len(pt) == 0 or len(ft) == 0:
            return int(rng.integers(len(groups)))
        return int(rng.choice(pt) if rng.random() < cc.pretraining_fraction else rng.choice(ft))

    def duration() -> float:
        d = math.exp(rng.normal(math.log(cc.duration_median_s), cc.duration_sigma))
        return float(np.clip(d, cc.duration_min_s, cc.duration_max_s))

    snap = lambda t: period_s * math.ceil(t / period_s - 1e-9)  # noqa: E731
    n_ticks = int(math.ceil(horizon_s / period_s))
    n_slots = cc.gpus // int(gpus.min())
    free_slots = list(range(n_slots))[::-1]
    jobs: list[dict[str, Any]] = []
    free, misses = cc.gpus, 0
    while misses < 5:  # the cluster at t = 0
        g = pick()
        if gpus[g] > free:
            misses += 1
            continue
        d = duration()
        start = -snap(rng.uniform(0.0, d))
        jobs.append(
            {
                "group": g,
                "gpus": int(gpus[g]),
                "arrive_s": start,
                "start_s": start,
                "end_s": max(start + snap(d), period_s),
                "slot": free_slots.pop(),
                "initial": True,
            }
        )
        free -= gpus[g]
    arrivals = np.cumsum(
        rng.exponential(
            cc.mean_interarrival_s, size=int(3 * horizon_s / cc.mean_interarrival_s) + 10
        )
    )
    arrivals = [snap(a) for a in arrivals if a < horizon_s]
    queue: list[dict[str, Any]] = []
    running = list(jobs)
    a = 0
    for k in range(n_ticks + 1):
        t = k * period_s
        for j in [j for j in running if j["end_s"] <= t]:
            running.remove(j)
            free += j["gpus"]
            free_slots.append(j["slot"])
        while a < len(arrivals) and arrivals[a] <= t:
            g = pick()
            queue.append(
                {
                    "group": g,
                    "gpus": int(gpus[g]),
                    "arrive_s": arrivals[a],
                    "initial": False,
                    "d": duration(),
                }
            )
            a += 1
        while queue and queue[0]["gpus"] <= free:
            j = queue.pop(0)
            j.update(start_s=t, end_s=t + snap(j.pop("d")), slot=free_slots.pop())
            free -= j["gpus"]
            running.append(j)
            jobs.append(j)
    out = pd.DataFrame(
        jobs, columns=["group", "gpus", "arrive_s", "start_s", "end_s", "slot", "initial"]
    )
    out.insert(0, "uid", np.arange(len(out)))
    return out


# ---------------------------------------------------------------------------------------
# The oracle
# ---------------------------------------------------------------------------------------


class Oracle:
    """Exact allocation on the true curves of the running jobs, then for each job the
    highest grid cap whose true power fits its share; recomputed when the jobs or the
    budget change. The curves are the truth at every ``plan_step_w`` of cap (linear in
    between, as the allocation module models a sweep; the exact oracle's hull scan is
    cubic in the points per curve)."""

    def __init__(self, tables: Tables, cfg: ControlConfig, plan_step_w: float = 50.0):
        self.t, self.cfg = tables, cfg
        self.lo, self.hi = (tables.groups[c].to_numpy(float) for c in ("min_cap_w", "max_cap_w"))
        every = max(1, int(round(plan_step_w / tables.step_w)))
        self.plan = np.unique(np.r_[np.arange(0, len(tables.cap_w), every), len(tables.cap_w) - 1])
        self._key: tuple | None = None
        self._caps: np.ndarray | None = None

    def caps(
        self, budget_w: float, slot_group: np.ndarray, active: np.ndarray, idle_w: float
    ) -> np.ndarray:
        lo, hi = self.lo[slot_group], self.hi[slot_group]
        if not np.isfinite(budget_w):
            return np.where(active, hi, np.nan)
        key = (budget_w, idle_w, tuple(np.where(active, slot_group, -1)))
        if key == self._key:
            return self._caps
        P = np.where(active[:, None], self.t.metrics["power_w"][slot_group], 0.0)
        T = np.where(active[:, None], self.t.metrics["tokens_per_s"][slot_group], 0.0)
        # one workload with a leading axis: the exact oracle's MILP fallback indexes workloads
        plan = Curves(P[None][..., self.plan], T[None][..., self.plan])
        a = allocate(plan, np.array([budget_w * (1 - self.cfg.target_margin) - idle_w]), optimum())
        idx = np.maximum((P <= a.power_w[0][:, None] * (1 + 1e-9) + 1e-9).sum(-1) - 1, 0)
        caps = np.where(bool(a.feasible[0]), self.t.cap_w[idx], lo)
        self._key, self._caps = key, np.where(active, caps, np.nan)
        return self._caps


# ---------------------------------------------------------------------------------------
# The simulation
# ---------------------------------------------------------------------------------------


@dataclass
class SimResult:
    rows: list[str]  # policies, then "oracle", "uncapped"
    t_s: np.ndarray  # (n,) 1-s grid
    budget_w: np.ndarray  # (n,) inf = no event
    required_w: np.ndarray  # (n,) budget to comply with (response time applied)
    power_w: np.ndarray  # (rows, n) cluster power
    tokens: np.ndarray  # (rows, jobs) tokens per job
    jobs: pd.DataFrame  # the schedule + per-job estimates
    fallback_s: np.ndarray  # (rows,) job-seconds on the safe fallback cap
    cap_changes: np.ndarray  # (rows,) cap changes (job x period)
    tolerance: float

    def timeseries(self) -> pd.DataFrame:
        out = pd.DataFrame(
            {"t_s": self.t_s, "budget_w": self.budget_w, "required_w": self.required_w}
        )
        for r, name in enumerate(self.rows):
            out[f"power_w:{name}"] = self.power_w[r].astype(np.float32)
        return out


def declared_profiles(
    tables: Tables,
    schedule: pd.DataFrame,
    model: Mapping[str, Any] | None,
    noise: float,
    rng: np.random.Generator,
) -> pd.DataFrame:
    """Each job's uncapped telemetry as a previous run of it measured it (noisy), and the
    PFI the predictor gives for it (any feature set: the truth table has every metric)."""
    g = schedule["group"].to_numpy()
    top = {m: v[g, -1] for m, v in tables.metrics.items()}
    n = len(schedule)
    prof = pd.DataFrame({m: top[m] * (1 + rng.normal(0, noise, n)) for m in top})
    prof["dram_copy_product"] = prof["dram_active"] * prof["mem_copy_util"]
    meta = tables.groups.iloc[g].reset_index(drop=True)
    prof["gpus"], prof["task"] = meta["gpus"].to_numpy(), meta["task"].to_numpy()
    prof["architecture"] = np.where(meta["cluster"].str.startswith("moe"), "moe", "dense")
    prof["pfi"] = predict(model, prof) if model is not None and is_fitted(model) else np.nan
    return prof


def simulate(
    tables: Tables,
    scenario: Scenario,
    policies: Sequence[str],
    ctl_cfg: ControlConfig,
    cc: ClusterConfig,
    seed: int,
    model: Mapping[str, Any] | None = None,
    schedule: pd.DataFrame | None = None,
) -> SimResult:
    """Run every policy, the oracle and the uncapped reference through one scenario."""
    period = ctl_cfg.period_s
    n_sub = int(round(period))
    if abs(n_sub - period) > 1e-9 or n_sub < 1:
        raise ValueError(f"control period {period} s: must be a whole number of seconds")
    pols = [get(p, "control") for p in policies]
    rng = np.random.default_rng(stable_seed(seed, scenario.name))
    horizon = scenario.signal.duration_s + scenario.tail_s
    n_ticks = int(math.ceil(horizon / period))
    if schedule is None:
        schedule = draw_schedule(tables.groups, cc, horizon, period, rng)
    prof = declared_profiles(tables, schedule, model, cc.profile_noise, rng)
    undeclared = schedule["initial"].to_numpy() & (cc.initial_profiles == "observed")

    G = tables.groups
    g_gpus, g_lo, g_hi = (G[c].to_numpy(float) for c in ("gpus", "min_cap_w", "max_cap_w"))
    idle_w = float(G["idle_w"].iloc[0])
    g_moe_ft = (G["cluster"] == "moe-ft").to_numpy()
    p_top = tables.metrics["power_w"][:, -1]
    rows = list(policies) + list(names(cluster_reference=True))
    R, NC, S = len(rows), len(policies), cc.gpus // int(g_gpus.min())
    ORACLE, UNCAPPED = rows.index(optimum()), rows.index(unlimited())

    starts: dict[int, list[int]] = {}
    ends: dict[int, list[int]] = {}
    sched = schedule.to_dict("records")
    for j in sched:
        starts.setdefault(max(int(round(j["start_s"] / period)), 0), []).append(j["uid"])
        ends.setdefault(int(round(j["end_s"] / period)), []).append(j["uid"])

    ctl = Controller(policies, ctl_cfg, S, pfi_from_model(model))
    oracle = Oracle(tables, ctl_cfg)
    slot_uid = np.full(S, -1)
    slot_g = np.zeros(S, int)
    slot_start = np.zeros(S)
    caps = np.full((R, S), np.nan)
    power = np.zeros((R, S))
    fluct = np.zeros(S)
    phi = math.exp(-1.0 / 5.0)
    decay = math.exp(-1.0 / SETTLE_TAU_S)
    n_sec = n_ticks * n_sub
    t_sec = np.arange(n_sec, dtype=float)
    in_event = np.asarray(scenario.signal.active(t_sec), bool)
    budget = np.full(n_sec, np.inf)
    power_sec = np.zeros((R, n_sec))
    tokens = np.zeros((R, len(schedule)))
    fallback_s = np.zeros(R)
    changes = np.zeros(R, int)
    est_rows: dict[int, dict[str, float]] = {}
    dropouts = [
        (d["start_s"], d["start_s"] + d["duration_s"], float(d.get("fraction", 1.0)))
        for d in scenario.telemetry_dropouts
    ]
    drop_draw = rng.random(S)
    table = JobTable.empty(S)
    online = next((r for r, p in enumerate(pols) if p.learns), None)

    def record_estimates(slots: np.ndarray) -> None:
        """The online learner's view of departing jobs beside the truth on the same knots."""
        if len(slots) == 0:
            return
        est = ctl.estimates()
        r = online if online is not None else 0
        knots = ctl.knots_w[slots]
        true_t = interp(
            tables.metrics["power_w"][slot_g[slots]],
            tables.metrics["tokens_per_s"][slot_g[slots]],
            knots,
        )
        t_max = ctl.profile.t_max[slots][:, None]
        err = lambda curve: np.sqrt(np.mean(((curve - true_t) / t_max) ** 2, -1))  # noqa: E731
        prior_err, learned_err = err(ctl.prior_t[slots]), err(ctl.learned_curves()[r, slots])
        true_pfi = curve_pfi(knots, true_t)
        for i, s in enumerate(slots):
            est_rows[int(slot_uid[s])] = {
                "pfi_true": float(true_pfi[i]),
                "pfi_prior": float(est["pfi_prior"][s]),
                "pfi_learned": float(est["pfi_learned"][r, s]) if online is not None else np.nan,
                "curve_rmse_prior": float(prior_err[i]),
                "curve_rmse_learned": float(learned_err[i]) if online is not None else np.nan,
                "n_obs": int(est["n_obs"][r, s]),
                "power_ratio": float(est["ratio"][r, s]),
            }

    for k in range(n_ticks):
        t0 = k * period
        gone = [sched[u]["slot"] for u in ends.get(k, []) if slot_uid[sched[u]["slot"]] == u]
        record_estimates(np.array(gone, int))
        for s in gone:
            slot_uid[s] = -1
        for u in starts.get(k, []):
            j = sched[u]
            s = j["slot"]
            slot_uid[s], slot_g[s], slot_start[s] = u, j["group"], j["start_s"]
            caps[:, s] = np.nan  # a new job starts at the GPUs' default limit
            power[:, s] = j["gpus"] * idle_w
        if gone or k == 0 or starts.get(k):
            active = slot_uid >= 0
            uid = np.where(active, slot_uid, 0)
            known = active & ~undeclared[uid]
            nan_unless = lambda a: np.where(known, a, np.nan)  # noqa: E731
            table = JobTable(
                uid=slot_uid.copy(),
                gpus=np.where(active, g_gpus[slot_g], 0).astype(int),
                min_cap_w=g_lo[slot_g],
                max_cap_w=g_hi[slot_g],
                moe_ft=g_moe_ft[slot_g],
                p_max_w=nan_unless(prof["power_w"].to_numpy()[uid]),
                t_max=nan_unless(prof["tokens_per_s"].to_numpy()[uid]),
                dram_copy_product=nan_unless(prof["dram_copy_product"].to_numpy()[uid]),
                pfi=nan_unless(prof["pfi"].to_numpy()[uid]),
            )
            gpus = table.gpus.astype(float)
            idle_gpus = cc.gpus - int(gpus.sum())
            uncapped_w = (p_top[slot_g] * active).sum() + idle_gpus * idle_w
        sec = slice(k * n_sub, (k + 1) * n_sub)
        if scenario.basis == "nominal":
            basis = float(scenario.nominal_w)
        elif scenario.basis == "uncapped" or k == 0 or not in_event[k * n_sub - 1]:
            basis = uncapped_w  # a baseline is held from the start of an event
        budget[sec] = scenario.signal.budget(t_sec[sec], basis)

        # ---- physics, 1-s steps ------------------------------------------------------
        idx = tables.index(caps)
        p_train = tables.metrics["power_w"][slot_g, idx]
        t_train = tables.metrics["tokens_per_s"][slot_g, idx]
        u_train = tables.metrics["gpu_util"][slot_g, idx]
        cap_power = 1.01 * np.where(np.isfinite(caps), caps, g_hi[slot_g]) * gpus
        acc_p = np.zeros((R, S))
        acc_t = np.zeros((R, S))
        acc_u = np.zeros(S)
        acc_train = np.zeros(S)
        for i in range(n_sub):
            train, ckpt = _phases(t0 + i - slot_start, active, cc)
            phase_w = gpus * (idle_w + np.where(ckpt, CHECKPOINT_EXTRA_W, STARTUP_EXTRA_W))
            target = np.where(train, p_train, np.where(active, phase_w, 0.0))
            # the jobs running at t = 0 are in their steady state already
            power = target if k == 0 and i == 0 else target + (power - target) * decay
            fluct = phi * fluct + math.sqrt(1 - phi**2) * rng.standard_normal(
                S
            ) * cc.power_noise / np.sqrt(np.maximum(gpus, 1))
            actual = np.where(train, np.minimum(power * (1 + fluct), cap_power), power)
            actual = np.where(active, actual, 0.0)
            power_sec[:, k * n_sub + i] = actual.sum(-1) + idle_gpus * idle_w
            acc_p += actual
            acc_t += np.where(train, t_train, 0.0)
            acc_train += train
            acc_u += np.where(ckpt, CHECKPOINT_UTIL, 0.0)
        tokens[:, slot_uid[active]] += acc_t[:, active]

        # ---- control at the end of the period --------------------------------------------
        t1 = t0 + period
        stale = np.zeros(S, bool)
        for a0, a1, f in dropouts:
            if a0 <= t1 < a1:
                stale |= drop_draw < f
        util = np.where(acc_train == n_sub, u_train, u_train * acc_train / n_sub) + acc_u / n_sub
        read = Readings(
            power_w=acc_p[:NC] / n_sub,
            tokens_per_s=acc_t[:NC] / n_sub * (1 + cc.tokens_noise * rng.standard_normal((NC, S))),
            gpu_util=util[:NC],
            age_s=np.where(stale, np.inf, 0.0)[None],
            total_power_w=power_sec[:NC, sec].mean(-1),
            idle_power_w=np.full(NC, idle_gpus * idle_w),
            idle_gpus=idle_gpus,
            dram_active=tables.metrics["dram_active"][slot_g, idx[:NC]],
            mem_copy_util=tables.metrics["mem_copy_util"][slot_g, idx[:NC]],
            sm_active=tables.metrics["sm_active"][slot_g, idx[:NC]],
        )
        b_now = float(scenario.signal.budget(t1, basis))
        # the event's ramp limit holds every cap step (kW/s), as on a real node (wattflex control)
        ramp_w_per_s = ramp_at(scenario.signal, t1)
        new = ctl.step(t1, b_now, table, read, ramp_w_per_s)
        moved = np.isfinite(new) & ~(np.abs(new - caps[:NC]) < 1e-9)
        changes[:NC] += moved.sum(-1)
        fallback_s[:NC] += ctl.fallback.sum(-1) * period
        caps[:NC] = new
        b_oracle = float(
            scenario.signal.budget(
                t1 + np.arange(0.0, ctl_cfg.settle_s + period + 1e-9, 1.0), basis
            ).min()
        )
        new_o = oracle.caps(b_oracle, slot_g, active, idle_gpus * idle_w)
        with np.errstate(invalid="ignore", divide="ignore"):
            drawn_o = np.where(active, acc_p[ORACLE] / n_sub / np.maximum(gpus, 1), np.inf)
        new_o = ramp_caps(
            caps[ORACLE],
            new_o,
            drawn_o,
            gpus,
            g_lo[slot_g],
            g_hi[slot_g],
            tables.step_w,
            ramp_w_per_s * period,
            active,
        )
        changes[ORACLE] += (np.isfinite(new_o) & ~(np.abs(new_o - caps[ORACLE]) < 1e-9)).sum()
        caps[ORACLE] = new_o
        caps[UNCAPPED] = np.where(active, g_hi[slot_g], np.nan)

    record_estimates(np.flatnonzero(slot_uid >= 0))
    required = _trailing_max(budget, int(round(scenario.response_s)))
    jobs = schedule.copy()
    jobs["group"] = tables.groups["group"].to_numpy()[schedule["group"].to_numpy()]
    jobs["pfi_declared"] = prof["pfi"].to_numpy()
    est = pd.DataFrame.from_dict(est_rows, orient="index")
    jobs = jobs.join(est, on="uid")
    for r, name in enumerate(rows):
        jobs[f"tokens:{name}"] = tokens[r]
    return SimResult(
        rows,
        t_sec,
        budget,
        required,
        power_sec,
        tokens,
        jobs,
        fallback_s,
        changes,
        ctl_cfg.tolerance,
    )


def _phases(
    elapsed_s: np.ndarray, active: np.ndarray, cc: ClusterConfig
) -> tuple[np.ndarray, np.ndarray]:
    """(training, checkpointing) masks of jobs ``elapsed_s`` after their start."""
    run = active & (elapsed_s >= cc.startup_s)
    since = elapsed_s - cc.startup_s
    ckpt = (
        run
        & (since >= cc.checkpoint_every_s)
        & (np.mod(since, cc.checkpoint_every_s) < cc.checkpoint_s)
    )
    return run & ~ckpt, ckpt


def simulate_scenario(
    tables: Tables,
    control: Mapping[str, Any],
    name: str,
    signal_path: str,
    model: Mapping[str, Any] | None = None,
) -> SimResult:
    """One scenario from the ``control`` config slice as a loaded config has it, the schema's
    defaults filled (``controller``, ``cluster``, ``policies``, ``seed``, ``cap_step_w``), and this
    scenario's settings under ``scenario``."""
    ctl_cfg = ControlConfig.from_dict(
        {**control["controller"], "cap_step_w": control["cap_step_w"]}
    )
    if abs(ctl_cfg.cap_step_w - tables.step_w) > 1e-9:
        raise ValueError(
            f"control.cap_step_w {ctl_cfg.cap_step_w:g} W differs from the truth table's grid {tables.step_w:g} W"
        )
    settings = {k: v for k, v in dict(control.get("scenario", {})).items() if k != "signal"}
    scenario = Scenario(name, read_schedule(signal_path), **settings)
    policies = list(control.get("policies") or names(control=True))
    return simulate(
        tables,
        scenario,
        policies,
        ctl_cfg,
        ClusterConfig.from_dict(control["cluster"]),
        int(control["seed"]),
        model,
    )


def _trailing_max(x: np.ndarray, window: int) -> np.ndarray:
    """max(x[t - window .. t]) for every t (inf allowed)."""
    if window <= 0:
        return x.copy()
    size = window + 1
    return maximum_filter1d(x, size=size, origin=(size - 1) // 2, mode="nearest")


# ---------------------------------------------------------------------------------------
# Summaries
# ---------------------------------------------------------------------------------------


def summarize(res: SimResult) -> pd.DataFrame:
    """One row per policy (and reference): budget tracking and tokens."""
    event = np.isfinite(res.required_w)
    over = res.power_w[:, event] - res.required_w[event]
    req = res.required_w[event]
    tokens = res.tokens.sum(-1)
    by = dict(zip(res.rows, tokens))
    eq, orc, unc = by.get(baseline(), np.nan), by[optimum()], by[unlimited()]
    dur = event.sum()
    rows = []
    for r, name in enumerate(res.rows):
        o = over[r] if dur else np.zeros(1)
        rows.append(
            {
                "policy": name,
                "worst_overshoot_w": float(max(o.max(), 0.0)),
                "seconds_above_budget": float((o > 0).sum()),
                "tokens": float(tokens[r]),
                "tokens_vs_oracle": float(tokens[r] / orc) if orc > 0 else np.nan,
                "kind": "reference" if get(name).cluster_reference else "controller",
                "worst_overshoot_frac": float(max((o / req).max(), 0.0)) if dur else 0.0,
                "seconds_beyond_tolerance": float((o > res.tolerance * req).sum()) if dur else 0.0,
                "event_s": float(dur),
                "mean_budget_w": float(req.mean()) if dur else np.nan,
                "mean_power_in_event_w": float(res.power_w[r, event].mean()) if dur else np.nan,
                "tokens_lost_vs_uncapped": float(1 - tokens[r] / unc) if unc > 0 else np.nan,
                "gap_closed_vs_equal_weight": float((tokens[r] - eq) / (orc - eq))
                if np.isfinite(eq) and orc > eq
                else np.nan,
                "fallback_job_s": float(res.fallback_s[r]),
                "cap_changes": int(res.cap_changes[r]),
            }
        )
    return pd.DataFrame(rows)
