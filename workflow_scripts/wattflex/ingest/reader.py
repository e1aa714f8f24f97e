"""Measured sweeps from elsewhere -> rows of ``runs.parquet`` (backend ``"ingest"``).

A campaign with ``source: ingest`` skips the run rules: its ``runs.parquet`` is built here
from files people already have, then flows through PFI and the rest unchanged. Formats
(``FORMATS``):

- ``sweep-table``: a CSV or parquet file (or a folder of them), one row per run, with
  ``group, cap_w, power_w, throughput`` (``cap_kw``/``power_kw`` and ``tokens_per_s`` are
  accepted and converted) and optionally ``repeat, power_w_sem, throughput_sem, gpus,
  gpu_model, model, architecture, task, cluster, set, seq_len, batch, ep``, the steady-state
  telemetry columns of the runs contract (``sm_clock_mhz, dram_active, ...``) and
  ``throughput_unit``. Power and caps are **job total** power and **per-GPU** caps, as in
  ``runs.parquet``. Columns the table lacks can be given in ``defaults``.
- ``zeus-nsdi23``: the Zeus NSDI'23 traces ``summary_power_<gpu>.csv`` (one GPU per job):
  group = gpu/dataset/network/batch size/optimizer, cap = ``power_limit``, power =
  ``average_power``, throughput = 3600 / ``time_per_epoch`` (epochs/h).
- ``perseus-sosp24``: the Perseus SOSP'24 sweeps ``power_limit_sweeps_<gpu>.csv``:
  ``power_limit_0..`` are the per-stage limits of a ``dp x tp x pp`` pipeline job, the first
  ``pp`` must be equal (that is the cap) and the others 0 or empty; gpus = dp*tp*pp, job
  power = ``energy / time`` (J per iteration / s per iteration), throughput =
  ``batch_size / time`` (samples/s).
- ``dcgm-runs``: a manifest CSV, one row per run: ``group, cap_w, telemetry, steps`` (+
  ``repeat``, ``telemetry_format`` = ``dcgm-exporter`` | ``dcgmi-dmon``, ``period_s``,
  ``node``, ``gpu_ids`` like ``0;1;2;3``, ``start_unix`` and the metadata columns above).
  ``telemetry`` is one capture file or several joined by ``;`` (one per node), ``steps`` a
  step log CSV with ``step, t_end_s, tokens[, loss]``; paths are relative to the manifest.
  Each run is read with :mod:`wattflex.ingest.dcgm` and condensed by ``telemetry.summarize_run``
  (the same protocol as a wattflex run), so it carries SEMs and steady-state telemetry.

Validation. Every row is checked: numbers where numbers belong, positive cap/power/
throughput, plausible units (per-GPU cap 10-2000 W, per-GPU power 1-2000 W and at most 1.5x
its cap, utilisations in %, activities as 0-1 ratios...), safe group ids, known vocabulary
for architecture/task/cluster, no duplicate (group, cap, repeat), group metadata constant
within a group. A bad row is reported with its file and line (``file.csv line 17``; ``row``
for parquet) and every reason; nothing is dropped silently: with ``on_bad_rows="error"``
(default) any bad row stops the ingest, with ``"skip"`` the rows are left out and listed in
``IngestResult.rejected`` (the workflow writes them next to ``runs.parquet`` and counts them
in the ingest report).

Throughput keeps the source's unit (``throughput_unit`` column): ``tokens_per_s`` in an
ingested ``runs.parquet`` holds that throughput, which is fine for everything downstream
(PFI and the allocation use throughput relative to each job's own ``T_max``).
"""

from __future__ import annotations

import csv
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

import numpy as np
import pandas as pd

from wattflex.config import run_id
from wattflex.ingest.dcgm import DcgmFormatError, range_problem, read_dcgm_exporter, read_dcgmi_dmon
from wattflex.telemetry import ACTIVITY_METRICS, STEP_COLUMNS, SummaryProtocol, summarize_run

FORMATS = ("sweep-table", "zeus-nsdi23", "perseus-sosp24", "dcgm-runs")
BACKEND = "ingest"
# runs.parquet contract (DESIGN.md), in order; ingest adds throughput_unit, source, source_line.
RUN_COLUMNS = ["group", "run_id", "cap_w", "repeat", "backend", "gpu_model", "gpus", "model",
               "architecture", "task", "cluster", "set", "matches", "seq_len", "batch", "ep",
               "compile", "power_w", "power_w_sem", "tokens_per_s", "tokens_per_s_sem",
               "power_w_mean", "tokens_per_s_mean", *ACTIVITY_METRICS, "power_per_gpu_w",
               "throughput_unit", "source", "source_line"]
# Constant within a group (a job's description, not a run's measurement).
GROUP_META = ("gpus", "gpu_model", "model", "architecture", "task", "cluster", "set", "matches",
              "seq_len", "batch", "ep", "compile", "throughput_unit")
