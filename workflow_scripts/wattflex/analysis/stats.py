"""Cluster statistics: Kruskal–Wallis, Dunn–Holm, and telemetry–PFI correlations with BH-FDR.

The paper (§4, Tables 10–11) compares PFI across three clusters (dense = PT + FT pooled,
MoE pretraining, MoE fine-tuning) with a Kruskal–Wallis test followed by Dunn's test on all
pairs with Holm's correction. The tests themselves come from scipy and scikit-posthocs;
this module only adds what those do not return: the signed Dunn z per pair (same tie
correction as scikit-posthocs, so its p-values agree — see tests), group sizes, medians,
and the list of tied values, because ties (e.g. PFI rounded to 2 decimals) change the
ranks and therefore H, z and p.
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from itertools import combinations
from typing import Any

import numpy as np
import pandas as pd

from wattflex.schema import section_defaults
from wattflex.vocabulary import CLUSTERS

_STATS = section_defaults("stats")  # p_adjust, alpha: kruskal_dunn's and `wattflex stats`'s

#: The paper's clusters in the order its Tables 10–11 use.
CLUSTER_ORDER = CLUSTERS  # the paper's (wattflex.vocabulary)


def _clean(df: pd.DataFrame, value_col: str, group_col: str) -> pd.DataFrame:
    missing = [c for c in (value_col, group_col) if c not in df.columns]
    if missing:
        raise ValueError(f"missing column(s) {missing}; available: {list(df.columns)}")
    values = pd.to_numeric(df[value_col], errors="coerce")
    bad = df[value_col].notna() & values.isna()
    if bad.any():
        raise ValueError(
            f"column {value_col!r} has non-numeric values: {df.loc[bad, value_col].head(3).tolist()}"
        )
    out = pd.DataFrame({"value": values, "group": df[group_col].astype("string")})
    return out.dropna().reset_index(drop=True)


def group_order(groups: pd.Series, order: Sequence[str] | None = None) -> list[str]:
    """Groups in ``order`` first (those present), then the rest in order of appearance."""
    present = list(dict.fromkeys(groups))
    ordered = [g for g in (order or ()) if g in present]
    return ordered + [g for g in present if g not in ordered]


def dunn_z(values: Sequence[float], groups: Sequence[str], a: str, b: str) -> float:
    """Signed Dunn z for groups ``a`` vs ``b``: (mean rank a − mean rank b) / SE.

    Ranks are mid-ranks over all observations; the variance uses the standard tie
    correction (Dunn 1964; Glantz 2012):
    ``SE² = (N(N+1)/12 − Σ(t³−t) / (12(N−1))) · (1/n_a + 1/n_b)``,
    the same expression scikit-posthocs uses, so ``2·Φ(−|z|)`` is its raw p.
    """
    from scipy.stats import rankdata

    values = np.asarray(values, dtype=float)
    groups = np.asarray(groups)
    n = values.size
    ranks = rankdata(values)
    _, tie_counts = np.unique(values, return_counts=True)
    tie_term = np.sum(tie_counts.astype(float) ** 3 - tie_counts) / (12.0 * (n - 1))
    in_a, in_b = groups == a, groups == b
    se = np.sqrt((n * (n + 1) / 12.0 - tie_term) * (1.0 / in_a.sum() + 1.0 / in_b.sum()))
    return float((ranks[in_a].mean() - ranks[in_b].mean()) / se)


def tied_values(df: pd.DataFrame, value_col: str, group_col: str) -> list[dict[str, Any]]:
    """Each value shared by more than one row, with the groups holding it."""
    clean = _clean(df, value_col, group_col)
    out = []
    for value, rows in clean.groupby("value", sort=True):
        if len(rows) > 1:
            out.append(
                {
                    "value": float(value),
                    "count": int(len(rows)),
                    "groups": sorted(rows["group"].unique().tolist()),
                    "across_groups": bool(rows["group"].nunique() > 1),
                }
            )
    return out


def _number(x: Any) -> float | None:
    """A statistic as JSON has it: None where it is undefined (NaN), never NaN."""
    x = float(x)
    return x if np.isfinite(x) else None


def check_p_adjust(method: str, where: str = "p_adjust") -> None:
    """``method`` must be one statsmodels' ``multipletests`` takes (it is tried on one p-value:
    its aliases count too); else a ``ValueError`` naming ``where`` and the methods, not
    statsmodels' bare "method not recognized" after the table is read."""
    from statsmodels.stats.multitest import multipletests, multitest_methods_names

    try:
        multipletests([0.5], method=method)
    except (ValueError, AttributeError, TypeError):
        raise ValueError(
            f"{where} {method!r}: not a multiple-comparison method of statsmodels; one of "
            f"{', '.join(multitest_methods_names)} (or their long names, e.g. holm, bonferroni)"
        ) from None


