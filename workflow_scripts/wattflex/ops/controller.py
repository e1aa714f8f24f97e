"""Closed-loop power control: per-job GPU caps that keep a cluster under a budget signal.

Every control period the :class:`Controller` reads each running job's telemetry (power,
tokens/s, GPU utilisation, DRAM/SM activity and the age of that reading), updates what it
knows about each job, and returns one per-GPU cap per job. Pure: it touches no device.
:func:`wattflex.ops.services.node_agent.run_loop` applies those caps to real (or emulated) GPUs;
:mod:`wattflex.ops.clustersim` drives the same controller against emulated jobs.

**Budget accounting (why it cannot overshoot).** The firmware holds a GPU's power at or
below its cap, so a job's power is at most ``gpus * cap``. The controller splits the budget
into power targets ``p_i`` and sets ``cap_i = p_i / (gpus_i * r_i)``, where ``r_i <= 1`` is the
job's learned ratio of realised power to ``gpus * cap`` when the cap binds (15-MHz clock
bins and GPUs waiting at the data-parallel barrier leave it a few percent under its cap).
``r_i`` starts at 1 (no reclaim) and follows the *upper envelope* of the ratios observed
at steady state, so the realised power errs below the target. Power targets never count
on a job staying below its share: a job in start-up or in a checkpoint dip keeps its
reservation, so the power it frees is not handed to others and nothing overshoots when it
resumes. GPUs without a job are charged their measured power plus ``idle_headroom_w`` each
(a job starting on them draws little for its first minute, long before the next period).
A one-sided integral *trim* lowers the budget handed to the policy whenever the measured
cluster power still exceeds the budget once caps have settled, and relaxes back to zero.

**Policies** (the power targets): ``equal-weight``, ``pfi-aware``, ``moe-ft-weighted``
and ``raw-dcgm`` water-fill the cut with :func:`wattflex.allocation.allocator.water_fill` and the
weights of :func:`wattflex.allocation.allocator.policy_weights`; ``curve-aware`` runs the exact
allocation (:func:`wattflex.allocation.oracle.hull_greedy`, the hull relaxation the oracle starts
from) on each job's *prior* curve; ``online-learning`` runs it on curves it refines online.

**Flexibility estimate.** A job's prior is the one-parameter curve family of
:func:`wattflex.allocation.allocator.predicted_curves` through its uncapped point (``P_max``, ``T_max``)
with the PFI predicted from its uncapped telemetry (DRAM copy product), sampled at
``knots`` evenly spaced powers from ``gpus * min_cap`` to ``P_max``. ``online-learning``
keeps a Gaussian belief over the throughput at those knots (prior sd ``prior_rel_sd * T_max``,
shrinking to 1 % at the uncapped knot, correlated along the curve) and, after each of its
own cap changes has settled, treats the measured (power, tokens/s) as one linear
observation of the interpolated curve: a Kalman update per job and period. A job whose
profile is not declared gets one from its first steady uncapped telemetry (until then:
``gpus * max_cap`` and the median of the known jobs).

**Safety.** Caps are clipped to each job's device constraints and rounded down to
``cap_step_w``. A job whose telemetry is missing or older than ``stale_after_s`` is not
guessed at: it gets the safe equal-weight cap, the budget divided evenly over all job GPUs,
and the others share what is left. A budget of ``inf`` (no curtailment event) uncaps every
job.

**Ramp limit on caps.** With an event's ramp limit (``ramp_w_per_s`` to :meth:`Controller.step`,
:func:`wattflex.ops.events.ramp_at` of a schedule), the load the cap changes of one step can move, summed over
every job's GPUs, is held to ``ramp * (time since the last step)`` each way: going down, a
GPU's cap below what it draws (``min(old cap, measured power per GPU)``) sheds that much;
going up, a cap raised by x lets it draw at most x more. Every moving job gets the same
fraction of its move (the budget's own ramp asks for about that much, so the two agree; a
cap lowered only above the power drawn moves freely); what the rounding to the cap grid
leaves of the allowance buys whole cap steps, one per job in slot order, so a slow ramp over
many GPUs still moves. It binds most at the restore, where the budget jumps to ``inf``. A
job new to the controller is not limited. :func:`ramp_caps` is the one implementation: the
cluster simulation holds its oracle to it too (wattflex.ops.clustersim).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, fields
from typing import Any

import numpy as np

from wattflex.allocation.allocator import policy_weights, predicted_curves, water_fill
from wattflex.allocation.curves import Curves
from wattflex.allocation.oracle import concave_hull, hull_greedy, plan_greedy
from wattflex.pfi import pfi_ratio_curves
from wattflex.policies import get
from wattflex.schema import section_defaults

# ---------------------------------------------------------------------------------------
# Configuration, inputs
# ---------------------------------------------------------------------------------------

_CONTROLLER = {
    **section_defaults("control", "controller"),
    "cap_step_w": section_defaults("control")["cap_step_w"],
}


@dataclass
class ControlConfig:
    """The controller's settings (config ``control.controller``, and ``control.cap_step_w``);
    defaults: the schema's."""

    period_s: float = _CONTROLLER["period_s"]  # control period (the DCGM exporter's period)
    tolerance: float = _CONTROLLER[
        "tolerance"
    ]  # overshoot allowed once the response time has passed (fraction of budget)
    target_margin: float = _CONTROLLER["target_margin"]  # aim this far below the budget
    settle_s: float = _CONTROLLER[
        "settle_s"
    ]  # telemetry after a cap change is trusted from then on (firmware tau ~2 s)
    stale_after_s: float = _CONTROLLER[
        "stale_after_s"
    ]  # older telemetry -> safe equal-weight cap for that job
    steady_util: float = _CONTROLLER[
        "steady_util"
    ]  # GPU util (%) over a whole period that marks steady training
    cap_step_w: float = _CONTROLLER["cap_step_w"]  # caps are rounded down to this grid
    idle_headroom_w: float = _CONTROLLER[
        "idle_headroom_w"
    ]  # charged per GPU without a job, above its measured power
    ratio_decay: float = _CONTROLLER[
        "ratio_decay"
    ]  # per period: how fast the power/cap ratio may fall toward observations
    trim_gain: float = _CONTROLLER[
        "trim_gain"
    ]  # fraction of a settled overshoot removed per period
    trim_recover: float = _CONTROLLER[
        "trim_recover"
    ]  # trim relaxes by this fraction of the budget per second
    knots: int = _CONTROLLER["knots"]  # points of each learned curve
    prior_rel_sd: float = _CONTROLLER[
        "prior_rel_sd"
    ]  # prior sd of throughput at the lowest knot, fraction of T_max
    prior_corr: float = _CONTROLLER[
        "prior_corr"
    ]  # correlation length along the curve (fraction of its power range)
    obs_rel_sd: float = _CONTROLLER[
        "obs_rel_sd"
    ]  # sd of one period's tokens/s, fraction of T_max (noise + model misfit)
    moe_ft_share: float = _CONTROLLER[
        "moe_ft_share"
    ]  # moe-ft-weighted: MoE fine-tuning jobs take this multiple of the cut
    profile_tolerance: float = _CONTROLLER[
        "profile_tolerance"
    ]  # a declared uncapped power this far off the measured one is replaced
    steady_power_change: float = _CONTROLLER[
        "steady_power_change"
    ]  # steady: job power within this fraction of the previous period's
    replan_s: float = _CONTROLLER[
        "replan_s"
    ]  # online-learning: learned curves enter the allocation this often
    restore_stagger_s: float = _CONTROLLER[
        "restore_stagger_s"
    ]  # after an event, uncap one job per this many seconds (0: all at once)

    @classmethod
    def from_dict(cls, cfg: Mapping[str, Any] | None) -> ControlConfig:
        cfg = dict(cfg or {})
        known = {f.name for f in fields(cls)}
        unknown = set(cfg) - known
        if unknown:
            raise ValueError(f"unknown control.controller key(s): {', '.join(sorted(unknown))}")
        out = cls(**cfg)
        if (
            out.period_s <= 0
            or out.cap_step_w <= 0
            or out.knots < 3
            or not out.restore_stagger_s >= 0
        ):
            raise ValueError(
                "control.controller: period_s and cap_step_w must be > 0, knots >= 3, "
                "restore_stagger_s >= 0"
            )
        return out