VOCABULARY = {"architecture": ("dense", "moe"), "task": ("pt", "lora"),
              "cluster": ("dense", "moe-pt", "moe-ft"), "set": ("headline", "validation", "h100", "other")}
NUMERIC = ("cap_w", "power_w", "throughput", "power_w_sem", "throughput_sem", "gpus", "repeat",
           "seq_len", "batch", "ep", "power_w_mean", "tokens_per_s_mean", *ACTIVITY_METRICS)
INTEGER = ("gpus", "repeat", "seq_len", "batch", "ep")
# Source columns in another unit: name -> (our name, factor).
UNIT_ALIASES = {"cap_kw": ("cap_w", 1000.0), "power_kw": ("power_w", 1000.0),
                "power_kw_sem": ("power_w_sem", 1000.0)}
THROUGHPUT_ALIASES = {"tokens_per_s": ("throughput", "tokens/s"),
                      "tokens_per_s_sem": ("throughput_sem", None)}
CAP_RANGE_W = (10.0, 2000.0)        # per GPU
POWER_RANGE_W = (1.0, 2000.0)       # per GPU
MAX_POWER_OVER_CAP = 1.5            # averages above 1.5x the cap: job total vs per-GPU mix-up
SAFE_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")
MAX_LISTED = 20                     # bad rows spelled out in an error message


class IngestError(ValueError):
    """Input that cannot be ingested as it stands; the message says where and why."""


@dataclass
class IngestResult:
    """``runs``: rows in the runs.parquet contract; ``rejected``: ``where, reason`` per bad row."""
    runs: pd.DataFrame
    rejected: pd.DataFrame
    inputs: list[str]
    notes: list[str] = field(default_factory=list)

    def summary(self) -> dict[str, Any]:
        return {"n_runs": int(len(self.runs)), "n_groups": int(self.runs["group"].nunique()),
                "n_rejected": int(len(self.rejected)), "inputs": self.inputs, "notes": self.notes,
                "throughput_units": sorted(self.runs["throughput_unit"].dropna().unique().tolist())}


# ---------------------------------------------------------------------------------------
# Reading tables with line numbers
# ---------------------------------------------------------------------------------------

def read_table(path: str | Path) -> tuple[pd.DataFrame, list[dict]]:
    """A CSV (cells as text) or parquet file, plus a ``_where`` column ("f.csv line 7").

    Blank CSV lines are skipped (they hold no data); a line with the wrong number of
    fields is returned as a bad row, not guessed at.
    """
    path = Path(path)
    if not path.is_file():
        raise IngestError(f"{path}: no such file")
    if path.suffix.lower() in (".parquet", ".pq"):
        df = pd.read_parquet(path)
        df.columns = [str(c).strip() for c in df.columns]
        df["_where"] = [f"{path.name} row {i + 1}" for i in range(len(df))]
        return df, []
    rows, wheres, bad = [], [], []
    with open(path, newline="") as fh:
        reader = csv.reader(fh)
        header = None
        for cells in reader:
            if not any(c.strip() for c in cells):
                continue
            if header is None:
                header = [c.strip() for c in cells]
                continue
            where = f"{path.name} line {reader.line_num}"
            if len(cells) != len(header):
                bad.append({"where": where, "reason": f"{len(cells)} fields, the header has {len(header)}"})
                continue
            rows.append([c.strip() for c in cells])
            wheres.append(where)
    if header is None:
        raise IngestError(f"{path}: empty file (no header line)")
    if len(set(header)) != len(header):
        raise IngestError(f"{path}: duplicate column names in the header: {header}")
    df = pd.DataFrame(rows, columns=header, dtype=object).replace({"": np.nan})
    df["_where"] = wheres
    return df, bad


def source_files(fmt: str, path: str | Path) -> list[Path]:
    """The files an ingest of ``fmt`` reads from ``path`` (a file or a folder)."""
    if fmt not in FORMATS:
        raise IngestError(f"unknown ingest format {fmt!r}; known: {', '.join(FORMATS)}")
    path = Path(path)
    if not path.exists():
        raise IngestError(f"ingest path {path} does not exist; point ingest.path in the config at the data "
                          "(e.g. snakemake --config 'ingest={path: /my/data}')")
    if path.is_file():
        files = [path]
    else:
        pattern = {"zeus-nsdi23": "summary_power_*.csv", "perseus-sosp24": "power_limit_sweeps_*.csv",
                   "sweep-table": "*", "dcgm-runs": "*.csv"}[fmt]
        files = sorted(p for p in path.glob(pattern)
                       if p.is_file() and (fmt != "sweep-table" or p.suffix.lower() in (".csv", ".parquet", ".pq")))
        if fmt == "dcgm-runs" and len(files) != 1:
            raise IngestError(f"{path}: a dcgm-runs ingest reads one manifest CSV; found {len(files)} CSV files")
    if not files:
        raise IngestError(f"{path}: no input files for format {fmt} (expected {pattern})")
    if fmt == "dcgm-runs":
        files += manifest_files(files[0])
    return files