def kruskal_dunn(
    df: pd.DataFrame,
    value_col: str = "pfi_ratio",
    group_col: str = "cluster",
    order: Sequence[str] | None = CLUSTER_ORDER,
    p_adjust: str = _STATS["p_adjust"],
    alpha: float = _STATS["alpha"],
) -> dict[str, Any]:
    """Kruskal–Wallis across groups, then Dunn's test on every pair with ``p_adjust``.

    Rows with a missing value or group are dropped (counted in ``n_dropped``). Returns a
    JSON-able dict: ``kruskal {H, df, p, n}``, ``dunn [{a, b, n_a, n_b, mean_rank_a,
    mean_rank_b, z, p_raw, p_holm, significant}]`` (``p_holm`` holds the ``p_adjust``
    result, named after the default), ``groups [{group, n, median, mean, min, max}]`` and
    ``ties``. Pairs follow ``order`` (a before b), e.g. dense vs moe-pt, dense vs moe-ft,
    moe-pt vs moe-ft; a negative z means ``a`` ranks lower than ``b``.
    """
    import scikit_posthocs as sp
    from scipy.stats import kruskal, rankdata

    check_p_adjust(p_adjust)
    clean = _clean(df, value_col, group_col)
    names = group_order(clean["group"], order)
    if (
        len(names) < 2
    ):  # nothing to compare: the result says so (status not_tested), the analysis goes on
        return _not_tested(df, clean, names, value_col, group_col, p_adjust, alpha)
    samples = [clean.loc[clean["group"] == g, "value"].to_numpy() for g in names]
    # All values equal: ranks carry no information, and every statistic divides 0 by 0.
    # Say so (null with a reason) rather than NaN and SciPy's RuntimeWarnings.
    undefined = (
        f"undefined: all {len(clean)} values are equal ({clean['value'].iloc[0]:g}), so ranks "
        "carry no information"
        if clean["value"].nunique() == 1
        else None
    )
    with warnings.catch_warnings(), np.errstate(invalid="ignore", divide="ignore"):
        warnings.simplefilter("ignore", RuntimeWarning)
        h, p = kruskal(*samples)  # tie-corrected H
        pvals = sp.posthoc_dunn(clean, val_col="value", group_col="group")
        padj = sp.posthoc_dunn(clean, val_col="value", group_col="group", p_adjust=p_adjust)
        z = {
            (a, b): dunn_z(clean["value"], clean["group"], a, b) for a, b in combinations(names, 2)
        }
    ranks = pd.Series(rankdata(clean["value"]), index=clean.index)
    sizes = clean.groupby("group")["value"].size()
    dunn = []
    for a, b in combinations(names, 2):
        dunn.append(
            {
                "a": a,
                "b": b,
                "n_a": int(sizes[a]),
                "n_b": int(sizes[b]),
                "mean_rank_a": float(ranks[clean["group"] == a].mean()),
                "mean_rank_b": float(ranks[clean["group"] == b].mean()),
                "z": _number(z[a, b]),
                "p_raw": _number(pvals.loc[a, b]),
                "p_holm": _number(padj.loc[a, b]),
                "significant": bool(padj.loc[a, b] < alpha),
                **({"note": undefined} if undefined else {}),
            }
        )
    summary = _group_summaries(names, samples)
    return {
        "value_col": value_col,
        "group_col": group_col,
        "p_adjust": p_adjust,
        "alpha": alpha,
        "n_dropped": int(len(df) - len(clean)),
        "kruskal": {
            "H": _number(h),
            "df": len(names) - 1,
            "p": _number(p),
            "n": int(len(clean)),
            "groups": names,
            **({"note": undefined} if undefined else {}),
        },
        "dunn": dunn,
        "groups": summary,
        "ties": tied_values(clean, "value", "group"),
    }


def _group_summaries(names: list[Any], samples: list[np.ndarray]) -> list[dict[str, Any]]:
    """Size, median, mean and range of each group's sample."""
    return [
        {
            "group": g,
            "n": int(s.size),
            "median": float(np.median(s)),
            "mean": float(np.mean(s)),
            "min": float(np.min(s)),
            "max": float(np.max(s)),
        }
        for g, s in zip(names, samples)
    ]