@dataclass
class JobTable:
    """What the scheduler knows about the jobs, one entry per slot (arrays of shape (S,)).

    ``uid`` < 0 marks an empty slot; a new uid in a slot is a new job. Profile fields
    (``p_max_w``, ``t_max``, ``dram_copy_product``, ``pfi``) come from the job's uncapped
    telemetry; NaN = not declared (learned from the job's first steady uncapped period)."""

    uid: np.ndarray
    gpus: np.ndarray
    min_cap_w: np.ndarray
    max_cap_w: np.ndarray
    moe_ft: np.ndarray
    p_max_w: np.ndarray
    t_max: np.ndarray
    dram_copy_product: np.ndarray
    pfi: np.ndarray

    @classmethod
    def empty(cls, n: int) -> JobTable:
        nan = lambda: np.full(n, np.nan)  # noqa: E731
        return cls(
            np.full(n, -1),
            np.zeros(n, int),
            np.full(n, 200.0),
            np.full(n, 700.0),
            np.zeros(n, bool),
            nan(),
            nan(),
            nan(),
            nan(),
        )

    @property
    def active(self) -> np.ndarray:
        return self.uid >= 0


@dataclass
class Readings:
    """One control period of telemetry. Per job (R, S) or (S,): period means; ``age_s`` is how
    old the newest sample is (inf or NaN power = no feed). Per cluster (R,): measured total
    power and the power of GPUs without a job (``idle_gpus`` of them)."""

    power_w: np.ndarray
    tokens_per_s: np.ndarray
    gpu_util: np.ndarray
    age_s: np.ndarray
    total_power_w: np.ndarray
    idle_power_w: np.ndarray
    idle_gpus: int = 0
    dram_active: np.ndarray | None = None
    mem_copy_util: np.ndarray | None = None
    sm_active: np.ndarray | None = None