# ---------------------------------------------------------------------------------------
# Validation of a generic sweep table
# ---------------------------------------------------------------------------------------

def _apply_aliases(df: pd.DataFrame, throughput_unit: str | None) -> tuple[pd.DataFrame, str | None]:
    for alias, (ours, factor) in UNIT_ALIASES.items():
        if alias in df:
            if ours in df:
                raise IngestError(f"both {alias} and {ours} given; keep one")
            df[ours] = pd.to_numeric(df.pop(alias), errors="coerce") * factor
    for alias, (ours, unit) in THROUGHPUT_ALIASES.items():
        if alias in df:
            if ours in df:
                raise IngestError(f"both {alias} and {ours} given; keep one")
            df[ours] = df.pop(alias)
            throughput_unit = throughput_unit or unit
    return df, throughput_unit


def _to_numbers(df: pd.DataFrame, reasons: list[list[str]]) -> None:
    for col in NUMERIC:
        if col not in df:
            continue
        raw = df[col].map(lambda v: np.nan if isinstance(v, str) and not v.strip() else v)  # "" = missing
        num = pd.to_numeric(raw, errors="coerce")
        for i in np.flatnonzero((num.isna() & raw.notna()).to_numpy()):
            reasons[i].append(f"{col} is not a number: {raw.iloc[i]!r}")
        df[col] = num.astype(float)


def _row_checks(df: pd.DataFrame, reasons: list[list[str]]) -> None:
    gpus = df["gpus"].to_numpy(float)
    for i in range(len(df)):
        r = reasons[i]
        group = df["group"].iloc[i]
        if pd.isna(group) or not SAFE_ID.match(str(group)):
            r.append(f"group {group!r} is empty or has characters other than letters, digits, . _ -")
        for col in ("cap_w", "power_w", "throughput"):
            v = df[col].iloc[i]
            if not np.isfinite(v) or v <= 0:
                if not any(s.startswith(f"{col} is not a number") for s in r):
                    r.append(f"{col} is missing or not positive ({df[col].iloc[i]})")
        for col in ("power_w_sem", "throughput_sem"):
            if col in df and df[col].iloc[i] < 0:
                r.append(f"{col} is negative ({df[col].iloc[i]:g})")
        for col in INTEGER:
            v = df[col].iloc[i] if col in df else np.nan
            if col in ("gpus", "repeat") and col in df and not np.isfinite(v):
                if not any(s.startswith(f"{col} is not a number") for s in r):
                    r.append(f"{col} is empty")
            elif np.isfinite(v) and (v != int(v) or v < (0 if col == "repeat" else 1)):
                r.append(f"{col} must be a whole number >= {0 if col == 'repeat' else 1} ({v:g})")
        n = gpus[i] if np.isfinite(gpus[i]) and gpus[i] >= 1 else np.nan
        cap, power = df["cap_w"].iloc[i], df["power_w"].iloc[i]
        if np.isfinite(cap) and cap > 0 and not CAP_RANGE_W[0] <= cap <= CAP_RANGE_W[1]:
            r.append(f"cap_w = {cap:g} is outside {CAP_RANGE_W[0]:g}-{CAP_RANGE_W[1]:g} W per GPU "
                     "(caps are per GPU, in W)")
        if np.isfinite(power) and power > 0 and np.isfinite(n):
            per_gpu = power / n
            if not POWER_RANGE_W[0] <= per_gpu <= POWER_RANGE_W[1]:
                r.append(f"power_w / gpus = {per_gpu:g} W is outside {POWER_RANGE_W[0]:g}-{POWER_RANGE_W[1]:g} W "
                         "per GPU (power_w is the job total in W: kW, mW or a wrong gpus?)")
            elif np.isfinite(cap) and cap > 0 and per_gpu > MAX_POWER_OVER_CAP * cap:
                r.append(f"power_w / gpus = {per_gpu:g} W is over {MAX_POWER_OVER_CAP:g}x the cap {cap:g} W "
                         "(is power_w the job total with gpus missing?)")
        for col in ACTIVITY_METRICS:
            if col in df:
                problem = range_problem(col, df[col].iloc[i])
                if problem:
                    r.append(problem)
        for col, allowed in VOCABULARY.items():
            v = df[col].iloc[i] if col in df else np.nan
            if not pd.isna(v) and str(v) not in allowed:
                r.append(f"{col} {v!r} is not one of {', '.join(allowed)}")


