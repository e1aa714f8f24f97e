"""Predict PFI from the uncapped run's telemetry, without a power-cap sweep (paper §5).

Features come from the telemetry of each group's uncapped run (its highest ``cap_w``;
repeats at that cap are averaged):

- ``dram_copy_product`` = ``dram_active`` × ``mem_copy_util``, with ``dram_active`` the
  DCGM ``PROF_DRAM_ACTIVE`` fraction (0–1) and ``mem_copy_util`` the DCGM
  ``DEV_MEM_COPY_UTIL`` percentage (0–100), so the product lies in 0–100 (a job whose
  DRAM is busy 60% of the time at 40% copy utilisation scores 24). Coefficients in a saved
  model refer to this scaling.
- ``arithmetic_intensity`` = ``tensor_active`` / ``dram_active`` (both 0–1 fractions).
- ``job_metadata`` = ``is_moe`` (architecture == "moe"), ``is_lora`` (task is LoRA/FT)
  and ``log2_gpus``.
- ``all_dcgm`` = every job-level DCGM-style metric in ``runs.parquet`` that varies across
  the training groups (the paper used 13; the emulated backend records the 10 in
  :func:`dcgm_metrics`; limits and constant columns carry no information and are skipped).

Models are ordinary least squares (scikit-learn). Evaluation follows Table 3: in-sample
R², then leave-one-out (LOO) and leave-one-cluster-out (LOCO) predictions pooled over the
folds, scored by R² (against the pooled mean), RMSE and Spearman rho.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np
import pandas as pd

from wattflex.metrics import descriptions, predictor_metrics
from wattflex.pfi_model import (
    DERIVED_INPUTS,
    NOT_FITTED,
    add_features,
    dcgm_metrics,
    design_matrix,
    is_fitted,
    predict,
)
from wattflex.schema import section_defaults
from wattflex.vocabulary import CLUSTERS, LORA_TASK_NAMES

JOB_METADATA = ("is_moe", "is_lora", "log2_gpus")

# Features that are not one telemetry metric (those come from the registry, wattflex.metrics).
_OWN_DEFINITIONS = {
    "dram_copy_product": "dram_active (DCGM_FI_PROF_DRAM_ACTIVE, 0-1) x mem_copy_util "
    "(DCGM_FI_DEV_MEM_COPY_UTIL, %), range 0-100",
    "arithmetic_intensity": "tensor_active / dram_active (both 0-1 fractions)",
    "is_moe": "1 if architecture == 'moe' else 0",
    "is_lora": f"1 if task is LoRA fine-tuning ({', '.join(map(repr, LORA_TASK_NAMES))}) else 0",
    "log2_gpus": "log2(number of GPUs of the job)",
    "power_per_gpu_w": "mean board power per GPU (W)",
}


def feature_definitions() -> dict[str, str]:
    """Each predictor feature's name mapped to its one-line meaning (the metrics' own descriptions
    plus the predictor's derived features), for the model card.
    """
    metric_text = descriptions()
    return {**_OWN_DEFINITIONS, **{m: metric_text[m] for m in predictor_metrics()}}


def __getattr__(name: str) -> Any:
    """``DCGM_METRICS``, ``CORRELATION_METRICS`` (correlated with PFI, Fig. 5/14 analog: the
    DCGM set, job power, the composites) and ``FEATURE_DEFINITIONS``, from the registry."""
    if name == "DCGM_METRICS":
        return dcgm_metrics()
    if name == "CORRELATION_METRICS":
        return dcgm_metrics() + ("power_w", "dram_copy_product", "arithmetic_intensity")
    if name == "FEATURE_DEFINITIONS":
        return feature_definitions()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


#: The paper's seven ablation feature sets (Table 3), in its order.
ABLATION_SETS = (
    "dram_copy_product",
    "arithmetic_intensity",
    "dram_copy_product+arithmetic_intensity",
    "job_metadata",
    "dram_copy_product+job_metadata",
    "all_dcgm",
    "all_dcgm+job_metadata",
)


def uncapped_telemetry(runs: pd.DataFrame) -> pd.DataFrame:
    """One row per group: the run(s) at the group's highest cap, repeats averaged.

    Numeric columns are averaged over repeats; the other columns (metadata) are taken
    from the first repeat.
    """
    top = runs[runs["cap_w"] == runs.groupby("group")["cap_w"].transform("max")]
    numeric = [c for c in top.select_dtypes("number").columns if c != "repeat"]
    other = [c for c in top.columns if c not in numeric and c != "group"]
    means = top.groupby("group", sort=False)[numeric].mean()
    firsts = top.groupby("group", sort=False)[other].first()
    return firsts.join(means).reset_index()


def group_table(runs: pd.DataFrame, pfi: pd.DataFrame, target: str = "pfi_ratio") -> pd.DataFrame:
    """Uncapped telemetry + derived features + measured PFI (column ``pfi``), one row per group."""
    groups = add_features(uncapped_telemetry(runs))
    keep = ["group", target] + [c for c in ("status", "n_caps") if c in pfi.columns]
    measured = pfi[keep].rename(columns={target: "pfi"})
    return groups.merge(measured, on="group", how="left")


def resolve_features(spec: str | Sequence[str], df: pd.DataFrame | None = None) -> list[str]:
    """Feature columns of a spec like ``"dram_copy_product+job_metadata"`` (or a list).

    ``job_metadata`` and ``all_dcgm`` expand to their columns; with ``df`` given,
    ``all_dcgm`` keeps only metrics present, finite somewhere and not constant in ``df``.
    """
    parts = spec.split("+") if isinstance(spec, str) else list(spec)
    cols: list[str] = []
    for part in (p.strip() for p in parts):
        if part == "job_metadata":
            cols += JOB_METADATA
        elif part == "all_dcgm":
            cols += [
                m
                for m in dcgm_metrics()
                if df is None
                or (
                    m in df.columns
                    and pd.to_numeric(df[m], errors="coerce").nunique(dropna=True) > 1
                )
            ]
        elif part in feature_definitions():
            cols.append(part)
        else:
            raise ValueError(
                f"unknown feature {part!r}; known: {sorted(feature_definitions())} "
                f"and the sets job_metadata, all_dcgm"
            )
    return list(dict.fromkeys(cols))


def _ols():
    from sklearn.linear_model import LinearRegression

    return LinearRegression()


def scores(y: np.ndarray, pred: np.ndarray) -> dict[str, float]:
    """R² (vs the mean of ``y``), RMSE and Spearman rho of predictions."""
    from scipy.stats import spearmanr
    from sklearn.metrics import mean_squared_error, r2_score

    return {
        "r2": float(r2_score(y, pred)),
        "rmse": float(np.sqrt(mean_squared_error(y, pred))),
        "spearman": float(spearmanr(y, pred)[0]) if len(y) > 2 else float("nan"),
    }


def cv_predictions(X: np.ndarray, y: np.ndarray, folds: Sequence[Any] | None = None) -> np.ndarray:
    """Out-of-fold OLS predictions: leave-one-out, or leave-one-group-out over ``folds``."""
    from sklearn.model_selection import LeaveOneGroupOut, LeaveOneOut, cross_val_predict

    if folds is None:
        return cross_val_predict(_ols(), X, y, cv=LeaveOneOut())
    return cross_val_predict(_ols(), X, y, cv=LeaveOneGroupOut(), groups=np.asarray(folds))


def evaluate(
    df: pd.DataFrame, features: Sequence[str], target: str = "pfi", cluster_col: str = "cluster"
) -> dict[str, float]:
    """Table 3 metrics of an OLS on ``features``: p, in-sample R², LOO and LOCO scores."""
    X, y = design_matrix(df, features), df[target].to_numpy(dtype=float)
    fitted = _ols().fit(X, y).predict(X)
    out: dict[str, float] = {"p": len(features), "n": len(y), "r2_in": scores(y, fitted)["r2"]}
    for name, folds in (("loo", None), ("loco", df[cluster_col].to_numpy())):
        if folds is not None and len(set(folds)) < 2:
            out.update({f"{name}_r2": np.nan, f"{name}_rmse": np.nan, f"{name}_spearman": np.nan})
            continue
        s = scores(y, cv_predictions(X, y, folds))
        out.update(
            {f"{name}_r2": s["r2"], f"{name}_rmse": s["rmse"], f"{name}_spearman": s["spearman"]}
        )
    return out


def telemetry_sources(runs: pd.DataFrame, allow_mixed: bool = False) -> list[str]:
    """The telemetry sources of a campaign's runs (``runs.parquet``'s ``telemetry_source``:
    nvml, dcgm, steps, emulated; absent in older tables: []). Several are refused unless
    ``allow_mixed`` (``predictor.allow_mixed_sources``): DCGM's profiling fields and NVML GPM's
    are not the same counters, so one model over both fits a difference of instruments."""
    if "telemetry_source" not in runs.columns:
        return []
    counts = runs["telemetry_source"].dropna().astype(str).value_counts().sort_index()
    if len(counts) > 1 and not allow_mixed:
        mix = ", ".join(f"{src}: {n} run(s)" for src, n in counts.items())
        raise ValueError(
            f"runs.parquet: the campaign's runs mix telemetry sources ({mix}); the predictor's "
            f"features would come from different counters. Rerun them with one cuda.telemetry "
            f"(nvml or dcgm), or set predictor.allow_mixed_sources: true to fit over the mix"
        )
    return list(counts.index)


#: Groups an OLS with intercept and a leave-one-out score needs at the least.
MIN_TRAIN_GROUPS = 3

#: Columns of the tables fit_predictor writes, empty when the model is not fitted.
ABLATION_COLUMNS = [
    "predictors",
    "p",
    "r2_in",
    "loo_r2",
    "loo_rmse",
    "loo_spearman",
    "loco_r2",
    "loco_rmse",
    "loco_spearman",
    "n",
    "features",
]
HOLDOUT_COLUMNS = ["set", "n", "prediction", "r2", "rmse", "spearman"]
LEVERAGE_COLUMNS = [
    "k",
    "n",
    "dropped_group",
    "dropped_leverage",
    "spearman_rho",
    "spearman_p",
    "r2_in",
    "loo_r2",
]
WITHIN_CLUSTER_COLUMNS = ["subset", "clusters", "n", "spearman_rho", "spearman_p"]


class TooFewGroups(ValueError):
    """Too few groups to fit the predictor on: the campaign's analysis records it (a model
    that says ``not_fitted`` and why) and goes on."""


def training_rows(
    groups: pd.DataFrame, train_set: str = section_defaults("predictor")["train_set"]
) -> pd.DataFrame:
    """Groups the predictor is trained on: the ``train_set`` with a finite measured PFI."""
    rows = groups[np.isfinite(groups["pfi"].astype(float))]
    if "set" in rows.columns and train_set:
        rows = rows[rows["set"] == train_set]
    if len(rows) < MIN_TRAIN_GROUPS:
        raise TooFewGroups(
            f"need at least {MIN_TRAIN_GROUPS} groups with a finite PFI in set {train_set!r} "
            f"(predictor.train_set), have {len(rows)}"
        )
    return rows.reset_index(drop=True)


def not_fitted_model(spec: str, reason: str) -> dict[str, Any]:
    """The model document of a predictor that could not be fitted: no features, no
    coefficients, the ``reason`` (what a figure and the report show)."""
    return {
        "kind": "ols",
        "status": NOT_FITTED,
        "reason": reason,
        "feature_spec": spec,
        "features": [],
        "coefficients": {},
        "training_groups": [],
        "n_train": 0,
    }


def ablation(train: pd.DataFrame, feature_sets: Iterable[str] = ABLATION_SETS) -> pd.DataFrame:
    """The paper's Table 3 on ``train``: one row per feature set."""
    rows = []
    for spec in feature_sets:
        features = resolve_features(spec, train)
        if (
            not features
        ):  # e.g. all_dcgm where no metric varies across the groups: no model to score
            rows.append({"predictors": spec, "p": 0, "n": len(train), "features": ""})
            continue
        rows.append(
            {"predictors": spec, **evaluate(train, features), "features": "+".join(features)}
        )
    return pd.DataFrame(rows)[ABLATION_COLUMNS]