def _not_tested(
    df: pd.DataFrame,
    clean: pd.DataFrame,
    names: list[Any],
    value_col: str,
    group_col: str,
    p_adjust: str,
    alpha: float,
) -> dict[str, Any]:
    """The result of :func:`kruskal_dunn` on fewer than 2 groups: no statistic, the reason."""
    reason = f"need at least 2 groups in {group_col!r} to compare, found {len(names)} ({', '.join(map(str, names)) or 'none'})"
    summary = _group_summaries(
        names, [clean.loc[clean["group"] == g, "value"].to_numpy() for g in names]
    )
    return {
        "value_col": value_col,
        "group_col": group_col,
        "p_adjust": p_adjust,
        "alpha": alpha,
        "status": "not_tested",
        "reason": reason,
        "n_dropped": int(len(df) - len(clean)),
        "kruskal": {
            "H": None,
            "df": 0,
            "p": None,
            "n": int(len(clean)),
            "groups": names,
            "note": reason,
        },
        "dunn": [],
        "groups": summary,
        "ties": tied_values(clean, "value", "group"),
    }


def cluster_tests_table(result: dict[str, Any]) -> pd.DataFrame:
    """The result of :func:`kruskal_dunn` as rows shaped like the paper's Tables 10–11."""
    kw = result["kruskal"]
    rows = [
        {
            "test": "kruskal_wallis",
            "comparison": "|".join(kw["groups"]),
            "n": str(kw["n"]),
            "statistic": kw["H"],
            "p_raw": kw["p"],
            "p_holm": np.nan,
        }
    ]
    for d in result["dunn"]:
        rows.append(
            {
                "test": "dunn",
                "comparison": f"{d['a']} vs {d['b']}",
                "n": f"{d['n_a']}|{d['n_b']}",
                "statistic": d["z"],
                "p_raw": d["p_raw"],
                "p_holm": d["p_holm"],
            }
        )
    return pd.DataFrame(rows)


def bh_fdr(pvalues: Sequence[float]) -> np.ndarray:
    """Benjamini–Hochberg q-values; NaN p-values stay NaN and do not count in m."""
    from scipy.stats import false_discovery_control

    p = np.asarray(pvalues, dtype=float)
    q = np.full_like(p, np.nan)
    ok = ~np.isnan(p)
    if ok.any():
        q[ok] = false_discovery_control(p[ok], method="bh")
    return q


def telemetry_correlations(
    groups: pd.DataFrame, metrics: Sequence[str], target: str = "pfi"
) -> pd.DataFrame:
    """OLS slope and Spearman rho of ``target`` on each metric, BH-FDR across all metrics.

    ``groups`` has one row per group (telemetry of the uncapped run and the measured
    PFI). A metric that is absent, constant or has fewer than 3 finite pairs gets NaN
    statistics and a ``note``, and is left out of the FDR family. ``bh_q`` is computed
    on the Spearman p-values (the paper reports rank correlations); ``ols_q`` on the OLS
    slope p-values.
    """
    from scipy.stats import linregress, spearmanr

    rows = []
    for metric in metrics:
        row = {
            "metric": metric,
            "n": 0,
            "ols_slope": np.nan,
            "ols_intercept": np.nan,
            "ols_r2": np.nan,
            "ols_p": np.nan,
            "spearman_rho": np.nan,
            "spearman_p": np.nan,
            "note": "",
        }
        if metric not in groups.columns:
            rows.append({**row, "note": "absent"})
            continue
        pair = groups[[metric, target]].apply(pd.to_numeric, errors="coerce")
        pair = pair[np.isfinite(pair).all(axis=1)]
        row["n"] = len(pair)
        if len(pair) < 3:
            row["note"] = "fewer than 3 finite values"
        elif pair[metric].nunique() < 2:
            row["note"] = "constant"
        else:
            fit = linregress(pair[metric], pair[target])
            rho, sp_p = spearmanr(pair[metric], pair[target])
            row.update(
                ols_slope=fit.slope,
                ols_intercept=fit.intercept,
                ols_r2=fit.rvalue**2,
                ols_p=fit.pvalue,
                spearman_rho=rho,
                spearman_p=sp_p,
            )
        rows.append(row)
    out = pd.DataFrame(rows)
    out["bh_q"] = bh_fdr(out["spearman_p"])
    out["ols_q"] = bh_fdr(out["ols_p"])
    cols = [
        "metric",
        "n",
        "ols_slope",
        "ols_p",
        "spearman_rho",
        "spearman_p",
        "bh_q",
        "ols_q",
        "ols_intercept",
        "ols_r2",
        "note",
    ]
    return out[cols]