def _shape_checks(df: pd.DataFrame, ok: np.ndarray, reasons: list[list[str]]) -> None:
    """Duplicate (group, cap, repeat) and group metadata that changes within a group."""
    good = df[ok]
    dup = good.duplicated(["group", "cap_w", "repeat"], keep=False)
    for _, same in good[dup].groupby(["group", "cap_w", "repeat"]):
        lines = ", ".join(same["_where"])
        for i in same.index:
            reasons[i].append(f"duplicate run (group, cap_w, repeat) = ({same['group'].iloc[0]}, "
                              f"{same['cap_w'].iloc[0]:g}, {int(same['repeat'].iloc[0])}): {lines}")
    for col in GROUP_META:
        if col not in good:
            continue
        for _, part in good.groupby("group"):
            values = part[col].astype(str)
            first = values.iloc[0]
            for i in part.index[values != first]:
                reasons[i].append(f"{col} {df[col].iloc[i]!r} differs from {first!r} "
                                  f"({part['_where'].iloc[0]}, same group)")


def validate_sweep(table: pd.DataFrame, *, throughput_unit: str | None = None,
                   defaults: Mapping[str, Any] | None = None,
                   source_bad: Sequence[dict] = ()) -> IngestResult:
    """Check a sweep table (cells as text or numbers, plus ``_where``) and build run rows.

    Returns every valid row as a run and every invalid one in ``rejected``; the caller
    decides whether rejected rows are fatal (``check_rejected``).
    """
    df = table.copy().reset_index(drop=True)
    if "_where" not in df:
        df["_where"] = [f"table row {i + 1}" for i in range(len(df))]
    df.columns = [str(c).strip() for c in df.columns]
    df, throughput_unit = _apply_aliases(df, throughput_unit)
    missing = [c for c in ("group", "cap_w", "power_w", "throughput") if c not in df]
    if missing:
        raise IngestError(f"sweep table lacks column(s) {', '.join(missing)} (has "
                          f"{', '.join(c for c in df.columns if c != '_where')}); need group, cap_w, power_w, "
                          "throughput (or cap_kw, power_kw, tokens_per_s)")
    notes = []
    for key, value in (defaults or {}).items():
        if key not in df:
            df[key] = value
            notes.append(f"{key} = {value} for every row (from the config defaults)")
    if "gpus" not in df:
        df["gpus"] = 1
        notes.append("no gpus column: every job is taken as 1 GPU (power_w = that GPU's power)")
    if "throughput_unit" not in df:
        df["throughput_unit"] = throughput_unit or "units/s"
    if ("power_w_sem" in df) != ("throughput_sem" in df):
        raise IngestError("give both power_w_sem and throughput_sem, or neither")
    reasons: list[list[str]] = [[] for _ in range(len(df))]
    _to_numbers(df, reasons)
    _row_checks(df, reasons)
    ok = np.array([not r for r in reasons], dtype=bool)
    if "repeat" not in df:
        df["repeat"] = np.nan
        df.loc[ok, "repeat"] = df[ok].groupby(["group", "cap_w"]).cumcount().astype(float)
    _shape_checks(df, np.array([not r for r in reasons], dtype=bool), reasons)
    ok = np.array([not r for r in reasons], dtype=bool)
    rejected = pd.DataFrame(list(source_bad) + [{"where": df["_where"].iloc[i], "reason": "; ".join(r)}
                                                for i, r in enumerate(reasons) if r],
                            columns=["where", "reason"])
    rejected = rejected.sort_values("where", key=lambda w: w.map(_where_key), kind="stable").reset_index(drop=True)
    return IngestResult(runs=_run_rows(df[ok]), rejected=rejected, inputs=[], notes=notes)


def _where_key(where: str) -> tuple[str, int]:
    """Sort key of "file.csv line 12": file, then line number."""
    head, _, number = where.rpartition(" ")
    return (head, int(number)) if number.isdigit() else (where, 0)


def _derive_cluster(arch: Any, task: Any) -> Any:
    """The paper's clusters (as ``config.groups`` derives them): dense; MoE by task."""
    if arch == "dense":
        return "dense"
    if arch == "moe" and task in ("pt", "lora"):
        return "moe-pt" if task == "pt" else "moe-ft"
    return np.nan