def leverage(X: np.ndarray) -> np.ndarray:
    """Diagonal of the hat matrix of an OLS with intercept on ``X`` (rank-deficient safe)."""
    X = np.asarray(X, dtype=float).reshape(len(X), -1)
    design = np.column_stack([np.ones(len(X)), X])
    u, s, _ = np.linalg.svd(design, full_matrices=False)
    rank = int(np.sum(s > s[0] * max(design.shape) * np.finfo(float).eps))
    return np.sum(u[:, :rank] ** 2, axis=1)


def leverage_sensitivity(
    train: pd.DataFrame, features: Sequence[str], k_max: int = 5
) -> pd.DataFrame:
    """Table 12: drop the k highest-leverage groups (k = 0..k_max), refit, rescore.

    Leverage is ranked once on the full training set; row k has the k highest removed.
    ``spearman_rho`` is between the refitted in-sample prediction and measured PFI (for a
    single feature with a positive slope, the feature's own rank correlation).
    """
    from scipy.stats import spearmanr

    h = leverage(design_matrix(train, features))
    order = np.argsort(-h, kind="stable")
    rows = []
    for k in range(0, min(k_max, len(train) - 3) + 1):
        kept = train.drop(index=train.index[order[:k]])
        X, y = design_matrix(kept, features), kept["pfi"].to_numpy(dtype=float)
        pred = _ols().fit(X, y).predict(X)
        rho, p = spearmanr(pred, y)
        rows.append(
            {
                "k": k,
                "n": len(kept),
                "dropped_group": train["group"].iloc[order[k - 1]] if k else "",
                "dropped_leverage": float(h[order[k - 1]]) if k else np.nan,
                "spearman_rho": float(rho),
                "spearman_p": float(p),
                "r2_in": scores(y, pred)["r2"],
                "loo_r2": scores(y, cv_predictions(X, y))["r2"],
            }
        )
    return pd.DataFrame(rows)


