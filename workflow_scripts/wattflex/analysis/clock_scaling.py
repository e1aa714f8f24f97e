"""How time and power depend on the SM clock: the clock-independent share of time and the
shape of power vs clock, from any (clock, time, power) profile — a measured one (the Perseus
SOSP'24 SM-frequency profiles) or an emulated one (``wattflex.runs.emulator.step.operating_points``).

Time is fitted as ``t(f) = a + b / f``: ``b / f`` is work that scales with the SM clock
(compute-bound kernels), ``a`` is work that does not (memory-bound kernels, communication,
host time). The clock-independent share at the top clock is ``a / (a + b / f_max)``.
Power is compared in relative clock ``x = f / f_max`` because GPUs' top clocks differ.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

PROFILE_RE = re.compile(
    r"sm_frequency_profile_(?P<model>.+)\+(?P<gpu>[^_]+(?:_sxm)?)_(?P<dtype>\w+)\.csv$"
)


@dataclass(frozen=True)
class ClockFit:
    """Least-squares fit of ``time_s = a_s + b_s_mhz / clock_mhz``."""

    a_s: float
    b_s_mhz: float
    f_ref_mhz: float  # the clock at which the share is evaluated
    r2: float
    max_rel_residual: float  # max |t - fit| / t over the fitted points
    n: int

    @property
    def clock_independent_share(self) -> float:
        """Share of the time at ``f_ref_mhz`` that does not scale with the clock (a < 0 gives < 0)."""
        return self.a_s / (self.a_s + self.b_s_mhz / self.f_ref_mhz)


def fit_clock_scaling(
    clock_mhz: np.ndarray, time_s: np.ndarray, f_ref_mhz: float | None = None
) -> ClockFit:
    """Fit ``t = a + b / f`` (linear least squares in ``1 / f``); the share is evaluated at ``f_ref_mhz``
    (default: the top fitted clock). ``a`` is not constrained: a negative ``a`` says time grows faster
    than ``1 / f`` as the clock drops."""
    f = np.asarray(clock_mhz, float)
    t = np.asarray(time_s, float)
    if f.size < 3 or np.unique(f).size < 3:
        raise ValueError("fit_clock_scaling needs at least 3 distinct clocks")
    b, a = np.polyfit(1.0 / f, t, 1)
    pred = a + b / f
    ss_tot = float(np.sum((t - t.mean()) ** 2))
    r2 = 1.0 - float(np.sum((t - pred) ** 2)) / ss_tot if ss_tot > 0 else float("nan")
    return ClockFit(
        a_s=float(a),
        b_s_mhz=float(b),
        f_ref_mhz=float(f.max() if f_ref_mhz is None else f_ref_mhz),
        r2=r2,
        max_rel_residual=float(np.max(np.abs(t - pred) / t)),
        n=int(f.size),
    )


def held_clock_max(
    clock_mhz: np.ndarray, power_w: np.ndarray, rel_tol: float = 0.015, min_points: int = 3
) -> float:
    """Highest clock below a power plateau at the top of a locked-clock profile.

    Power rises steeply with the SM clock near the top (voltage ~ clock), so ``min_points`` top clocks
    whose power stays within ``rel_tol`` of the top clock's say the board power limit, not the locked
    clock, set the speed there (the A40 profiles sit at ~294 W of the A40's 300 W from ~1.5 GHz up, with
    flat time). Those clocks are left out; without such a plateau the top clock is returned."""
    f = np.asarray(clock_mhz, float)
    p = np.asarray(power_w, float)
    order = np.argsort(f)[::-1]
    f, p = f[order], p[order]
    flat = np.abs(p - p[0]) <= rel_tol * p[0]
    k = int(np.argmin(flat)) if not flat.all() else f.size
    if k < min_points:
        return float(f[0])
    if k >= f.size:
        raise ValueError("power is flat over the whole profile: no clock is known to be held")
    return float(f[k])


@dataclass(frozen=True)
class PowerShape:
    """Power vs relative clock over a window [x_lo, x_hi]."""

    ratio: float  # P(x_lo) / P(x_hi), linearly interpolated between clocks
    exponent_top: (
        float  # gamma of P ~ x**gamma (log-log least squares) over [x_hi - top_width, x_hi]
    )
    x_lo: float
    x_hi: float


def power_shape(
    clock_mhz: np.ndarray,
    power_w: np.ndarray,
    f_max_mhz: float,
    x_lo: float,
    x_hi: float = 1.0,
    top_width: float = 0.2,
) -> PowerShape:
    """Ratio of power across ``[x_lo, x_hi]`` (``x = f / f_max``) and the power-law exponent near ``x_hi``."""
    x = np.asarray(clock_mhz, float) / f_max_mhz
    p = np.asarray(power_w, float)
    order = np.argsort(x)
    x, p = x[order], p[order]
    tol = 1e-6
    if x_lo < x[0] - tol or x[-1] < x_hi - tol:
        raise ValueError(
            f"profile covers x in [{x[0]:.3f}, {x[-1]:.3f}], not [{x_lo:.3f}, {x_hi:.3f}]"
        )
    top = (x >= x_hi - top_width - tol) & (x <= x_hi + tol)
    if top.sum() < 3:
        raise ValueError(f"fewer than 3 clocks in [{x_hi - top_width:.3f}, {x_hi:.3f}]")
    gamma = float(np.polyfit(np.log(x[top]), np.log(p[top]), 1)[0])
    return PowerShape(
        ratio=float(np.interp(x_lo, x, p) / np.interp(x_hi, x, p)),
        exponent_top=gamma,
        x_lo=x_lo,
        x_hi=x_hi,
    )


def read_perseus_profile(path: str | Path) -> pd.DataFrame:
    """One Perseus SM-frequency profile (``stage, instruction, frequency, time, energy``; time in s and
    energy in J of one micro-batch's forward or backward on one pipeline stage at a locked SM clock) as
    ``model, gpu, stage, instruction, clock_mhz, time_s, energy_j, power_w`` (power = energy / time)."""
    path = Path(path)
    m = PROFILE_RE.search(path.name)
    if not m:
        raise ValueError(f"{path.name}: not named sm_frequency_profile_<model>+<gpu>_<dtype>.csv")
    raw = pd.read_csv(path)
    missing = {"stage", "instruction", "frequency", "time", "energy"} - set(raw.columns)
    if missing:
        raise ValueError(f"{path.name}: missing columns {sorted(missing)}")
    out = pd.DataFrame(
        {
            "model": m["model"],
            "gpu": m["gpu"].upper().replace("_", "-"),
            "stage": raw["stage"].astype(int),
            "instruction": raw["instruction"].astype(str),
            "clock_mhz": raw["frequency"].astype(float),
            "time_s": raw["time"].astype(float),
            "energy_j": raw["energy"].astype(float),
        }
    )
    if (out["time_s"] <= 0).any() or (out["energy_j"] <= 0).any():
        raise ValueError(f"{path.name}: non-positive time or energy")
    out["power_w"] = out["energy_j"] / out["time_s"]
    return out


def distinct_stages(profile: pd.DataFrame) -> list[list[int]]:
    """Pipeline stages grouped by identical measurements (Perseus profiles repeat one
    stage's numbers for every middle stage); each inner list is one distinct profile."""
    groups: dict[tuple, list[int]] = {}
    for stage, g in profile.sort_values(["stage", "instruction", "clock_mhz"]).groupby("stage"):
        key = tuple(
            g[["instruction", "clock_mhz", "time_s", "energy_j"]].itertuples(index=False, name=None)
        )
        groups.setdefault(key, []).append(int(stage))
    return sorted(groups.values())


def stage_series(profile: pd.DataFrame, stage: int, instruction: str) -> pd.DataFrame:
    """``clock_mhz, time_s, power_w`` of one stage for ``forward``, ``backward`` or ``forward+backward``
    (the micro-batch's two passes: times add, power is their energy over their time)."""
    g = profile[profile["stage"] == stage]
    parts = instruction.split("+")
    g = g[g["instruction"].isin(parts)]
    if g["instruction"].nunique() != len(parts):
        raise ValueError(f"stage {stage} lacks {instruction}")
    s = g.groupby("clock_mhz")[["time_s", "energy_j"]].sum().reset_index()
    s["power_w"] = s["energy_j"] / s["time_s"]
    return s[["clock_mhz", "time_s", "power_w"]]