def _run_rows(df: pd.DataFrame) -> pd.DataFrame:
    out = pd.DataFrame(index=df.index)
    out["group"] = df["group"].astype(str)
    out["cap_w"] = df["cap_w"]
    out["repeat"] = df["repeat"].astype(int)
    out["run_id"] = [run_id(c, r) for c, r in zip(out["cap_w"], out["repeat"])]
    out["backend"] = BACKEND
    for col in ("gpu_model", "model", "architecture", "task", "cluster", "compile"):
        out[col] = df[col] if col in df else np.nan
    out["set"] = df["set"] if "set" in df else "headline"
    out["matches"] = df["matches"].fillna("") if "matches" in df else ""
    if out["cluster"].isna().any():
        derived = [_derive_cluster(a, t) for a, t in zip(out["architecture"], out["task"])]
        out["cluster"] = out["cluster"].where(out["cluster"].notna(), pd.Series(derived, index=out.index, dtype=object))
    out["gpus"] = df["gpus"].astype(int)
    for col in ("seq_len", "batch", "ep"):
        out[col] = df[col] if col in df else np.nan
    out["power_w"] = df["power_w"]
    out["power_w_sem"] = df["power_w_sem"] if "power_w_sem" in df else np.nan
    out["tokens_per_s"] = df["throughput"]
    out["tokens_per_s_sem"] = df["throughput_sem"] if "throughput_sem" in df else np.nan
    out["power_w_mean"] = df["power_w_mean"] if "power_w_mean" in df else df["power_w"]
    out["tokens_per_s_mean"] = df["tokens_per_s_mean"] if "tokens_per_s_mean" in df else df["throughput"]
    for col in ACTIVITY_METRICS:
        out[col] = df[col] if col in df else np.nan
    out["power_per_gpu_w"] = out["power_w"] / out["gpus"]
    out["throughput_unit"] = df["throughput_unit"]
    out["source"] = [w.rsplit(" ", 2)[0] for w in df["_where"]]
    out["source_line"] = [int(w.rsplit(" ", 1)[1]) for w in df["_where"]]
    extra = [c for c in df.columns if c not in out and c not in ("throughput", "throughput_sem", "_where")]
    out = pd.concat([out[RUN_COLUMNS], df[extra]], axis=1)
    return out.sort_values(["group", "cap_w", "repeat"], kind="stable").reset_index(drop=True)


def check_rejected(result: IngestResult, on_bad_rows: str = "error") -> None:
    """Raise ``IngestError`` listing the bad rows unless ``on_bad_rows == "skip"``."""
    if on_bad_rows not in ("error", "skip"):
        raise IngestError(f"on_bad_rows must be 'error' or 'skip', not {on_bad_rows!r}")
    if result.rejected.empty or on_bad_rows == "skip":
        return
    lines = [f"  {w}: {r}" for w, r in result.rejected.head(MAX_LISTED).itertuples(index=False)]
    more = len(result.rejected) - MAX_LISTED
    raise IngestError(f"{len(result.rejected)} bad row(s) (on_bad_rows 'skip' leaves them out and lists "
                      "them):\n" + "\n".join(lines) + (f"\n  ... and {more} more" if more > 0 else ""))


# ---------------------------------------------------------------------------------------
# Per-source adapters
# ---------------------------------------------------------------------------------------

def _numeric(df: pd.DataFrame, col: str, bad: list[dict], positive: bool = True) -> pd.Series:
    """``df[col]`` as floats; a cell that is not a (positive) number becomes a bad row."""
    num = pd.to_numeric(df[col], errors="coerce").astype(float)
    wrong = num.isna() | (num <= 0 if positive else False)
    for i in np.flatnonzero(wrong.to_numpy()):
        bad.append({"where": df["_where"].iloc[i], "reason": f"{col} is not a{' positive' if positive else ''} "
                    f"number: {df[col].iloc[i]!r}"})
    return num.where(~wrong)


def _require(df: pd.DataFrame, cols: Iterable[str], path: Path, fmt: str) -> None:
    missing = [c for c in cols if c not in df]
    if missing:
        raise IngestError(f"{path}: not a {fmt} file: missing column(s) {', '.join(missing)}")


def _slug(*parts: Any) -> str:
    return "-".join(re.sub(r"[^A-Za-z0-9._]+", "_", str(p)).strip("_") for p in parts)


def _drop_bad(df: pd.DataFrame, bad: list[dict]) -> pd.DataFrame:
    flagged = {b["where"] for b in bad}
    return df[~df["_where"].isin(flagged)]


def _open_trace(path: Path, stem: str, bad: list[dict], required: Sequence[str]) -> tuple[str, pd.DataFrame]:
    """Read ``<stem>_<gpu>.csv``: (gpu token from the name, table); short lines go to ``bad``."""
    m = re.fullmatch(rf"{stem}_(\w+)\.csv", path.name)
    if not m:
        raise IngestError(f"{path}: expected a file named {stem}_<gpu>.csv")
    df, b = read_table(path)
    bad += b
    _require(df, required, path, f"{stem}_<gpu>.csv")
    return m.group(1), df


ZEUS_GPUS = {"a40": "A40", "v100": "V100", "p100": "P100", "rtx6000": "RTX6000"}