#: Table 13 subsets: name -> clusters included.
SUBGROUPS = {
    "dense only": ("dense",),
    "moe only": ("moe-pt", "moe-ft"),
    "all but moe-ft": ("dense", "moe-pt"),
    "all": CLUSTERS,
}


def within_cluster(
    train: pd.DataFrame, features: Sequence[str], cluster_col: str = "cluster"
) -> pd.DataFrame:
    """Table 13: Spearman rho of the full-data prediction vs PFI within subsets of clusters."""
    from scipy.stats import spearmanr

    X, y = design_matrix(train, features), train["pfi"].to_numpy(dtype=float)
    pred = _ols().fit(X, y).predict(X)
    rows = []
    for name, clusters in SUBGROUPS.items():
        mask = train[cluster_col].isin(clusters).to_numpy()
        rho, p = spearmanr(pred[mask], y[mask]) if mask.sum() > 2 else (np.nan, np.nan)
        rows.append(
            {
                "subset": name,
                "clusters": "|".join(clusters),
                "n": int(mask.sum()),
                "spearman_rho": float(rho),
                "spearman_p": float(p),
            }
        )
    return pd.DataFrame(rows)


def fit_model(
    train: pd.DataFrame, spec: str | Sequence[str], target: str = "pfi_ratio"
) -> dict[str, Any]:
    """Fit the chosen OLS and describe it as a JSON-able document (see :func:`predict`)."""
    features = resolve_features(spec, train)
    X, y = design_matrix(train, features), train["pfi"].to_numpy(dtype=float)
    reg = _ols().fit(X, y)
    return {
        "kind": "ols",
        "status": "fitted",
        "target": target,
        "feature_spec": spec if isinstance(spec, str) else "+".join(spec),
        "features": features,
        "feature_definitions": {f: feature_definitions()[f] for f in features},
        "required_columns": sorted({c for f in features for c in DERIVED_INPUTS.get(f, (f,))}),
        "coefficients": {f: float(c) for f, c in zip(features, reg.coef_)},
        "intercept": float(reg.intercept_),
        "training_groups": train["group"].tolist(),
        "n_train": len(train),
        "metrics": evaluate(train, features),
    }


