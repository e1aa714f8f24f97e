"""Telemetry schema, trace phases and the steady-state aggregation protocol.

Per-run telemetry is long format, one row per GPU per sample, with the columns in
``TELEMETRY_COLUMNS`` (NaN where a source lacks a field). The per-step log has
``STEP_COLUMNS``. Both backends (emulated, NVML) and the importers write these.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from wattflex.metrics import activity_metrics, telemetry_columns
from wattflex.provenance import read_json, read_parquet
from wattflex.schema import section_defaults

if TYPE_CHECKING:  # the column names are imported by every run's job, which needs no pandas
    import pandas as pd

STEP_COLUMNS = ["step", "t_end_s", "tokens", "loss"]


def __getattr__(name: str) -> list[str]:
    """``TELEMETRY_COLUMNS`` (the per-GPU sample columns) and ``ACTIVITY_METRICS`` (aggregated
    per run: job-level mean over GPUs; power is summed), both from the metric registry
    (``wattflex.metrics``) when asked for; code here calls the registry's functions."""
    if name == "TELEMETRY_COLUMNS":
        return telemetry_columns()
    if name == "ACTIVITY_METRICS":
        return activity_metrics()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


WARMUP, STARTUP, TRAINING, DIP = "warmup", "startup", "training", "dip"


_SUMMARY = section_defaults("summary")


@dataclass(frozen=True)
class SummaryProtocol:
    """How a run's steady state is condensed (config ``summary:``; defaults: the schema's, the paper's §2)."""

    aggregate: str = _SUMMARY[
        "aggregate"
    ]  # "top10": mean of the top fraction of samples; "mean": plain mean
    top_fraction: float = _SUMMARY["top_fraction"]
    train_util_threshold: float = _SUMMARY["train_util_threshold"]
    warmup_fb_gib: float = _SUMMARY["warmup_fb_gib"]

    @classmethod
    def from_config(cls, cfg: dict[str, Any] | None) -> SummaryProtocol:
        """The protocol of a config's ``summary:`` section (its other keys ignored; schema defaults for
        what it leaves out).
        """
        return cls(**{k: v for k, v in (cfg or {}).items() if k in cls.__dataclass_fields__})


def job_series(telemetry: pd.DataFrame) -> pd.DataFrame:
    """Job-level time series: power summed over GPUs, other metrics averaged."""
    g = telemetry.groupby("t_s", sort=True)
    out = g[[c for c in activity_metrics() if c in telemetry]].mean()
    out["power_w"] = g["power_w"].sum(min_count=1)
    # Host power (RAPL, real backend): one value per node, on that node's first GPU row.
    host = [c for c in ("host_cpu_w", "host_dram_w") if c in telemetry]
    if host:
        out["host_power_w"] = g[host].sum(min_count=1).sum(axis=1, min_count=1)
    out["n_gpus"] = g["power_w"].size()
    return out.reset_index()


def detect_phases(
    series: pd.DataFrame, protocol: SummaryProtocol = SummaryProtocol()
) -> np.ndarray:
    """Label each job-level sample warmup / startup / training / dip.

    warmup: framebuffer below ``warmup_fb_gib`` before training starts; startup: weights
    resident but GPUs idle; training: sustained utilisation >= the threshold; after the
    first training sample, samples below the threshold (eval, checkpoint) are dips.
    """
    util = series["gpu_util"].to_numpy(float)
    fb = (
        series["fb_used_gib"].to_numpy(float)
        if "fb_used_gib" in series
        else np.full(len(series), np.inf)
    )
    busy = util >= protocol.train_util_threshold
    labels = np.full(len(series), STARTUP, dtype=object)
    first = int(np.argmax(busy)) if busy.any() else len(series)
    pre = np.arange(len(series)) < first
    labels[pre & (np.nan_to_num(fb, nan=np.inf) < protocol.warmup_fb_gib)] = WARMUP
    labels[~pre & busy] = TRAINING
    labels[~pre & ~busy] = DIP
    return labels


