"""What an ingested campaign supports, in numbers: PFI status counts, robust vs ratio PFI,
which downstream stages apply (and why not), and the report that says so. Its figure is
``wattflex.plots.ingest``.

Ingested data often lacks what some stages need (no telemetry -> no predictor or
telemetry correlations; one cluster -> no cluster tests; no ``matches`` -> no H100
comparison). ``stage_applicability`` decides from the data itself and says why, so the
report states what was skipped instead of a stage crashing on missing columns.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd
from scipy import stats

# Groups of pfi.status values, as the report counts them.
STATUS_BUCKETS = {
    "ok": ("ok",),
    "non-binding cap": ("nonbinding_cap",),
    "ill-conditioned ratio": ("capped_faster", "capped_more_power", "ill_conditioned"),
    "other": (
        "too_few_caps",
        "missing_uncapped",
        "non_monotone",
        "invalid_values",
        "too_few_binding",
        "no_throughput_loss",
    ),
}
# Steady-state telemetry the predictor and the correlations need on the uncapped runs.
PREDICTOR_METRICS = ("dram_active", "mem_copy_util")
GROUP_TABLE_COLUMNS = [
    "group",
    "gpu_model",
    "model",
    "gpus",
    "n_caps",
    "n_binding",
    "pfi_ratio",
    "pfi_robust",
    "pfi_robust_ci95_low",
    "pfi_robust_ci95_high",
    "status",
    "robust_status",
    "bucket",
]


def status_bucket(status: str) -> str:
    """The report's bucket of a PFI status (``ok``, ``non-binding cap``, ``ill-conditioned ratio``...;
    ``other`` for a status no bucket lists).
    """
    return next((b for b, members in STATUS_BUCKETS.items() if status in members), "other")


def status_counts(pfi: pd.DataFrame) -> pd.DataFrame:
    """Groups per (bucket, status) and per robust_status, with totals; one tidy table."""
    rows = []
    for status, n in pfi["status"].value_counts().items():
        rows.append(
            {"column": "status", "bucket": status_bucket(status), "value": status, "groups": int(n)}
        )
    for status, n in pfi["robust_status"].value_counts().items():
        rows.append(
            {
                "column": "robust_status",
                "bucket": "robust PFI defined" if status == "ok" else "robust PFI NaN",
                "value": status,
                "groups": int(n),
            }
        )
    order = {
        b: i for i, b in enumerate(list(STATUS_BUCKETS) + ["robust PFI defined", "robust PFI NaN"])
    }
    out = pd.DataFrame(rows, columns=["column", "bucket", "value", "groups"])
    return out.sort_values(
        ["column", "bucket", "groups"],
        key=lambda s: s.map(order) if s.name == "bucket" else s,
        ascending=[False, True, False],
    ).reset_index(drop=True)


def group_table(pfi: pd.DataFrame) -> pd.DataFrame:
    """The ingest report's per-group table: the PFI table's columns the report shows (NaN where
    absent) with each status's bucket, sorted by GPU model and group.
    """
    out = pfi.copy()
    out["bucket"] = out["status"].map(status_bucket)
    for col in GROUP_TABLE_COLUMNS:
        if col not in out:
            out[col] = np.nan
    return out[GROUP_TABLE_COLUMNS].sort_values(["gpu_model", "group"]).reset_index(drop=True)


def robust_vs_ratio(pfi: pd.DataFrame) -> dict[str, Any]:
    """How the robust PFI relates to Eq. 1's ratio, overall and where the ratio is ``ok``."""
    ratio, robust = pfi["pfi_ratio"].to_numpy(float), pfi["pfi_robust"].to_numpy(float)
    both = np.isfinite(ratio) & np.isfinite(robust)
    ok = both & (pfi["status"] == "ok").to_numpy()
    out: dict[str, Any] = {
        "groups": int(len(pfi)),
        "ratio_finite": int(np.isfinite(ratio).sum()),
        "ratio_below_1": int((ratio < 1).sum()),
        "ratio_negative": int((ratio < 0).sum()),
        "ratio_above_10": int((ratio > 10).sum()),
        "robust_defined": int(np.isfinite(robust).sum()),
        "robust_below_1": int((robust < 1).sum()),
        "median_ratio_all": float(np.nanmedian(ratio))
        if np.isfinite(ratio).any()
        else float("nan"),
        "median_robust_all": float(np.nanmedian(robust))
        if np.isfinite(robust).any()
        else float("nan"),
        "median_ratio_ok": float(np.median(ratio[ok])) if ok.any() else float("nan"),
        "median_robust_ok": float(np.median(robust[ok])) if ok.any() else float("nan"),
        "max_abs_diff_ok": float(np.max(np.abs(ratio[ok] - robust[ok])))
        if ok.any()
        else float("nan"),
    }
    out["spearman_all"] = (
        float(stats.spearmanr(ratio[both], robust[both])[0]) if both.sum() > 2 else float("nan")
    )
    out["spearman_ok"] = (
        float(stats.spearmanr(ratio[ok], robust[ok])[0]) if ok.sum() > 2 else float("nan")
    )
    return out