def ramp_caps(
    old_w: np.ndarray,
    caps_w: np.ndarray,
    drawn_w: np.ndarray,
    gpus: np.ndarray,
    min_cap_w: np.ndarray,
    max_cap_w: np.ndarray,
    cap_step_w: float,
    allow_w: float,
    active: np.ndarray | None = None,
) -> np.ndarray:
    """The ramp limit on one step's cap changes, shared by the controller and the cluster
    simulation's oracle: per-GPU ``caps_w`` (R, S) from ``old_w`` (the caps applied now; NaN:
    a job new to them, not limited) with the load the changes move, summed over every job's
    ``gpus``, held to ``allow_w`` each way (R rows apart). Going down a GPU sheds from what it
    draws (``min(old cap, drawn_w)``, per GPU), going up a raise by x lets it draw x more;
    every moving job gets the same fraction of its move, a down move's cap rounded up, an up
    move's down, to the ``cap_step_w`` grid within ``min_cap_w``..``max_cap_w``."""
    if not (math.isfinite(allow_w) and allow_w >= 0):
        return caps_w
    g, old = np.asarray(gpus, float), np.asarray(old_w, float)
    eff = np.minimum(old, drawn_w)  # what a GPU draws now, at most its cap
    known = np.isfinite(old) if active is None else np.asarray(active, bool) & np.isfinite(old)
    down, up = known & (caps_w < eff), known & (caps_w > old)
    shed = (g * np.where(down, eff - caps_w, 0.0)).sum(-1, keepdims=True)
    rise = (g * np.where(up, caps_w - old, 0.0)).sum(-1, keepdims=True)
    f_down = np.minimum(1.0, np.divide(allow_w, shed, out=np.ones_like(shed), where=shed > 0))
    f_up = np.minimum(1.0, np.divide(allow_w, rise, out=np.ones_like(rise), where=rise > 0))
    lo, hi = np.asarray(min_cap_w, float), np.asarray(max_cap_w, float)
    with np.errstate(invalid="ignore"):
        cut = np.clip(
            np.ceil((eff - f_down * (eff - caps_w)) / cap_step_w - 1e-9) * cap_step_w, lo, hi
        )
        lift = np.maximum(
            old,
            np.clip(
                np.floor((old + f_up * (caps_w - old)) / cap_step_w + 1e-9) * cap_step_w, lo, hi
            ),
        )
    slow_down, slow_up = down & (f_down < 1), up & (f_up < 1)
    # the rounding keeps each move under its share; what it left of the allowance buys whole
    # cap steps, one per job in slot order, or a slow ramp over many GPUs would never move
    step_w = g * cap_step_w
    left_down = allow_w - (g * np.where(down, eff - np.where(slow_down, cut, caps_w), 0.0)).sum(
        -1, keepdims=True
    )
    more_down = slow_down & (cut - cap_step_w >= caps_w - 1e-9)
    cut = np.where(
        more_down & (np.cumsum(np.where(more_down, step_w, 0.0), -1) <= left_down + 1e-9),
        cut - cap_step_w,
        cut,
    )
    left_up = allow_w - (g * np.where(up, np.where(slow_up, lift, caps_w) - old, 0.0)).sum(
        -1, keepdims=True
    )
    more_up = slow_up & (lift + cap_step_w <= caps_w + 1e-9)
    lift = np.where(
        more_up & (np.cumsum(np.where(more_up, step_w, 0.0), -1) <= left_up + 1e-9),
        lift + cap_step_w,
        lift,
    )
    return np.where(slow_down, cut, np.where(slow_up, lift, caps_w))


def round_caps(cap_w: np.ndarray, lo: np.ndarray, hi: np.ndarray, step: float) -> np.ndarray:
    """Clip to the device range and round down to the cap grid (never above the request)."""
    c = np.clip(cap_w, lo, hi)
    return np.maximum(np.floor(c / step + 1e-9) * step, lo)


