"""The public measured sweeps the emulator is scored on beside the paper, one row each.

Shipped in ``resources/external/`` (each folder's README says what was measured):

- **Perseus SOSP'24 A100 power-limit sweeps** (``power_limit_sweeps_A100.csv``): the two
  decoder-only jobs the emulator has a step for (``config/perseus-sosp24-a100-emulated.yaml``:
  BLOOM-3B, GPT-3 XL as 4-stage A100 pipelines). An A100 has no default power level, so its
  anchor must be fitted on A100 PFIs (``wattflex.analysis.calibration``): each job is scored with the
  anchor fitted on the *other* job alone (leave one job out), never on itself.
- **Perseus SOSP'24 A100 SM-clock profiles** (``sm_frequency_profile_*+a100_*``): time and
  power of one pipeline stage at each locked SM clock. The emulated A100 jobs (anchor fitted on
  both power-limit sweeps, which carry no clock) are fitted the same way
  (``wattflex.analysis.clock_scaling``: time = a + b/f over the clock window every profile held;
  power ~ x^gamma near its top): the score is the emulated minus the measured clock-independent
  share of kernel time and power exponent. The profiles are the stages of other models (BLOOM
  176B, GPT-3 175B) than the emulated jobs: a check of the clock model's shape, not a match.
- Sweeps on GPUs the catalogue (``wattflex.gpus.GPUS``) has no model of (Zeus NSDI'23 V100,
  A40, P100, RTX 6000; Perseus A40) are rows with no score that say so.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from wattflex.analysis import calibration as cal
from wattflex.analysis.clock_scaling import (
    distinct_stages,
    fit_clock_scaling,
    held_clock_max,
    power_shape,
    read_perseus_profile,
    stage_series,
)
from wattflex.gpus import GPUS

REPO = Path(__file__).resolve().parents[3]
PERSEUS = REPO / "resources" / "external" / "perseus-sosp24"
ZEUS = REPO / "resources" / "external" / "zeus-nsdi23"
PERSEUS_A100_CONFIG = cal.PERSEUS_A100_CONFIG
PASSES = ("forward", "backward", "forward+backward")
TOP_WIDTH = 0.2  # the power-law exponent is fitted over [x_hi - 0.2, x_hi] (benchmarks/emulator_vs_perseus.py)
COLUMNS = (
    "test_set",
    "data",
    "fitted_to",
    "not_fitted_to",
    "n",
    "pfi_mae",
    "pfi_mae_other",
    "spearman",
    "clock_share_error_pp",
    "power_exponent_error",
    "note",
)


def row(**values: Any) -> dict[str, Any]:
    """One test-set row with every column (NaN / "" where a score is undefined)."""
    out = {
        c: (
            math.nan
            if c
            in (
                "n",
                "pfi_mae",
                "pfi_mae_other",
                "spearman",
                "clock_share_error_pp",
                "power_exponent_error",
            )
            else ""
        )
        for c in COLUMNS
    }
    unknown = set(values) - set(COLUMNS)
    if unknown:
        raise KeyError(f"not a test-set column: {sorted(unknown)}")
    return {**out, **values}


def clock_fit(
    clock_mhz, time_s, power_w, f_max_mhz: float, x_lo: float, x_hi: float, bin_mhz: float = 15.0
) -> dict[str, float]:
    """Clock-independent share of time at x_hi (time = a + b/f fitted over [x_lo, x_hi], bins
    within half a bin of the ends inside) and the power exponent near x_hi."""
    clock = np.asarray(clock_mhz, float)
    half = 0.5 * bin_mhz / f_max_mhz
    keep = (clock / f_max_mhz >= x_lo - half) & (clock / f_max_mhz <= x_hi + half)
    fit = fit_clock_scaling(clock[keep], np.asarray(time_s, float)[keep], x_hi * f_max_mhz)
    shape = power_shape(clock, power_w, f_max_mhz, x_lo, x_hi, TOP_WIDTH)
    return {
        "share": fit.clock_independent_share,
        "a_s": fit.a_s,
        "b_s_mhz": fit.b_s_mhz,
        "r2": fit.r2,
        "max_rel_residual": fit.max_rel_residual,
        "n_clocks": fit.n,
        "power_ratio": shape.ratio,
        "power_exponent_top": shape.exponent_top,
    }


def profile_series(
    paths: Sequence[str | Path], passes: Sequence[str]
) -> list[tuple[pd.DataFrame, list[int], str, pd.DataFrame]]:
    """(profile, distinct stage set, pass, series) for every profile file and pass."""
    out = []
    for path in sorted(map(Path, paths)):
        prof = read_perseus_profile(path)
        for stages in distinct_stages(prof):
            for inst in passes:
                out.append((prof, stages, inst, stage_series(prof, stages[0], inst)))
    return out


def held_windows(series) -> dict[str, tuple[float, float]]:
    """Per measured GPU, the relative clock window every profile of it held: from its lowest
    clock to the highest clock below any power plateau (``held_clock_max``) of any profile."""
    lo: dict[str, float] = {}
    hi: dict[str, float] = {}
    for prof, _, _, s in series:
        gpu, f_max = prof["gpu"].iat[0], float(prof["clock_mhz"].max())
        lo[gpu] = max(lo.get(gpu, 0.0), float(s["clock_mhz"].min()) / f_max)
        hi[gpu] = min(hi.get(gpu, 1.0), held_clock_max(s["clock_mhz"], s["power_w"]) / f_max)
    return {gpu: (lo[gpu], hi[gpu]) for gpu in lo}


def perseus_a100_rows(
    sweeps_csv: str | Path,
    profiles: Sequence[str | Path],
    config_path: str | Path = PERSEUS_A100_CONFIG,
) -> list[dict[str, Any]]:
    """The two Perseus A100 rows (module docstring)."""
    from wattflex.runs.emulator.step import operating_points

    groups, measured, c = cal.perseus_a100_calibration(sweeps_csv, config_path)
    names = ", ".join(g.model for g in groups)
    left = sorted(set(measured.index) - {g.id for g in groups})
    out = [
        row(
            test_set="Perseus A100 power-limit sweeps (leave one job out)",
            data=f"measured Eq. 1 PFI of {len(groups)} A100 pipeline jobs ({names}), "
            f"{len(groups[0].caps)} caps each",
            fitted_to="the A100 anchor on the other job's measured PFI; GH100 voltage shape; every other "
            "constant as for the H200",
            not_fitted_to="the scored job's PFI",
            n=len(groups),
            pfi_mae=c.out_of_sample_mae,
            note=f"in sample (both jobs in the fit): {c.in_sample_mae:.3f}; "
            f"{len(left)} jobs with no emulated step left out ({', '.join(left)})",
        )
    ]
    every = profile_series([p for p in profiles if "a100" in Path(p).name.lower()], PASSES)
    if not every:
        return out
    win = held_windows(every)  # held by every pass of every profile, as the benchmark's window
    series = [s for s in every if s[2] == "forward+backward"]
    ((gpu_name, (x_lo, x_hi)),) = win.items()
    measured_fits = [
        clock_fit(
            s["clock_mhz"], s["time_s"], s["power_w"], float(p["clock_mhz"].max()), x_lo, x_hi
        )
        for p, _, _, s in series
    ]
    gpu, physics = GPUS["A100"], c.physics()
    # compute_s: kernel time only (no exposed communication or host wait), the analogue of a stage pass
    emulated = [
        clock_fit(
            pts["sm_clock_mhz"],
            pts["compute_s"],
            pts["power_w"],
            gpu.sm_clock_max_mhz,
            x_lo,
            x_hi,
            gpu.clock_step_mhz,
        )
        for pts in (operating_points(g.job, gpu, physics=physics) for g in groups)
    ]
    share_m = float(np.mean([f["share"] for f in measured_fits]))
    gamma_m = float(np.mean([f["power_exponent_top"] for f in measured_fits]))
    share_e = float(np.mean([f["share"] for f in emulated]))
    gamma_e = float(np.mean([f["power_exponent_top"] for f in emulated]))
    models = ", ".join(sorted({str(p["model"].iat[0]) for p, _, _, _ in series}))
    out.append(
        row(
            test_set="Perseus A100 SM-clock profiles (clock scaling)",
            data=f"{len(series)} measured {gpu_name} stage profiles ({models}; forward+backward) over "
            f"the held clock window x {x_lo:.3f}-{x_hi:.3f}",
            fitted_to="the A100 anchor on both Perseus A100 power-limit sweeps (PFI only, no clock)",
            not_fitted_to="any clock profile",
            n=len(series),
            clock_share_error_pp=100 * (share_e - share_m),
            power_exponent_error=gamma_e - gamma_m,
            note=f"clock-independent share of kernel time emulated {100 * share_e:.1f} % vs measured "
            f"{100 * share_m:.1f} %; power exponent near the top {gamma_e:.2f} vs {gamma_m:.2f}; "
            "the profiles are other models' stages than the emulated jobs",
        )
    )
    return out


def reading_rows(physics=None, what_if: Mapping[str, float] | None = None) -> list[dict[str, Any]]:
    """The GH100 power-clock reading the voltage curve is fitted to (``wattflex.analysis.calibration``):
    its residuals, what its disputed workload label moves (nothing: the fit reads only the
    measured clocks, draws and memory power), and ``what_if``: the Table 6 metrics
    (``wattflex.analysis.fidelity.metrics``) under :func:`calibration.caps_as_draws_physics`, the
    earlier reading, if given."""
    from wattflex.runs.emulator.physics import PHYSICS

    v = cal.default_voltage_curve()
    errors = cal.reading_clock_errors(physics or PHYSICS)
    if what_if:
        medians = " / ".join(
            f"{what_if.get(f'median_{c}', math.nan):.2f}" for c in ("dense", "moe-pt", "moe-ft")
        )
        dependence = (
            f"; with each cap read as the draw instead (refused as data, kept as the what-if): "
            f"Table 6 medians {medians}, Spearman {what_if.get('spearman_table6', math.nan):.2f}"
        )
    else:
        dependence = ""
    return [
        row(
            test_set="Ujeniya et al. 2026 H100 94 GB power-clock reading (fitted to)",
            data=f"{len(v.residuals_w)} measured (SM clock, board draw, memory power) triples, "
            "caps 200-700 W (a third-party reading of the v2 figures)",
            fitted_to="v_min, v_exp, GH100 static power; HBM power of every part",
            not_fitted_to="the caps (647 W drawn at the 700 W cap)",
            n=len(v.residuals_w),
            note=f"in sample: non-memory draw residual max {max(map(abs, v.residuals_w)):.1f} W, "
            f"memory power {max(map(abs, v.mem_residuals_w)):.1f} W, SM clock under each measured "
            f"draw max {np.abs(errors).max():.0f} MHz; workload label {cal.WORKLOAD_LABEL}: the "
            "fit uses no property of the workload, so either label gives the same constants "
            "(sensitivity 0); caps read as draws are refused (calibration.caps_as_draws)"
            + dependence,
        )
    ]


def unscored_rows(paths: Sequence[str | Path]) -> list[dict[str, Any]]:
    """A row per shipped sweep file on a GPU the catalogue has no model of."""
    out = []
    for path in sorted(map(Path, paths)):
        stem = path.stem
        gpu = stem.rsplit("_", 1)[-1].upper()
        if gpu in GPUS:
            continue
        source = "Zeus NSDI'23" if stem.startswith("summary_power") else "Perseus SOSP'24"
        out.append(
            row(
                test_set=f"{source} {gpu} power-limit sweeps",
                data=path.name,
                fitted_to="",
                not_fitted_to="",
                note=f"not scored: the emulator has no {gpu} model "
                f"(its catalogue: {', '.join(GPUS)})",
            )
        )
    return out


def fitted_constants(physics=None) -> list[str]:
    """The ``Physics`` constants whose source says they were fitted or derived from published
    figures (the rest are counted, datasheet, or assumed)."""
    from wattflex.runs.emulator.physics import PHYSICS

    return [
        f.name
        for f in dataclasses.fields(physics or PHYSICS)
        if str(f.metadata.get("source", "")).lower().startswith(("fitted", "derived"))
    ]


def scored_sets_table(
    metrics: Mapping[str, float],
    fit_groups: Sequence[str],
    fit_source: str,
    n_table6: int,
    loto: pd.DataFrame,
    public: Sequence[Mapping[str, Any]],
    physics=None,
) -> pd.DataFrame:
    """Every test set side by side: Table 6 out of sample under the campaign's own calibration
    (``metrics``: the noise-free model's, ``wattflex.analysis.fidelity.metrics``), each
    leave-one-table-out refit (``wattflex.analysis.calibration.leave_one_table_out``) and the public
    sweeps (``public``)."""
    rows = [
        row(
            test_set="Table 6 out of sample (this campaign's calibration)",
            data=f"published PFI of {n_table6} H200 headline groups (Table 6)",
            fitted_to=(
                f"the power-level anchor on {len(fit_groups)} groups ({fit_source}); "
                if fit_groups
                else f"the power-level anchor on {fit_source}; "
            )
            + f"fitted or derived from published figures: {', '.join(fitted_constants(physics))}",
            not_fitted_to="Table 6",
            n=n_table6,
            pfi_mae=metrics.get("mae_out_of_sample_table6", math.nan),
            pfi_mae_other=metrics.get("mae_out_of_sample_other", math.nan),
            spearman=metrics.get("spearman_table6", math.nan),
            note="pfi_mae_other: the published groups of Tables 7-8 outside the fit",
        )
    ]
    for r in loto[loto["fit_set"] != "(published)"].itertuples():
        rows.append(
            row(
                test_set=f"leave one table out: anchor on {r.fit_set}",
                data=f"published PFI of {n_table6} Table 6 groups, and Tables 7-8 outside the fit",
                fitted_to=f"the anchor on {int(r.n_facts)} groups of {r.fit_set}"
                if r.n_facts
                else "",
                not_fitted_to="Table 6 and the other tables' groups",
                n=n_table6,
                pfi_mae=r.mae_out_of_sample_table6,
                pfi_mae_other=r.mae_out_of_sample_other,
                spearman=r.spearman_table6,
                note=("the default fit set" if r.default else "")
                + ("" if r.n_facts else "no group of this set in the campaign"),
            )
        )
    rows.extend(dict(r) for r in public)
    return pd.DataFrame(rows, columns=list(COLUMNS))
