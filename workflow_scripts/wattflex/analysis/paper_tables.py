"""The paper's remaining tables from a campaign, each beside the published numbers.

- Table 9, grid sensitivity: PFI of every 6-cap group recomputed on the 4-cap grid.
- Table 8, H100 vs H200: PFI of the matched groups on each GPU and their rank agreement.
- Repeatability (§2): coefficient of variation of power and tokens/s across repeats.
- Tables 4–5, compute accounting: runs and GPU-hours the campaign would cost on real GPUs.

Published tables are read with :func:`wattflex.analysis.published.load_published`; every reproduced
table keeps its own columns and gets ``<col>_published`` right beside each of them.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import pandas as pd

from wattflex.analysis.published import load_published
from wattflex.gpus import DEFAULT_GPU
from wattflex.pfi import grid_sensitivity as pfi_grid_sensitivity
from wattflex.provenance import read_parquet
from wattflex.vocabulary import LORA_TASK_NAMES

#: Headline numbers the paper states in its text rather than in a table (paper §1, §2, §4).
PUBLISHED_SCALARS = {
    ("grid_sensitivity", "median_delta_pct"): (10.7, "paper §1/Table 9 text"),
    ("grid_sensitivity", "max_delta_pct"): (24.0, "paper §1/Table 9 text"),
    ("grid_sensitivity", "spearman_rho"): (0.94, "paper §1/Table 9 text"),
    ("h100_vs_h200", "spearman_rho"): (0.943, "paper §4/Table 8 text"),
    ("h100_vs_h200", "predictor_r2_h100"): (0.56, "paper §4/Table 8 text"),
    ("repeatability", "median_cv_power_pct"): (0.4, "paper §2"),
    ("repeatability", "median_cv_tokens_pct"): (0.5, "paper §2"),
    ("repeatability", "n_configurations"): (14, "paper §2"),
    ("repeatability", "n_runs"): (35, "paper §2"),
    ("compute", "gpu_hours_h200_sweeps"): (1069.0, "paper Table 4"),
}
FOUR_CAP_GRID = (200.0, 500.0, 600.0, 700.0)
_TASK_ALIASES = {name: "ft" for name in LORA_TASK_NAMES if name != "ft"}


def beside_published(
    ours: pd.DataFrame,
    published: pd.DataFrame | None,
    on: str | Sequence[str],
    columns: Sequence[str] | None = None,
    suffix: str = "_published",
) -> pd.DataFrame:
    """``ours`` left-joined with ``published`` on ``on``; each ``col + suffix`` right after ``col``.

    ``columns`` defaults to the non-key columns both tables share. Without a published
    table the ``_published`` columns are NaN, so the output shape never depends on it.
    """
    keys = [on] if isinstance(on, str) else list(on)
    if columns is None:
        columns = [
            c
            for c in ours.columns
            if c not in keys and published is not None and c in published.columns
        ]
    if published is None:
        merged = ours.assign(**{f"{c}{suffix}": np.nan for c in columns})
    else:
        pub = published[keys + list(columns)].rename(columns={c: f"{c}{suffix}" for c in columns})
        merged = ours.merge(pub, on=keys, how="left")
    order: list[str] = []
    for c in ours.columns:
        order.append(c)
        if c in columns:
            order.append(f"{c}{suffix}")
    return merged[order + [c for c in merged.columns if c not in order]]


def read_campaign(runs_path: str, pfi_path: str) -> tuple[pd.DataFrame, pd.DataFrame, str]:
    """runs.parquet, pfi.parquet and the backend(s) the runs came from (e.g. ``emulated``): the
    cap groups' (the paper's analyses are of power caps; a ``knob: clock`` group's curve is the
    knob menu's, ``wattflex.allocation.knobs``)."""
    from wattflex.run_ids import cap_rows

    runs, pfi = cap_rows(read_parquet(runs_path)), cap_rows(read_parquet(pfi_path))
    return runs, pfi, ",".join(sorted(runs["backend"].dropna().astype(str).unique()))