def _aggregate(values: np.ndarray, protocol: SummaryProtocol) -> tuple[float, float, float]:
    """(protocol aggregate, its SEM, plain mean).

    The SEM is the standard error of the time-series mean (sd / sqrt(n) over the whole
    steady-state series), the paper's intra-run noise estimate, for either aggregate.
    """
    v = values[np.isfinite(values)]
    if v.size == 0:
        return float("nan"), float("nan"), float("nan")
    mean = float(v.mean())
    sem = float(v.std(ddof=1) / np.sqrt(v.size)) if v.size > 1 else float("nan")
    if protocol.aggregate == "mean":
        return mean, sem, mean
    k = max(1, int(round(protocol.top_fraction * v.size)))
    return float(np.sort(v)[-k:].mean()), sem, mean


def step_throughput(steps: pd.DataFrame, train_windows: list[tuple[float, float]]) -> np.ndarray:
    """Tokens/s of each step that lies wholly inside a training window (stalls dropped)."""
    t_end = steps["t_end_s"].to_numpy(float)
    t_start = np.concatenate([[np.nan], t_end[:-1]])
    dur = t_end - t_start
    rate = steps["tokens"].to_numpy(float) / dur
    # A step that spans an eval or checkpoint pause is not a training-speed sample.
    stalled = dur > 3 * np.nanmedian(dur) if np.isfinite(dur).any() else np.zeros(len(steps), bool)
    inside = np.zeros(len(steps), bool)
    for a, b in train_windows:
        inside |= (t_start >= a) & (t_end <= b)
    return rate[inside & ~stalled & np.isfinite(rate)]


def training_windows(
    times: np.ndarray, labels: np.ndarray, period: float
) -> list[tuple[float, float]]:
    """Contiguous training stretches as (start, end) times; a sample covers (t - period, t]."""
    windows, start = [], None
    for t, lab in zip(times, labels):
        if lab == TRAINING and start is None:
            start = t - period
        elif lab != TRAINING and start is not None:
            windows.append((start, t - period))
            start = None
    if start is not None:
        windows.append((start, float(times[-1])))
    return windows


class NoSteadyState(ValueError):
    """A run whose files are sound but hold nothing to summarise (no training phase, no
    complete step in it: a run too short for its start-up). Not a damaged file: redoing the
    same run gives the same; the summary records it as failed (wattflex.runs.failures)."""


def summarize_run(
    telemetry: pd.DataFrame, steps: pd.DataFrame, protocol: SummaryProtocol = SummaryProtocol()
) -> dict[str, Any]:
    """Steady-state aggregates of one run (the paper's protocol, or the plain mean);
    :class:`NoSteadyState` when there is none."""
    series = job_series(telemetry)
    if series.empty:
        raise NoSteadyState("telemetry is empty")
    labels = detect_phases(series, protocol)
    times = series["t_s"].to_numpy(float)
    period = float(np.median(np.diff(times))) if len(times) > 1 else 1.0
    train = labels == TRAINING
    if not train.any():
        raise NoSteadyState(
            f"no training phase found (no sample with GPU util >= {protocol.train_util_threshold}%)"
        )
    out: dict[str, Any] = {"aggregate": protocol.aggregate, "top_fraction": protocol.top_fraction}
    out["power_w"], out["power_w_sem"], out["power_w_mean"] = _aggregate(
        series.loc[train, "power_w"].to_numpy(float), protocol
    )
    if "host_power_w" in series and series.loc[train, "host_power_w"].notna().any():
        # The paper measured GPU board power only; with RAPL we also report GPU + host.
        host, _, host_mean = _aggregate(series.loc[train, "host_power_w"].to_numpy(float), protocol)
        out["host_power_w"], out["power_gpu_host_w"] = host_mean, out["power_w"] + host_mean
    windows = training_windows(times, labels, period)
    rates = step_throughput(steps, windows)
    if rates.size == 0:
        raise NoSteadyState("no complete training step inside the training phase")
    out["tokens_per_s"], out["tokens_per_s_sem"], out["tokens_per_s_mean"] = _aggregate(
        rates, protocol
    )
    for m in activity_metrics():
        if m in series:
            out[m] = (
                float(np.nanmean(series.loc[train, m]))
                if series.loc[train, m].notna().any()
                else float("nan")
            )
    gpus = int(series["n_gpus"].max())
    out["gpus_seen"] = gpus
    out["power_per_gpu_w"] = out["power_w"] / gpus
    out["n_samples_training"] = int(train.sum())
    out["n_steps_training"] = int(rates.size)
    for phase in (WARMUP, STARTUP, TRAINING, DIP):
        out[f"{phase}_s"] = float((labels == phase).sum() * period)
    if "energy_j" in telemetry and telemetry["energy_j"].notna().any():
        last = telemetry.sort_values("t_s").groupby(["node", "gpu"])["energy_j"].last()
        out["energy_j"] = float(last.sum())
    out["training_windows_s"] = windows
    return out