def pfi_from_model(model: Mapping[str, Any] | None) -> Callable[[np.ndarray], np.ndarray] | None:
    """``dram_copy_product -> PFI`` from a predictor model document (``wattflex.analysis.predictor``)
    when the DRAM copy product is all it uses; None otherwise."""
    if model is None or list(model.get("features", [])) != ["dram_copy_product"]:
        return None
    slope, icpt = float(model["coefficients"]["dram_copy_product"]), float(model["intercept"])
    return lambda dcp: icpt + slope * np.asarray(dcp, float)


def prior_curves(
    floor_w: np.ndarray, p_max_w: np.ndarray, t_max: np.ndarray, pfi: np.ndarray, knots: int
) -> Curves:
    """Each job's prior curve on ``knots`` powers from its floor to its uncapped power."""
    ceil = np.maximum(p_max_w, floor_w + 1.0)
    base = Curves(np.stack([floor_w, ceil], -1), np.stack([np.zeros_like(t_max), t_max], -1))
    return predicted_curves(base, pfi, knots)


def curve_pfi(power_w: np.ndarray, throughput: np.ndarray) -> np.ndarray:
    """Ratio PFI (paper Eq. 1) of curves sampled at their knots, the uncapped one last:
    :func:`wattflex.pfi.pfi_ratio_curves` (NaN for a curve with no point below its top)."""
    return pfi_ratio_curves(power_w, throughput)


# ---------------------------------------------------------------------------------------
# The controller
# ---------------------------------------------------------------------------------------