def task_key(task: pd.Series) -> pd.Series:
    """Task names as the paper's tables spell them (LoRA fine-tuning = ``ft``)."""
    return task.astype(str).str.lower().replace(_TASK_ALIASES)


def spearman(x: Sequence[float], y: Sequence[float]) -> tuple[float, float, int]:
    """Spearman rho, p and n over the pairs where both are finite."""
    from scipy.stats import spearmanr

    x, y = np.asarray(x, dtype=float), np.asarray(y, dtype=float)
    ok = np.isfinite(x) & np.isfinite(y)
    if ok.sum() < 3:
        return float("nan"), float("nan"), int(ok.sum())
    rho, p = spearmanr(x[ok], y[ok])
    return float(rho), float(p), int(ok.sum())


# ---- Table 9: sweep-grid sensitivity ----------------------------------------------------------


def grid_sensitivity(
    runs: pd.DataFrame,
    pfi: pd.DataFrame,
    grid: Sequence[float] = FOUR_CAP_GRID,
    sets: Sequence[str] | None = ("headline",),
    pfi_kwargs: dict[str, Any] | None = None,
) -> pd.DataFrame:
    """Table 9: ratio PFI of each group swept on more caps than ``grid``, recomputed on ``grid``.

    A group qualifies when its caps strictly contain ``grid`` and (if ``pfi`` has a
    ``set`` column) it belongs to ``sets``. Both PFIs come from
    :func:`wattflex.pfi.grid_sensitivity` on the same runs (repeats averaged as
    compute_pfi averages them); ``pfi_kwargs`` go to ``pfi_table``.
    """

    columns = ["group", "cluster", "pfi_6caps", "pfi_4caps", "delta", "delta_pct"]
    if sets is not None and "set" in pfi.columns:
        runs = runs[runs["group"].isin(pfi.loc[pfi["set"].isin(list(sets)), "group"])]
    kwargs = {"throughput_col": "tokens_per_s", **(pfi_kwargs or {})}
    table = (
        pfi_grid_sensitivity(runs, grid, **kwargs) if len(runs) else pd.DataFrame(columns=["group"])
    )
    if table.empty:
        return pd.DataFrame(columns=columns)
    table = table.rename(columns={"pfi_full": "pfi_6caps", "pfi_subset": "pfi_4caps"})
    clusters = (
        pfi.set_index("group")["cluster"] if "cluster" in pfi.columns else pd.Series(dtype=str)
    )
    table["cluster"] = table["group"].map(clusters)
    return table[columns].reset_index(drop=True)


def grid_summary(table9: pd.DataFrame) -> dict[str, float]:
    """Table 9's summary: the groups compared, the median and largest PFI change (%) from six caps
    to four, and Spearman's rho and p between the two rankings (NaN when there are no groups).
    """
    rho, p, n = spearman(table9["pfi_6caps"], table9["pfi_4caps"])
    pct = table9["delta_pct"].astype(float)
    return {
        "n_groups": n,
        "median_delta_pct": float(np.nanmedian(pct)) if len(pct) else np.nan,
        "max_delta_pct": float(np.nanmax(pct)) if len(pct) else np.nan,
        "spearman_rho": rho,
        "spearman_p": p,
    }


# ---- Table 8: H100 vs H200 --------------------------------------------------------------------


def group_metadata(
    runs: pd.DataFrame,
    columns: Sequence[str] = (
        "model",
        "architecture",
        "task",
        "ep",
        "gpus",
        "gpu_model",
        "cluster",
        "set",
        "matches",
    ),
) -> pd.DataFrame:
    """First value of each metadata column per group."""
    have = [c for c in columns if c in runs.columns]
    return runs.groupby("group", sort=False)[have].first().reset_index()


