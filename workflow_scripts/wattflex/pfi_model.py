"""A fitted PFI predictor applied: the features a model document reads and the PFI it gives.

The fit (:func:`wattflex.analysis.predictor.fit_model`, the paper's Table 3 and its checks)
is the study's; applying a fitted model is shared by the study and the operations wing (the
cluster simulation predicts each emulated job's PFI with it), so it lives in the core.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import pandas as pd

from wattflex.metrics import predictor_metrics
from wattflex.vocabulary import LORA_TASK_NAMES

NOT_FITTED = "not_fitted"


def dcgm_metrics() -> tuple[str, ...]:
    """Job-level steady-state DCGM-style metrics of ``runs.parquet`` (the ``all_dcgm`` set):
    power per GPU and the registry's predictor metrics."""
    return ("power_per_gpu_w",) + tuple(predictor_metrics())


# What each derived feature is computed from.
DERIVED_INPUTS = {
    "dram_copy_product": ("dram_active", "mem_copy_util"),
    "arithmetic_intensity": ("tensor_active", "dram_active"),
    "is_moe": ("architecture",),
    "is_lora": ("task",),
    "log2_gpus": ("gpus",),
}


def add_features(df: pd.DataFrame) -> pd.DataFrame:
    """Copy of ``df`` with the derived features added where their inputs are present.

    A feature column already in ``df`` is kept as given (so a telemetry summary may carry
    ``dram_copy_product`` directly).
    """
    out = df.copy()
    have = lambda *cols: all(c in out.columns for c in cols)  # noqa: E731
    if "dram_copy_product" not in out and have("dram_active", "mem_copy_util"):
        out["dram_copy_product"] = out["dram_active"].astype(float) * out["mem_copy_util"].astype(
            float
        )
    if "arithmetic_intensity" not in out and have("tensor_active", "dram_active"):
        dram = out["dram_active"].astype(float)
        out["arithmetic_intensity"] = out["tensor_active"].astype(float) / dram.where(dram > 0)
    if "is_moe" not in out and have("architecture"):
        out["is_moe"] = (out["architecture"].astype(str).str.lower() == "moe").astype(float)
    if "is_lora" not in out and have("task"):
        out["is_lora"] = out["task"].astype(str).str.lower().isin(LORA_TASK_NAMES).astype(float)
    if "log2_gpus" not in out and have("gpus"):
        out["log2_gpus"] = np.log2(out["gpus"].astype(float))
    return out


def design_matrix(df: pd.DataFrame, features: Sequence[str]) -> np.ndarray:
    """Feature matrix of ``df``; a clear error names the columns a feature needs."""
    df = add_features(df)
    missing = [f for f in features if f not in df.columns]
    if missing:
        need = sorted({c for f in missing for c in DERIVED_INPUTS.get(f, (f,))})
        raise ValueError(
            f"missing column(s) for feature(s) {missing}: provide {need} (have {list(df.columns)})"
        )
    return df[list(features)].apply(pd.to_numeric, errors="coerce").to_numpy(dtype=float)


def is_fitted(model: dict[str, Any]) -> bool:
    """Whether a model document holds a fit (not a not-fitted record with its reason)."""
    return model.get("status", "fitted") != NOT_FITTED


def model_number_problem(model: Mapping[str, Any]) -> str | None:
    """Why a model's coefficients or intercept cannot be used (not a finite number: ``1e999``
    reads as inf, ``true`` as 1), or None."""
    numbers = {
        **{f"coefficient {f!r}": v for f, v in dict(model["coefficients"]).items()},
        "intercept": model["intercept"],
    }
    for name, v in numbers.items():
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
            return f"{name} {v!r} is not a finite number"
    return None


def predict(model: dict[str, Any], df: pd.DataFrame) -> np.ndarray:
    """PFI predicted by a model document from :func:`wattflex.analysis.predictor.fit_model` for each row of ``df``; NaN
    where an input is missing, an error where finite inputs give no finite PFI."""
    if not is_fitted(model):
        raise ValueError(
            f"the predictor model was not fitted: {model.get('reason', 'no reason recorded')}"
        )
    for key in ("features", "coefficients", "intercept"):
        if key not in model:
            raise ValueError(f"not a wattflex predictor model: no {key!r}")
    problem = model_number_problem(model)
    if problem:
        raise ValueError(f"predictor model: {problem}")
    features = list(model["features"])
    X = design_matrix(df, features)
    coef = np.array([model["coefficients"][f] for f in features], dtype=float)
    with np.errstate(over="ignore", invalid="ignore"):
        pred = X @ coef + float(model["intercept"])
    overflow = np.flatnonzero(~np.isfinite(pred) & np.isfinite(X).all(axis=1))
    if overflow.size:
        rows = ", ".join(str(i + 1) for i in overflow[:5]) + (" ..." if overflow.size > 5 else "")
        raise ValueError(
            f"predictor model: the PFI of data row(s) {rows} is not a finite number (coefficients "
            f"x inputs overflow); the model's coefficients are not a fitted PFI predictor's"
        )
    return pred