class Controller:
    """One controller per policy, run as a batch: row r of every (R, S) array is policy r's
    cluster (its own telemetry, caps and estimates); slots S are job positions.

    ``predict_pfi(dram_copy_product) -> pfi`` is used for jobs whose profile it observes.
    """

    def __init__(
        self,
        policies: Sequence[str],
        cfg: ControlConfig,
        slots: int,
        predict_pfi: Callable[[np.ndarray], np.ndarray] | None = None,
    ):
        pols = [get(p, "control") for p in policies]
        self.policies, self.cfg, self.predict_pfi = list(policies), cfg, predict_pfi
        R, S, K = len(policies), slots, cfg.knots
        self.weighted = np.array([p.weighted for p in pols])
        self.online = np.array([p.learns for p in pols])
        self.uid = np.full(S, -1)
        self.profile = JobTable.empty(S)  # declared or observed profiles (filled below)
        self.known = np.zeros(S, bool)  # profile from the job, not a default
        self.caps = np.full((R, S), np.nan)
        self.last_change = np.full((R, S), -np.inf)
        self.ratio = np.ones((R, S))
        self.trim = np.zeros(R)
        self.last_drop = -np.inf
        self.prev_budget = math.inf
        self.prev_step_t = -np.inf  # when step last ran (the ramp limit's time base)
        self.restore_from = -np.inf  # when the last event's budget was lifted
        self.restore_order = np.zeros(0, int)  # jobs capped when it was lifted, in release order
        self.fallback = np.zeros((R, S), bool)
        self.target_w = np.zeros((R, S))  # each job's power share in the last allocation
        self.prev_power = np.full((R, S), np.nan)
        self.prev_training = np.zeros((R, S), bool)
        self.knots_w = np.zeros((S, K))
        self.prior_t = np.zeros((S, K))
        self.mean = np.zeros((R, S, K))
        self.cov = np.zeros((R, S, K, K))
        self.n_obs = np.zeros((R, S), int)
        self.curves_t = np.zeros((R, S, K))  # the curves the curve policies allocate on
        self.last_replan = -np.inf
        self._plan: tuple[bytes, Any] | None = None
        self._last_hull: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None

    # ---- jobs -------------------------------------------------------------------------
    def _admit(self, t_s: float, jobs: JobTable) -> None:
        """Reset the state of slots whose job changed; take declared profiles. A new job's
        telemetry is trusted ``settle_s`` after it is first seen."""
        new = jobs.uid != self.uid
        if not new.any():
            return
        self.uid = jobs.uid.copy()
        for f in fields(JobTable):
            getattr(self.profile, f.name)[new] = getattr(jobs, f.name)[new]
        self.known[new] = np.isfinite(jobs.p_max_w[new]) & np.isfinite(jobs.t_max[new])
        self.caps[:, new] = np.nan
        self.last_change[:, new] = t_s
        self.ratio[:, new] = 1.0
        self.n_obs[:, new] = 0
        self.prev_power[:, new] = np.nan
        self.prev_training[:, new] = False
        self._fill_defaults()
        gone = new & (jobs.uid < 0)
        self.knots_w[gone], self.prior_t[gone], self.mean[:, gone] = 0.0, 0.0, 0.0
        self._reset_curves(new & ~gone)

    def _fill_defaults(self) -> None:
        """Profile fields a job did not declare: ceiling ``gpus * max_cap``, the per-GPU
        throughput, PFI and DRAM copy product of the median known job (1 / 1.0 / 0 when
        none is known)."""
        p, act = self.profile, self.uid >= 0
        ref = act & self.known
        med = lambda a, d: (
            float(np.nanmedian(a[ref])) if ref.any() and np.isfinite(a[ref]).any() else d
        )  # noqa: E731
        per_gpu_t = med(p.t_max / np.maximum(p.gpus, 1), 1.0)
        for name, default in (
            ("p_max_w", p.gpus * p.max_cap_w),
            ("t_max", p.gpus * per_gpu_t),
            ("pfi", med(p.pfi, 1.0)),
            ("dram_copy_product", med(p.dram_copy_product, 0.0)),
        ):
            arr = getattr(p, name)
            fill = act & ~np.isfinite(arr)
            arr[fill] = np.broadcast_to(default, arr.shape)[fill]

    def _reset_curves(self, which: np.ndarray) -> None:
        p, cfg = self.profile, self.cfg
        floor = p.gpus[which] * p.min_cap_w[which]
        pc = prior_curves(floor, p.p_max_w[which], p.t_max[which], p.pfi[which], cfg.knots)
        self.knots_w[which], self.prior_t[which] = pc.power_w, pc.throughput
        K = cfg.knots
        u = np.linspace(0.0, 1.0, K)
        t_max = p.t_max[which][:, None]
        sd = t_max * (cfg.prior_rel_sd * (1.0 - u) + 0.01)  # (n, K)
        corr = np.exp(-np.abs(u[:, None] - u[None, :]) / cfg.prior_corr)  # (K, K)
        self.mean[:, which] = pc.throughput
        self.cov[:, which] = sd[:, :, None] * sd[:, None, :] * corr
        self.last_replan = -np.inf

    def _observe_profiles(self, read: Readings, steady: np.ndarray) -> None:
        """Uncapped telemetry. An undeclared job gets its profile from its first steady period
        at its maximum cap; a declared one whose uncapped power is off by more than
        ``profile_tolerance`` is replaced (its curve restarts from the corrected prior).
        Otherwise the uncapped power follows the upper envelope of what the job draws
        uncapped (up at once, down by ``ratio_decay`` per period): a job left uncapped is
        charged at least what it draws."""
        uncapped = steady & ~(self.caps < self.profile.max_cap_w - 1e-6)
        if not uncapped.any():
            return
        r = np.argmax(uncapped, axis=0)  # first row that saw it uncapped
        cols = np.flatnonzero(uncapped.any(0) & (self.uid >= 0))
        rows = r[cols]
        p = self.profile
        obs = read.power_w[rows, cols]
        off = np.abs(obs - p.p_max_w[cols]) > self.cfg.profile_tolerance * p.p_max_w[cols]
        reset = ~self.known[cols] | off
        track = cols[~reset]
        p.p_max_w[track] = np.maximum(obs[~reset], p.p_max_w[track] * (1 - self.cfg.ratio_decay))
        moved = np.abs(self.knots_w[track, -1] - p.p_max_w[track]) > 0.005 * p.p_max_w[track]
        self.knots_w[track[moved]] = _rescale(self.knots_w[track[moved]], p.p_max_w[track[moved]])
        if moved.any():
            self.last_replan = -np.inf
        cols, rows, first = cols[reset], rows[reset], ~self.known[cols[reset]]
        if not len(cols):
            return
        p.p_max_w[cols] = read.power_w[rows, cols]
        p.t_max[cols] = read.tokens_per_s[rows, cols]
        if read.dram_active is not None and read.mem_copy_util is not None:
            dcp = read.dram_active[rows, cols] * read.mem_copy_util[rows, cols]
            p.dram_copy_product[cols[first]] = dcp[first]
            if self.predict_pfi is not None:
                p.pfi[cols[first]] = np.asarray(self.predict_pfi(dcp[first]), float)
        self.known[cols] = True
        self._fill_defaults()
        seen = np.zeros(len(self.uid), bool)
        seen[cols] = True
        self._reset_curves(seen)
        self.n_obs[:, seen] = 0

    # ---- learning ---------------------------------------------------------------------
    def _learn_ratio(self, read: Readings, steady: np.ndarray) -> None:
        """Upper envelope of realised power / (gpus * cap) while the cap binds."""
        p = self.profile
        cap_power = p.gpus * self.caps
        binding = steady & (cap_power < 0.97 * p.p_max_w) & np.isfinite(cap_power)
        with np.errstate(invalid="ignore", divide="ignore"):
            obs = np.clip(read.power_w / cap_power, 0.5, 1.0)
        self.ratio = np.where(
            binding, np.maximum(obs, self.ratio - self.cfg.ratio_decay), self.ratio
        )

    def _learn_curves(self, read: Readings, steady: np.ndarray) -> None:
        """One Kalman update per steady job on the online-learning rows."""
        if not self.online.any():
            return
        rows = np.flatnonzero(self.online)
        obs = steady[rows] & np.isfinite(read.tokens_per_s[rows])
        if not obs.any():
            return
        kw = self.knots_w  # (S, K)
        x = np.clip(read.power_w[rows], kw[:, 0], kw[:, -1])  # (Ro, S)
        h = _interp_weights(kw, x)  # (Ro, S, K)
        mean, cov = self.mean[rows], self.cov[rows]
        ph = np.einsum("rskl,rsl->rsk", cov, h)
        noise = (self.cfg.obs_rel_sd * self.profile.t_max) ** 2  # (S,)
        s = (h * ph).sum(-1) + noise
        gain = ph / s[..., None]
        innov = np.nan_to_num(read.tokens_per_s[rows] - (h * mean).sum(-1))
        m = obs[..., None]
        self.mean[rows] = np.where(m, mean + gain * innov[..., None], mean)
        self.cov[rows] = np.where(m[..., None], cov - gain[..., :, None] * ph[..., None, :], cov)
        self.n_obs[rows] += obs

    def learned_curves(self) -> np.ndarray:
        """(R, S, K) throughput at the knots: non-decreasing, never below zero."""
        return np.maximum.accumulate(np.maximum(self.mean, 0.0), axis=-1)

    # ---- one period ---------------------------------------------------------------------
    def step(
        self,
        t_s: float,
        budget_w: float,
        jobs: JobTable,
        read: Readings,
        ramp_w_per_s: float = math.inf,
        limit_w: float = math.inf,
    ) -> np.ndarray:
        """Caps (R, S) per GPU for the next period (NaN for empty slots); ``ramp_w_per_s``:
        the most load the cap changes may move per second (module docstring); ``limit_w``:
        an electrical limit on these jobs together (their node's share of its rack, PDU,
        feed and site: wattflex.ops.adapters.topology), held in every period whatever the ramp (the
        ramp paces the event, never a breaker): the budget is at most it, and after the
        ramp every cap is at most the cap the limit alone gives."""
        cfg = self.cfg
        budget_w = min(budget_w, limit_w)
        self._admit(t_s, jobs)
        R = len(self.policies)
        as2d = lambda a: np.broadcast_to(np.asarray(a, float), (R, len(self.uid)))  # noqa: E731
        read = Readings(
            as2d(read.power_w),
            as2d(read.tokens_per_s),
            as2d(read.gpu_util),
            as2d(read.age_s),
            np.broadcast_to(np.asarray(read.total_power_w, float), (R,)),
            np.broadcast_to(np.asarray(read.idle_power_w, float), (R,)),
            read.idle_gpus,
            *(
                None if a is None else as2d(a)
                for a in (read.dram_active, read.mem_copy_util, read.sm_active)
            ),
        )
        active = self.uid >= 0
        fresh = active & (read.age_s <= cfg.stale_after_s) & np.isfinite(read.power_w)
        settled = (t_s - self.last_change) >= cfg.settle_s - 1e-9
        # steady: training through this period and the previous one at the same power (a
        # phase change inside a period leaves its utilisation high but its power moving)
        training = fresh & (read.gpu_util >= cfg.steady_util) & (read.tokens_per_s > 0)
        with np.errstate(invalid="ignore"):
            flat = (
                np.abs(read.power_w - self.prev_power) <= cfg.steady_power_change * self.prev_power
            )
        steady = training & self.prev_training & flat & settled
        self.prev_power, self.prev_training = np.where(fresh, read.power_w, np.nan), training
        self._observe_profiles(read, steady)
        self._learn_ratio(read, steady)
        self._learn_curves(read, steady)
        self._refresh_curves(t_s)
        if budget_w < self.prev_budget:  # power above a new, lower budget is
            self.last_drop = t_s  # settling, not an error to trim
        if not np.isfinite(budget_w) and np.isfinite(self.prev_budget):
            self.restore_from = t_s
            self.restore_order = np.flatnonzero(
                active & (self.caps < self.profile.max_cap_w - 1e-6).any(0)
            )
        self.prev_budget = budget_w
        self._update_trim(t_s, budget_w, read)
        hard = self._caps(limit_w, read, fresh, active) if math.isfinite(limit_w) else None
        caps = self._caps(budget_w, read, fresh, active)
        if not np.isfinite(budget_w):
            caps = self._stagger(t_s, caps, active)
        caps = self._ramp(caps, read, active, ramp_w_per_s * (t_s - self.prev_step_t))
        if hard is not None:
            caps = np.fmin(caps, hard)
        self.prev_step_t = t_s
        self._apply(t_s, caps, active)
        self.fallback = active & ~fresh & np.isfinite(budget_w)
        return self.caps.copy()

    def _stagger(self, t_s: float, caps: np.ndarray, active: np.ndarray) -> np.ndarray:
        """Staggered restore: the jobs capped when the event ended are uncapped one every
        ``restore_stagger_s`` (slot order), so they do not surge together; the others keep
        the cap they had, which the event's lowest budget already allowed."""
        step = self.cfg.restore_stagger_s
        if step <= 0 or not len(self.restore_order):
            return caps
        released = int((t_s - self.restore_from + 1e-9) // step) + 1
        held = np.zeros(len(self.uid), bool)
        held[self.restore_order[released:]] = True
        held &= active & np.isfinite(self.caps).all(0)  # a job that arrived meanwhile is not held
        return np.where(held[None, :], self.caps, caps)

    def _ramp(
        self, caps: np.ndarray, read: Readings, active: np.ndarray, allow_w: float
    ) -> np.ndarray:
        """``caps`` held to the ramp limit (:func:`ramp_caps`) from the caps now applied."""
        with np.errstate(invalid="ignore", divide="ignore"):
            drawn = np.where(
                np.isfinite(read.power_w), read.power_w / np.maximum(self.profile.gpus, 1), np.inf
            )
        p = self.profile
        return ramp_caps(
            self.caps,
            caps,
            drawn,
            p.gpus,
            p.min_cap_w,
            p.max_cap_w,
            self.cfg.cap_step_w,
            allow_w,
            active,
        )

    def _update_trim(self, t_s: float, budget_w: float, read: Readings) -> None:
        cfg = self.cfg
        if not np.isfinite(budget_w):
            self.trim[:] = 0.0
            return
        settled = (t_s - self.last_drop) >= cfg.settle_s - 1e-9
        excess = read.total_power_w - budget_w * (1.0 - cfg.target_margin / 2)
        over = settled & np.isfinite(excess) & (excess > 0)
        relax = np.minimum(0.0, self.trim + cfg.trim_recover * budget_w * cfg.period_s)
        self.trim = np.where(
            over,
            self.trim - cfg.trim_gain * np.nan_to_num(excess),
            np.where(settled, relax, self.trim),
        )

    def safe_cap(self, budget_w: float, read: Readings) -> np.ndarray:
        """The equal-weight fallback: what is left after idle GPUs, evenly over job GPUs (R,)."""
        p, cfg = self.profile, self.cfg
        n = max(int(p.gpus[self.uid >= 0].sum()), 1)
        idle = np.asarray(read.idle_power_w, float) + cfg.idle_headroom_w * read.idle_gpus
        return (budget_w * (1.0 - cfg.target_margin) - idle) / n

    def _caps(
        self, budget_w: float, read: Readings, fresh: np.ndarray, active: np.ndarray
    ) -> np.ndarray:
        p, cfg = self.profile, self.cfg
        lo, hi, gpus = p.min_cap_w, p.max_cap_w, p.gpus
        if not np.isfinite(budget_w):
            return np.where(active, hi, np.nan) * np.ones((len(self.policies), 1))
        idle = read.idle_power_w + cfg.idle_headroom_w * read.idle_gpus
        safe = round_caps(self.safe_cap(budget_w, read)[:, None], lo, hi, cfg.cap_step_w)  # (R, S)
        stale = active & ~fresh
        base = budget_w * (1.0 - cfg.target_margin) - idle + self.trim
        budget_opt = base - (stale * gpus * safe).sum(-1)  # (R,)
        opt = active & fresh
        floor = gpus * lo
        ceil = np.maximum(p.p_max_w, floor)
        power = np.zeros(opt.shape)
        if self.weighted.any():
            rows = np.flatnonzero(self.weighted)
            curves = Curves(
                np.stack([floor, ceil], -1), np.stack([np.zeros_like(ceil), p.t_max], -1)
            )
            feats = {"pfi": p.pfi, "dram_copy_product": p.dram_copy_product, "moe_ft": p.moe_ft}
            weights = np.stack(
                [policy_weights(self.policies[r], curves, feats, cfg.moe_ft_share) for r in rows]
            )
            head = np.where(opt[rows], ceil - floor, 0.0)
            cut = np.where(opt[rows], ceil, 0.0).sum(-1) - budget_opt[rows]
            power[rows] = np.where(opt[rows], ceil - water_fill(cut, head, weights), 0.0)
        if (~self.weighted).any():
            rows = np.flatnonzero(~self.weighted)
            power[rows] = self._curve_allocation(rows, opt, budget_opt)
        self.target_w = np.where(stale, gpus * safe, power)
        with np.errstate(invalid="ignore", divide="ignore"):
            cap = power / (gpus * self.ratio)
        top = np.where(
            self.weighted[:, None], ceil, self.knots_w[:, -1]
        )  # the allocation's ceiling
        cap = np.where(power >= top * (1 - 1e-9), hi, cap)
        cap = round_caps(np.nan_to_num(cap, nan=0.0, posinf=0.0), lo, hi, cfg.cap_step_w)
        cap = np.where(stale, safe, cap)
        return np.where(active, cap, np.nan)

    def _curve_allocation(
        self, rows: np.ndarray, opt: np.ndarray, budget_w: np.ndarray
    ) -> np.ndarray:
        """Exact allocation on the curves (hull greedy); its budget-independent plan is kept
        while the curves and the jobs it may move stay the same."""
        m = opt[rows][..., None]
        P = np.where(m, self.knots_w[None], 0.0)
        T = np.where(m, self.curves_t[rows], 0.0)
        key = P.tobytes() + T.tobytes()
        if self._plan is None or self._plan[0] != key:
            self._plan = (key, plan_greedy(P, T, self._hull(P, T)))
        return hull_greedy(P, T, budget_w[rows], self._plan[1]).power_w

    def _hull(self, P: np.ndarray, T: np.ndarray) -> np.ndarray:
        """Concave hulls of the curves (R, S, K), recomputed only for the rows that changed
        since the last call (a job arrived, left, went stale or its curve was relearned);
        rows are independent, so the numbers are those of the full computation."""
        last = self._last_hull
        if last is None or last[0].shape != P.shape:
            hull = concave_hull(P, T)
        else:
            hull = last[2].copy()
            changed = np.any((P != last[0]) | (T != last[1]), axis=-1)
            if changed.any():
                hull[changed] = concave_hull(P[changed], T[changed])
        self._last_hull = (P, T, hull)
        return hull

    def _refresh_curves(self, t_s: float) -> None:
        """Curves for the curve policies: the prior (curve-aware) or the learned one
        (online-learning), the latter taken every ``replan_s`` or when a curve restarts,
        so that caps do not move with every observation."""
        if t_s - self.last_replan >= self.cfg.replan_s:
            self.curves_t = np.where(
                self.online[:, None, None], self.learned_curves(), self.prior_t[None]
            )
            self.last_replan = t_s

    def _apply(self, t_s: float, caps: np.ndarray, active: np.ndarray) -> None:
        """New caps; a job whose cap moved is not steady again until ``settle_s`` later."""
        change = active & ~(np.abs(caps - self.caps) < 1e-6)
        self.last_change = np.where(change, t_s, self.last_change)
        self.caps = np.where(active, caps, np.nan)

    # ---- reporting ----------------------------------------------------------------------
    def estimates(self) -> dict[str, np.ndarray]:
        """Per slot: prior PFI, learned PFI (R, S), observations (R, S), power/cap ratio (R, S)."""
        kw = self.knots_w
        return {
            "pfi_prior": curve_pfi(kw, self.prior_t),
            "pfi_learned": curve_pfi(kw[None], self.learned_curves()),
            "n_obs": self.n_obs.copy(),
            "ratio": self.ratio.copy(),
        }


def _rescale(knots_w: np.ndarray, top_w: np.ndarray) -> np.ndarray:
    """Knots stretched so that the last one is ``top_w`` (the first stays)."""
    lo = knots_w[..., :1]
    span = knots_w[..., -1:] - lo
    u = np.divide(knots_w - lo, span, out=np.zeros_like(knots_w), where=span > 0)
    return lo + u * (np.maximum(top_w[..., None], lo + 1.0) - lo)


def _interp_weights(knots_w: np.ndarray, x: np.ndarray) -> np.ndarray:
    """Weights (..., S, K) such that sum_k w_k f(knot_k) is the piecewise-linear f at x (..., S)."""
    K = knots_w.shape[-1]
    idx = np.clip((x[..., None] >= knots_w).sum(-1) - 1, 0, K - 2)  # (..., S)
    k0 = np.take_along_axis(np.broadcast_to(knots_w, (*x.shape, K)), idx[..., None], -1)[..., 0]
    k1 = np.take_along_axis(np.broadcast_to(knots_w, (*x.shape, K)), idx[..., None] + 1, -1)[..., 0]
    frac = np.clip(np.divide(x - k0, k1 - k0, out=np.zeros_like(x), where=k1 > k0), 0.0, 1.0)
    w = np.zeros((*x.shape, K))
    np.put_along_axis(w, idx[..., None], (1 - frac)[..., None], -1)
    np.put_along_axis(w, idx[..., None] + 1, frac[..., None], -1)
    return w