def zeus_nsdi23_table(paths: Sequence[str | Path]) -> tuple[pd.DataFrame, list[dict]]:
    """Zeus NSDI'23 ``summary_power_<gpu>.csv`` files -> a generic sweep table."""
    frames, bad = [], []
    for path in map(Path, paths):
        token, df = _open_trace(path, "summary_power", bad, ("dataset", "network", "batch_size", "optimizer",
                                                              "power_limit", "time_per_epoch", "average_power"))
        gpu = ZEUS_GPUS.get(token.lower(), token.upper())
        cap = _numeric(df, "power_limit", bad)
        power = _numeric(df, "average_power", bad)
        epoch_s = _numeric(df, "time_per_epoch", bad)
        batch = _numeric(df, "batch_size", bad)
        out = pd.DataFrame({
            "group": [_slug(gpu.lower(), d, n, f"b{b:g}" if np.isfinite(b) else b, o)
                      for d, n, b, o in zip(df["dataset"], df["network"], batch, df["optimizer"])],
            "cap_w": cap, "power_w": power, "throughput": 3600.0 / epoch_s, "gpus": 1, "gpu_model": gpu,
            "model": df["network"], "architecture": "dense", "batch": batch, "dataset": df["dataset"],
            "optimizer": df["optimizer"], "throughput_unit": "epochs/h", "_where": df["_where"],
        })
        frames.append(_drop_bad(out, bad))
    return pd.concat(frames, ignore_index=True), bad


def perseus_sosp24_table(paths: Sequence[str | Path]) -> tuple[pd.DataFrame, list[dict]]:
    """Perseus SOSP'24 ``power_limit_sweeps_<gpu>.csv`` files -> a generic sweep table."""
    frames, bad = [], []
    for path in map(Path, paths):
        token, df = _open_trace(path, "power_limit_sweeps", bad, ("model_name", "batch_size", "dp", "tp", "pp",
                                                                   "time", "energy", "power_limit_0"))
        gpu = token.upper()
        limit_cols = sorted((c for c in df if re.fullmatch(r"power_limit_\d+", c)), key=lambda c: int(c.rsplit("_", 1)[1]))
        dp, tp, pp = (_numeric(df, c, bad) for c in ("dp", "tp", "pp"))
        time_s, energy_j = _numeric(df, "time", bad), _numeric(df, "energy", bad)
        batch = _numeric(df, "batch_size", bad)
        limits = np.column_stack([pd.to_numeric(df[c], errors="coerce").to_numpy(float) for c in limit_cols])
        cap = np.full(len(df), np.nan)
        for i in range(len(df)):
            if not np.isfinite(pp.iloc[i]):
                continue
            k = int(pp.iloc[i])
            used, unused = limits[i, :k], limits[i, k:]
            if k > len(limit_cols):
                bad.append({"where": df["_where"].iloc[i], "reason": f"pp = {k} but only {len(limit_cols)} power_limit columns"})
            elif not (np.isfinite(used).all() and (used > 0).all() and (used == used[0]).all()):
                bad.append({"where": df["_where"].iloc[i], "reason": f"power_limit_0..{k - 1} must be one positive "
                            f"cap shared by all {k} pipeline stages, got {used.tolist()}"})
            elif (np.nan_to_num(unused) != 0).any():
                bad.append({"where": df["_where"].iloc[i], "reason": f"power_limit_{k}.. must be 0 or empty for a "
                            f"{k}-stage pipeline, got {unused.tolist()}"})
            else:
                cap[i] = used[0]
        gpus = dp * tp * pp
        out = pd.DataFrame({
            "group": [_slug(gpu.lower(), mdl, f"dp{d:g}tp{t:g}pp{p:g}", f"b{b:g}")
                      for mdl, d, t, p, b in zip(df["model_name"], dp, tp, pp, batch)],
            "cap_w": cap, "power_w": energy_j / time_s, "throughput": batch / time_s, "gpus": gpus,
            "gpu_model": gpu, "model": df["model_name"], "architecture": "dense", "batch": batch,
            "dp": dp, "tp": tp, "pp": pp, "throughput_unit": "samples/s", "_where": df["_where"],
        })
        frames.append(_drop_bad(out, bad))
    return pd.concat(frames, ignore_index=True), bad


# ---------------------------------------------------------------------------------------
# Per-run DCGM telemetry + step logs
# ---------------------------------------------------------------------------------------

TELEMETRY_FORMATS = ("dcgm-exporter", "dcgmi-dmon")
_MANIFEST_META = ("gpus", "gpu_model", "model", "architecture", "task", "cluster", "set", "matches",
                  "seq_len", "batch", "ep", "compile")


def _manifest(path: Path) -> pd.DataFrame:
    df, bad = read_table(path)
    if bad:
        raise IngestError("; ".join(f"{b['where']}: {b['reason']}" for b in bad))
    _require(df, ("group", "cap_w", "telemetry", "steps"), path, "dcgm-runs manifest")
    return df