def h100_vs_h200(pfi: pd.DataFrame, runs: pd.DataFrame) -> pd.DataFrame:
    """Table 8: every group with a non-empty ``matches`` beside the H200 group it mirrors."""
    meta = group_metadata(runs)
    own = pfi[["group", "n_caps", "pfi_ratio"]].merge(meta, on="group", how="left")
    matched = own[own["matches"].fillna("").astype(str) != ""]
    ref = pfi[["group", "pfi_ratio"]].rename(columns={"group": "matches", "pfi_ratio": "pfi_h200"})
    out = matched.merge(ref, on="matches", how="left").rename(
        columns={
            "n_caps": "n_caps_h100",
            "pfi_ratio": "pfi_h100",
            "group": "group_h100",
            "matches": "group_h200",
        }
    )
    out["task"] = task_key(out["task"])
    cols = [
        "group_h100",
        "group_h200",
        "architecture",
        "task",
        "model",
        "ep",
        "gpus",
        "n_caps_h100",
        "pfi_h200",
        "pfi_h100",
    ]
    return out[cols].sort_values("pfi_h200", kind="stable").reset_index(drop=True)


def h100_summary(table8: pd.DataFrame) -> dict[str, float]:
    """Table 8's summary: the (model, task) pairs, Spearman's rho and p between their H200 and H100
    PFIs, and the median H100/H200 PFI ratio (NaN when the table is empty).
    """
    rho, p, n = spearman(table8["pfi_h200"], table8["pfi_h100"])
    return {
        "n_pairs": n,
        "spearman_rho": rho,
        "spearman_p": p,
        "median_ratio_h100_to_h200": float(np.nanmedian(table8["pfi_h100"] / table8["pfi_h200"]))
        if len(table8)
        else np.nan,
    }


# ---- Repeatability ----------------------------------------------------------------------------


def repeatability(
    runs: pd.DataFrame, power_col: str = "power_w", throughput_col: str = "tokens_per_s"
) -> pd.DataFrame:
    """CV (sample std / mean, %) of power and throughput for each (group, cap) run more than once."""
    by = runs.groupby(["group", "cap_w"], sort=True)
    stats = by.agg(
        n=(power_col, "size"),
        power_w=(power_col, "mean"),
        power_sd=(power_col, "std"),
        tokens_per_s=(throughput_col, "mean"),
        tokens_sd=(throughput_col, "std"),
    ).reset_index()
    stats = stats[stats["n"] > 1].copy()
    stats["cv_power_pct"] = 100.0 * stats.pop("power_sd") / stats["power_w"]
    stats["cv_tokens_pct"] = 100.0 * stats.pop("tokens_sd") / stats["tokens_per_s"]
    return stats.reset_index(drop=True)


def repeatability_summary(table: pd.DataFrame) -> dict[str, float]:
    """The repeatability table's summary: configurations, runs, and the median and largest
    coefficient of variation (%) of power and of tokens/s (NaN when the table is empty).
    """
    return {
        "n_configurations": int(len(table)),
        "n_runs": int(table["n"].sum()),
        "median_cv_power_pct": float(table["cv_power_pct"].median()) if len(table) else np.nan,
        "median_cv_tokens_pct": float(table["cv_tokens_pct"].median()) if len(table) else np.nan,
        "max_cv_power_pct": float(table["cv_power_pct"].max()) if len(table) else np.nan,
        "max_cv_tokens_pct": float(table["cv_tokens_pct"].max()) if len(table) else np.nan,
    }


# ---- Tables 4-5: compute accounting -----------------------------------------------------------

_PHASE_COLUMNS = ("warmup_s", "startup_s", "training_s", "dip_s")


def run_wallclock_s(runs: pd.DataFrame, duration_s: float, overhead_s: float) -> pd.Series:
    """Wall-clock seconds a real run would hold its GPUs: the traced span + fixed overhead.

    The span is the sum of the run's phase durations when ``runs`` has them (the trace
    covers warmup to the end of training), else the configured ``duration_s``;
    ``overhead_s`` covers what no trace sees (job launch, teardown, checkpoint upload).
    """
    if all(c in runs.columns for c in _PHASE_COLUMNS):
        span = runs[list(_PHASE_COLUMNS)].astype(float).sum(axis=1)
        span = span.where(span > 0, float(duration_s))
    else:
        span = pd.Series(float(duration_s), index=runs.index)
    return span + float(overhead_s)