def by_gpu_model(pfi: pd.DataFrame) -> pd.DataFrame:
    """Per GPU model: groups, ratio ok, robust defined, median ratio / robust PFI."""
    g = pfi.assign(ratio_ok=pfi["status"] == "ok", robust_ok=pfi["robust_status"] == "ok").groupby(
        "gpu_model"
    )
    return pd.DataFrame(
        {
            "groups": g.size(),
            "ratio_ok": g["ratio_ok"].sum(),
            "robust_defined": g["robust_ok"].sum(),
            "median_pfi_ratio": g["pfi_ratio"].median(),
            "median_pfi_robust": g["pfi_robust"].median(),
        }
    ).reset_index()


def stage_applicability(runs: pd.DataFrame, pfi: pd.DataFrame) -> list[dict[str, Any]]:
    """Which downstream stages this campaign's data supports: stage, applies, reason."""
    uncapped = runs.loc[runs.groupby("group")["cap_w"].idxmax()]
    has_tel = all(c in uncapped and uncapped[c].notna().any() for c in PREDICTOR_METRICS)
    tel_groups = int(uncapped[list(PREDICTOR_METRICS)].notna().all(axis=1).sum()) if has_tel else 0
    clusters = pfi["cluster"].dropna().value_counts() if "cluster" in pfi else pd.Series(dtype=int)
    big = clusters[clusters >= 2]
    matches = runs["matches"].fillna("").astype(str) if "matches" in runs else pd.Series(dtype=str)
    robust_ok = int((pfi["robust_status"] == "ok").sum())
    out = [
        {
            "stage": "PFI (published definitions + robust)",
            "applies": True,
            "reason": f"{len(pfi)} groups; robust PFI defined for {robust_ok}",
        },
        {
            "stage": "cluster statistics (Kruskal-Wallis, Dunn-Holm)",
            "applies": len(big) >= 2,
            "reason": (
                f"{len(big)} clusters with >= 2 groups: {', '.join(big.index)}"
                if len(big) >= 2
                else "needs >= 2 clusters with >= 2 groups each; the data has "
                + (", ".join(f"{k} ({v})" for k, v in clusters.items()) or "no cluster labels")
            ),
        },
        {
            "stage": "telemetry-PFI correlations and PFI predictor",
            "applies": tel_groups >= 3,
            "reason": (
                f"{tel_groups} groups have {' and '.join(PREDICTOR_METRICS)} on their uncapped run"
                if tel_groups >= 3
                else "needs steady-state DCGM telemetry ("
                + ", ".join(PREDICTOR_METRICS)
                + ") on the uncapped run "
                f"of >= 3 groups; {tel_groups} have it (sweep tables without telemetry columns)"
            ),
        },
        {
            "stage": "H100 vs H200 comparison (Table 8)",
            "applies": bool((matches != "").any()),
            "reason": "groups with a 'matches' partner"
            if (matches != "").any()
            else "no group names a 'matches' partner",
        },
        {
            "stage": "allocation simulation (oracle / equal weight / PFI-aware)",
            "applies": robust_ok >= 2,
            "reason": (
                "measured power-throughput curves; without a telemetry predictor, PFI-aware uses the measured "
                "robust PFI"
                if not tel_groups >= 3
                else "measured curves and predicted PFI"
            ),
        },
    ]
    return out