def manifest_files(path: str | Path) -> list[Path]:
    """The telemetry and step files a dcgm-runs manifest names (relative to its folder)."""
    path = Path(path)
    df = _manifest(path)
    files = []
    for tel, steps in zip(df["telemetry"], df["steps"]):
        files += [path.parent / p.strip() for p in str(tel).split(";") if p.strip()]
        files.append(path.parent / str(steps).strip())
    return list(dict.fromkeys(files))


def read_steps(path: str | Path) -> pd.DataFrame:
    """A step log CSV (``step, t_end_s, tokens[, loss]``), checked: times increase, tokens > 0."""
    df, bad = read_table(path)
    if bad:
        raise IngestError("; ".join(f"{b['where']}: {b['reason']}" for b in bad))
    _require(df, ("step", "t_end_s", "tokens"), Path(path), "step log")
    out = pd.DataFrame({c: pd.to_numeric(df[c], errors="coerce") for c in STEP_COLUMNS if c in df})
    if "loss" not in out:
        out["loss"] = np.nan
    for col in ("step", "t_end_s", "tokens"):
        wrong = out[col].isna() | (out[col] <= 0 if col == "tokens" else False)
        if wrong.any():
            i = int(np.flatnonzero(wrong.to_numpy())[0])
            raise IngestError(f"{df['_where'].iloc[i]}: {col} is not a{' positive' if col == 'tokens' else ''} "
                              f"number: {df[col].iloc[i]!r}")
    back = np.flatnonzero(np.diff(out["t_end_s"].to_numpy()) <= 0)
    if back.size:
        raise IngestError(f"{df['_where'].iloc[back[0] + 1]}: t_end_s does not increase")
    return out[STEP_COLUMNS]