def _accounting(runs: pd.DataFrame, by: list[str]) -> pd.DataFrame:
    gpu_h = runs["gpus"].astype(float) * runs["wallclock_s"] / 3600.0
    table = (
        runs.assign(gpu_hours=gpu_h)
        .groupby(by, sort=True)
        .agg(
            runs=("group", "size"),
            mean_wallclock_min=("wallclock_s", lambda s: s.mean() / 60.0),
            gpu_hours=("gpu_hours", "sum"),
        )
        .reset_index()
    )
    total = {c: "total" for c in by} | {
        "runs": int(table["runs"].sum()),
        "gpu_hours": float(table["gpu_hours"].sum()),
        "mean_wallclock_min": float(runs["wallclock_s"].mean() / 60.0),
    }
    table[by] = table[by].astype(str)
    return pd.concat([table, pd.DataFrame([total])], ignore_index=True)


def compute_accounting(
    runs: pd.DataFrame, duration_s: float, overhead_s: float, gpu_model: str = DEFAULT_GPU
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Table 4 (runs and GPU-hours by GPUs per job, ``gpu_model`` sweep runs, repeats
    excluded, as in the paper's 155-run count) and Table 5 (the whole campaign by GPU
    model, set and kind of run: ``sweep`` = first run at a cap, ``repeat`` = the extras).
    """
    runs = runs.assign(
        wallclock_s=run_wallclock_s(runs, duration_s, overhead_s),
        kind=np.where(runs["repeat"].astype(int) > 0, "repeat", "sweep"),
    )
    sweep = runs[(runs["kind"] == "sweep") & (runs["gpu_model"] == gpu_model)]
    table4 = _accounting(
        sweep.assign(gpus_per_cluster=sweep["gpus"].astype(int)), ["gpus_per_cluster"]
    )
    table5 = _accounting(runs, ["gpu_model", "set", "kind"])
    return table4, table5


# ---- Published side-by-side ---------------------------------------------------------------------


def table9_beside_published(table9: pd.DataFrame, paper_dir: str) -> pd.DataFrame:
    """Table 9 (PFI at six caps and at four) with the paper's numbers beside it, by group
    (``*_published`` columns; NaN where the paper's table is absent or lacks the group).
    """
    return beside_published(
        table9,
        load_published(paper_dir, "table9_grid_sensitivity"),
        "group",
        ["pfi_6caps", "pfi_4caps", "delta", "delta_pct"],
    )


def table8_beside_published(table8: pd.DataFrame, paper_dir: str) -> pd.DataFrame:
    """Table 8 (H200 vs H100 PFI) with the paper's numbers beside it, by (model, task); the paper's
    task names are mapped to ours first.
    """
    pub = load_published(paper_dir, "table8_h100_vs_h200")
    if pub is not None:
        pub = pub.assign(task=task_key(pub["task"]))
    return beside_published(table8, pub, ["model", "task"], ["n_caps_h100", "pfi_h200", "pfi_h100"])


def table4_beside_published(table4: pd.DataFrame, paper_dir: str) -> pd.DataFrame:
    """Table 4 (compute used: runs, mean wall-clock minutes, GPU-hours) with the paper's numbers
    beside it, by GPUs per cluster.
    """
    pub = load_published(paper_dir, "table4_compute")
    if pub is not None:
        pub = pub.assign(gpus_per_cluster=pub["gpus_per_cluster"].astype(str))
    return beside_published(
        table4, pub, "gpus_per_cluster", ["runs", "mean_wallclock_min", "gpu_hours"]
    )


def summary_rows(table: str, values: dict[str, Any]) -> list[dict[str, Any]]:
    """Scalar results as rows ``table, metric, value, published, published_source``."""
    rows = []
    for metric, value in values.items():
        pub, source = PUBLISHED_SCALARS.get((table, metric), (np.nan, ""))
        rows.append(
            {
                "table": table,
                "metric": metric,
                "value": value,
                "published": pub,
                "published_source": source,
            }
        )
    return rows