def _md_table(df: pd.DataFrame, floatfmt: str = "{:.3f}") -> str:
    def cell(v: Any) -> str:
        if isinstance(v, (float, np.floating)):
            return "" if not np.isfinite(v) else floatfmt.format(v)
        return str(v)

    head = "| " + " | ".join(map(str, df.columns)) + " |"
    sep = "| " + " | ".join("---" for _ in df.columns) + " |"
    body = ["| " + " | ".join(cell(v) for v in row) + " |" for row in df.itertuples(index=False)]
    return "\n".join([head, sep, *body])


def report_markdown(
    campaign: str,
    ingest_summary: dict[str, Any],
    rejected: pd.DataFrame,
    runs: pd.DataFrame,
    pfi: pd.DataFrame,
    figure: str,
) -> str:
    """The ingest report (markdown): sources, rejected rows, PFI status, robust vs ratio, stages."""
    counts = status_counts(pfi)
    cmp_ = robust_vs_ratio(pfi)
    buckets = counts[counts["column"] == "status"].groupby("bucket", sort=False)["groups"].sum()
    lines = [
        f"# Ingest report: {campaign}",
        "",
        "Measured data from elsewhere (backend `ingest`, not emulated): "
        f"{ingest_summary['n_runs']} runs of {ingest_summary['n_groups']} sweep groups from "
        f"{len(ingest_summary['inputs'])} file(s); throughput in "
        f"{', '.join(ingest_summary.get('throughput_units', [])) or 'the source unit'} "
        "(PFI is unit-free: every throughput is relative to its group's uncapped run).",
        "",
        "Sources: " + ", ".join(f"`{p}`" for p in ingest_summary["inputs"]),
        "",
        f"Rejected rows: {len(rejected)}"
        + (" (listed below; left out of runs.parquet)" if len(rejected) else ""),
    ]
    if len(rejected):
        lines += ["", _md_table(rejected.head(50))]
    if ingest_summary.get("notes"):
        lines += ["", "Notes: " + "; ".join(ingest_summary["notes"])]
    lines += [
        "",
        "## PFI status",
        "",
        "Groups by `status` (the most severe diagnosis of the published ratio, Eq. 1): "
        + ", ".join(f"**{b}: {int(n)}**" for b, n in buckets.items())
        + ".",
        "",
        _md_table(counts),
        "",
        "## Robust vs ratio PFI",
        "",
        f"![robust vs ratio PFI]({figure})",
        "",
        f"- ratio PFI finite for {cmp_['ratio_finite']} of {cmp_['groups']} groups; negative for "
        f"{cmp_['ratio_negative']}, below 1 for {cmp_['ratio_below_1']}, above 10 for {cmp_['ratio_above_10']}.",
        f"- robust PFI defined for {cmp_['robust_defined']} groups (below 1 for {cmp_['robust_below_1']}); "
        f"median {cmp_['median_robust_all']:.3f} (ratio over all finite groups: {cmp_['median_ratio_all']:.3f}).",
        f"- on the groups whose ratio is `ok`: median ratio {cmp_['median_ratio_ok']:.3f}, median robust "
        f"{cmp_['median_robust_ok']:.3f}, Spearman {cmp_['spearman_ok']:.3f}, largest |difference| "
        f"{cmp_['max_abs_diff_ok']:.3f}. Spearman over all groups with both defined: {cmp_['spearman_all']:.3f}.",
        "",
        _md_table(by_gpu_model(pfi)),
        "",
        "## Downstream stages",
        "",
        _md_table(
            pd.DataFrame(stage_applicability(runs, pfi)).assign(
                applies=lambda d: d["applies"].map({True: "yes", False: "skipped"})
            )
        ),
        "",
        "The per-group table is `tables/pfi_groups.csv`; per-cap diagnostics are in `pfi.parquet` (`per_cap`).",
        "",
    ]
    return "\n".join(lines)