# Columns a run's files must have for the summaries (the rest may be missing or NaN).
REQUIRED_TELEMETRY = ["t_s", "gpu", "power_w", "gpu_util"]
REQUIRED_STEPS = ["t_end_s", "tokens"]


class RunFileError(ValueError):
    """A run's telemetry.parquet / steps.parquet / run.json that cannot be used: one line
    naming the file, what is wrong and how to redo the run."""


def read_run_files(
    telemetry: str | Path,
    steps: str | Path,
    run: str | Path,
    run_keys: tuple[str, ...] = ("group", "run_id"),
) -> tuple[dict[str, Any], pd.DataFrame, pd.DataFrame]:
    """``(run.json, telemetry, steps)`` of one run, checked; a damaged file raises
    :class:`RunFileError` instead of a pyarrow/JSON traceback deep in the aggregation."""
    # --force on the run's own file redoes that one job; a real run must be named on purpose
    # (wattflex.runs.protection). Not --forcerun: it takes the path for a rule name too.
    hint = (
        f"redo that run alone: WATTFLEX_REDO_RUNS={Path(run).parent.parent.name}/{Path(run).parent.name} "
        f"snakemake --cores all --force {run}"
    )

    def fail(path: str | Path, what: str) -> RunFileError:
        return RunFileError(f"{path}: {what}; {hint}")

    try:
        doc = json.loads(Path(run).read_text())
        if isinstance(doc, dict):
            doc = read_json(run)  # + the schema version check
    except (OSError, ValueError) as exc:  # JSON and Unicode errors are ValueErrors
        raise fail(run, f"not a readable run record ({_one_line(exc)})") from None
    if not isinstance(doc, dict):
        raise fail(run, f"not a run record (a JSON object expected, found {type(doc).__name__})")
    missing = [k for k in run_keys if k not in doc]
    if missing:
        raise fail(run, f"not a run record: missing {', '.join(missing)}")
    if (
        doc.get("status") == "failed"
    ):  # a failure record (wattflex.runs.failures) has no parquet to read
        import pandas as pd

        return doc, pd.DataFrame(), pd.DataFrame()
    frames = []
    # A step log without rows is sound: no step completed (summarize_run says so); telemetry is
    # written from the first sample on, so a telemetry without rows was cut short.
    for path, required, rows in (
        (telemetry, REQUIRED_TELEMETRY, True),
        (steps, REQUIRED_STEPS, False),
    ):
        try:
            df = read_parquet(path)
        except (
            Exception
        ) as exc:  # pyarrow raises its own (ArrowInvalid, ...) next to OSError/ValueError
            raise fail(path, f"not a readable parquet file ({_one_line(exc)})") from None
        absent = [c for c in required if c not in df.columns]
        if absent:
            raise fail(path, f"column(s) {', '.join(absent)} missing")
        if rows and df.empty:
            raise fail(path, "no rows")
        frames.append(df)
    return doc, frames[0], frames[1]


def _one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split()) or type(exc).__name__
    return text if len(text) <= 160 else text[:157] + "..."