#: Documented range of each numeric telemetry input (inclusive); every other numeric input
#: must be a finite number >= 0 (``temp_c``: any finite number).
FRACTIONS = ("dram_active", "sm_active", "tensor_active", "is_moe", "is_lora")
PERCENTS = ("mem_copy_util", "gpu_util", "dram_copy_product")
_ANY_SIGN = ("temp_c",)


def feature_inputs(features: Sequence[str]) -> list[str]:
    """The columns a row needs for ``features``: each feature, and what it is derived from."""
    cols: list[str] = []
    for f in features:
        cols += [f, *DERIVED_INPUTS.get(f, ())]
    return [c for c in dict.fromkeys(cols) if c not in ("architecture", "task")]


def input_problems(df: pd.DataFrame, columns: Iterable[str]) -> list[tuple[int, str]]:
    """``(row position, reason)`` for every value of the numeric ``columns`` (those present)
    outside its documented range: non-finite anywhere; a fraction (``FRACTIONS``, 0-1)
    above 1 (``looks like percent, divide by 100`` when it is at most 100); a percentage
    (``PERCENTS``) above 100; a negative value where the metric cannot be negative."""
    out: list[tuple[int, str]] = []
    for col in columns:
        if col not in df:
            continue
        values = pd.to_numeric(df[col], errors="coerce").to_numpy(float)
        for i, v in enumerate(values):
            if np.isnan(v):
                continue  # missing: design_matrix names it
            if not np.isfinite(v):
                out.append((i, f"{col} {v:g} is not a finite number"))
            elif col in _ANY_SIGN:
                continue
            elif v < 0:
                out.append((i, f"{col} {v:g} is negative"))
            elif col in FRACTIONS and v > 1:
                hint = "; looks like percent, divide by 100" if v <= 100 else ""
                out.append((i, f"{col} {v:g} is outside its range 0-1 (a fraction){hint}"))
            elif col in PERCENTS and v > 100:
                out.append((i, f"{col} {v:g} is outside its range 0-100 (a percentage)"))
            elif col == "gpus" and v < 1:
                out.append((i, f"{col} {v:g} is not a GPU count (>= 1)"))
    return sorted(out)