def align_clocks(telemetry: pd.DataFrame, steps: pd.DataFrame, start_unix: float | None = None) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Put telemetry and step times on one clock, seconds since the first telemetry sample.

    Unix-time captures (exporter scrapes, timestamped dmon) and a unix-time step log are
    shifted together; a relative step log against unix-time telemetry needs ``start_unix``
    (when the step clock's zero was).
    """
    tel, st = telemetry.copy(), steps.copy()
    tel_abs = bool(tel["t_s"].min() > 1e9)
    steps_abs = bool(st["t_end_s"].min() > 1e9)
    if tel_abs and not steps_abs:
        if start_unix is None:
            raise IngestError("telemetry has unix times but the step log relative ones: give start_unix "
                              "(the unix time of the step log's zero)")
        tel["t_s"] = tel["t_s"] - float(start_unix)
    elif steps_abs and not tel_abs:
        raise IngestError("the step log has unix times but the telemetry relative ones; use one clock")
    t0 = float(tel["t_s"].min()) if (tel_abs and steps_abs) else 0.0
    tel["t_s"] = tel["t_s"] - t0
    st["t_end_s"] = st["t_end_s"] - t0
    return tel, st


def read_run_telemetry(files: Sequence[Path], fmt: str, period_s: float | None, node: str | None,
                       gpu_ids: Iterable[int] | None) -> pd.DataFrame:
    if fmt == "dcgm-exporter":
        return read_dcgm_exporter(files, node=node or "node0", gpu_ids=gpu_ids)
    if fmt == "dcgmi-dmon":
        parts = [read_dcgmi_dmon(f, period_s=period_s, node=node or f"node{k}", gpu_ids=gpu_ids)
                 for k, f in enumerate(files)]
        return pd.concat(parts, ignore_index=True)
    raise IngestError(f"telemetry_format must be one of {', '.join(TELEMETRY_FORMATS)}, not {fmt!r}")


def dcgm_runs_table(manifest: str | Path, protocol: SummaryProtocol = SummaryProtocol(),
                    telemetry_format: str | None = None) -> tuple[pd.DataFrame, list[dict]]:
    """A dcgm-runs manifest -> a generic sweep table, one summarised run per row."""
    manifest = Path(manifest)
    df = _manifest(manifest)
    rows, bad = [], []
    for _, m in df.iterrows():
        where = m["_where"]
        try:
            fmt = m.get("telemetry_format") if not pd.isna(m.get("telemetry_format", np.nan)) else telemetry_format
            files = [manifest.parent / p.strip() for p in str(m["telemetry"]).split(";") if p.strip()]
            period = float(m["period_s"]) if "period_s" in m and not pd.isna(m["period_s"]) else None
            gpu_ids = ([int(g) for g in str(m["gpu_ids"]).split(";")] if "gpu_ids" in m and not pd.isna(m["gpu_ids"])
                       else None)
            node = m["node"] if "node" in m and not pd.isna(m["node"]) else None
            start = float(m["start_unix"]) if "start_unix" in m and not pd.isna(m["start_unix"]) else None
            tel = read_run_telemetry(files, fmt or "", period, node, gpu_ids)
            tel, steps = align_clocks(tel, read_steps(manifest.parent / str(m["steps"]).strip()), start)
            s = summarize_run(tel, steps, protocol)
        except (DcgmFormatError, IngestError, ValueError) as exc:
            bad.append({"where": where, "reason": str(exc)})
            continue
        row = {"group": m["group"], "cap_w": m["cap_w"], "power_w": s["power_w"], "throughput": s["tokens_per_s"],
               "power_w_sem": s["power_w_sem"], "throughput_sem": s["tokens_per_s_sem"],
               "power_w_mean": s["power_w_mean"], "tokens_per_s_mean": s["tokens_per_s_mean"],
               "gpus": m["gpus"] if "gpus" in m and not pd.isna(m["gpus"]) else s["gpus_seen"],
               "throughput_unit": "tokens/s", "aggregate": s["aggregate"],
               "n_samples_training": s["n_samples_training"], "n_steps_training": s["n_steps_training"],
               **{k: s[k] for k in ACTIVITY_METRICS if k in s}, "_where": where}
        if "repeat" in m and not pd.isna(m["repeat"]):
            row["repeat"] = m["repeat"]
        row.update({k: m[k] for k in _MANIFEST_META if k in m and k != "gpus" and not pd.isna(m[k])})
        rows.append(row)
    return pd.DataFrame(rows), bad


# ---------------------------------------------------------------------------------------
# Entry point
# ---------------------------------------------------------------------------------------

def ingest(fmt: str, path: str | Path, **options: Any) -> IngestResult:
    """Read ``path`` (a file or folder) in format ``fmt``; see ``ingest_files`` for options."""
    return ingest_files(fmt, source_files(fmt, path), **options)


def ingest_files(fmt: str, files: Sequence[str | Path], *, on_bad_rows: str = "error",
                 defaults: Mapping[str, Any] | None = None, throughput_unit: str | None = None,
                 protocol: SummaryProtocol = SummaryProtocol(), telemetry_format: str | None = None) -> IngestResult:
    """Validated run rows from ``files`` (as ``source_files`` lists them; for ``dcgm-runs``
    the manifest first). ``on_bad_rows``: ``error`` raises on any bad row, ``skip`` leaves
    them out and lists them in ``rejected``; ``defaults`` fills columns a table lacks."""
    files = [Path(f) for f in files]
    if fmt == "zeus-nsdi23":
        table, bad = zeus_nsdi23_table(files)
    elif fmt == "perseus-sosp24":
        table, bad = perseus_sosp24_table(files)
    elif fmt == "dcgm-runs":
        table, bad = dcgm_runs_table(files[0], protocol, telemetry_format)
    elif fmt == "sweep-table":
        parts = [read_table(f) for f in files]
        table = pd.concat([p[0] for p in parts], ignore_index=True)
        bad = [b for p in parts for b in p[1]]
    else:
        raise IngestError(f"unknown ingest format {fmt!r}; known: {', '.join(FORMATS)}")
    if table.empty:
        raise IngestError(f"{', '.join(map(str, files))}: no rows could be read"
                          + (f" ({len(bad)} bad, first: {bad[0]['where']}: {bad[0]['reason']})" if bad else ""))
    result = validate_sweep(table, throughput_unit=throughput_unit, defaults=defaults, source_bad=bad)
    result.inputs = [str(f) for f in files]
    check_rejected(result, on_bad_rows)
    if result.runs.empty:
        raise IngestError(f"{', '.join(map(str, files))}: every row was rejected")
    return result


def config_files(ingest_cfg: Mapping[str, Any], base: str | Path) -> list[Path]:
    """The input files of a campaign's ``ingest:`` section (``path`` relative to ``base``)."""
    path = Path(str(ingest_cfg["path"])).expanduser()
    resolved = (path if path.is_absolute() else Path(base) / path).resolve()
    try:
        return source_files(ingest_cfg["format"], resolved)
    except IngestError as exc:
        if not resolved.exists():
            raise IngestError(f"ingest.path {ingest_cfg['path']!r} (resolved to {resolved}) does not exist; put the "
                              f"{ingest_cfg['format']} files there or point ingest.path at them, e.g. "
                              "snakemake --configfile <this config> --config 'ingest={path: /my/data}'") from None
        raise exc


def config_options(ingest_cfg: Mapping[str, Any], summary_cfg: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """``ingest_files`` keyword arguments from the config's ``ingest:`` and ``summary:`` slices."""
    return {"on_bad_rows": ingest_cfg.get("on_bad_rows", "error"), "defaults": ingest_cfg.get("defaults"),
            "throughput_unit": ingest_cfg.get("throughput_unit"), "telemetry_format": ingest_cfg.get("telemetry_format"),
            "protocol": SummaryProtocol.from_config(summary_cfg)}