def predictions_table(groups: pd.DataFrame, model: dict[str, Any]) -> pd.DataFrame:
    """One row per group: measured ``pfi`` (may be NaN), ``pfi_pred`` from ``model``, the
    out-of-fold ``pfi_pred_loo`` for training groups (NaN elsewhere) and the two composites.
    """
    groups = add_features(groups).reset_index(drop=True)
    out = pd.DataFrame(
        {
            c: groups[c] if c in groups.columns else pd.NA
            for c in ("group", "set", "cluster", "gpu_model", "matches")
        }
    )
    out["pfi"] = groups["pfi"].astype(float)
    out["pfi_pred"] = predict(model, groups) if is_fitted(model) else np.nan
    out["pfi_pred_loo"] = np.nan
    train = groups["group"].isin(model["training_groups"]).to_numpy()
    if train.sum() > 2:
        X = design_matrix(groups[train], model["features"])
        out.loc[train, "pfi_pred_loo"] = cv_predictions(X, out.loc[train, "pfi"].to_numpy())
    for c in ("dram_copy_product", "arithmetic_intensity"):
        out[c] = groups[c].astype(float) if c in groups.columns else np.nan
    return out


def holdout_scores(predictions: pd.DataFrame) -> pd.DataFrame:
    """R², RMSE and Spearman of ``pfi_pred`` per ``set`` (training set scored on its LOO)."""
    rows = []
    for name, rows_of_set in predictions.groupby("set", sort=False):
        loo = rows_of_set["pfi_pred_loo"].notna().all()
        ok = rows_of_set[np.isfinite(rows_of_set["pfi"])]
        pred = ok["pfi_pred_loo" if loo else "pfi_pred"].to_numpy(dtype=float)
        s = (
            scores(ok["pfi"].to_numpy(dtype=float), pred)
            if len(ok) > 1
            else {"r2": np.nan, "rmse": np.nan, "spearman": np.nan}
        )
        rows.append({"set": name, "n": len(ok), "prediction": "loo" if loo else "model", **s})
    return pd.DataFrame(rows)
