"""Measured sweeps from elsewhere -> rows of ``runs.parquet`` (backend ``"ingest"``): the
sources, and the entry point that reads any of them.

A campaign with ``source: ingest`` skips the run rules: its ``runs.parquet`` is built here
from files people already have, then flows through PFI and the rest unchanged. Each source
becomes a generic sweep table, which ``wattflex.ingest.reader`` (the one sweep-table
reader) checks row by row and turns into runs. Formats (``FORMATS``):

- ``sweep-table``: a CSV or parquet file (or a folder of them), one row per run, read as
  it is (see ``wattflex.ingest.reader`` for its columns).
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
  ``node``, ``gpu_ids`` like ``0;1;2;3``, ``start_unix`` and the metadata columns of a sweep
  table). ``telemetry`` is one capture file or several joined by ``;`` (one per node),
  ``steps`` a step log CSV with ``step, t_end_s, tokens[, loss]``; paths are relative to the
  manifest. Each run is read with :mod:`wattflex.ingest.dcgm` and condensed by
  ``telemetry.summarize_run`` (the same protocol as a wattflex run), so it carries SEMs and
  steady-state telemetry.

A source cell that cannot be read (a non-numeric power, a capture that does not parse) is a
bad row named by file and line, like a sweep table's. ``ingest_files`` dispatches on the
format; it lives here, beside ``FORMATS`` and ``source_files``, so that a new format is
added in this module (and to the choices of ``wattflex ingest``); the reader knows none.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from wattflex.ingest.dcgm import DcgmFormatError, read_dcgm_exporter, read_dcgmi_dmon
from wattflex.ingest.reader import (
    IngestError,
    IngestResult,
    check_input_file,
    check_rejected,
    read_table,
    validate_sweep,
)
from wattflex.telemetry import ACTIVITY_METRICS, STEP_COLUMNS, SummaryProtocol, summarize_run
from wattflex.vocabulary import JOB_COLUMNS

FORMATS = ("sweep-table", "zeus-nsdi23", "perseus-sosp24", "dcgm-runs")


def source_files(fmt: str, path: str | Path) -> list[Path]:
    """The files an ingest of ``fmt`` reads from ``path`` (a file or a folder)."""
    if fmt not in FORMATS:
        raise IngestError(f"unknown ingest format {fmt!r}; known: {', '.join(FORMATS)}")
    path = Path(path)
    if not path.exists():
        raise IngestError(
            f"ingest path {path} does not exist; point ingest.path in the config at the data "
            "(e.g. snakemake --config 'ingest={path: /my/data}')"
        )
    if path.is_file():
        files = [path]
    elif not path.is_dir():
        check_input_file(path)  # a named pipe or device: says what it is
        files = [path]
    else:
        pattern = {
            "zeus-nsdi23": "summary_power_*.csv",
            "perseus-sosp24": "power_limit_sweeps_*.csv",
            "sweep-table": "*",
            "dcgm-runs": "*.csv",
        }[fmt]
        files = sorted(
            p
            for p in path.glob(pattern)
            if p.is_file()
            and (fmt != "sweep-table" or p.suffix.lower() in (".csv", ".parquet", ".pq"))
        )
        if fmt == "dcgm-runs" and len(files) != 1:
            raise IngestError(
                f"{path}: a dcgm-runs ingest reads one manifest CSV; found {len(files)} CSV files"
            )
    if not files:
        shown = "*.csv, *.parquet" if fmt == "sweep-table" else pattern
        raise IngestError(
            f"{path}: no input files for format {fmt} (expected {shown} in the folder)"
        )
    if fmt == "dcgm-runs":
        files += manifest_files(files[0])
    return files


# ---------------------------------------------------------------------------------------
# Per-source adapters
# ---------------------------------------------------------------------------------------


def _numeric(df: pd.DataFrame, col: str, bad: list[dict], positive: bool = True) -> pd.Series:
    """``df[col]`` as floats; a cell that is not a (positive) number becomes a bad row."""
    num = pd.to_numeric(df[col], errors="coerce").astype(float)
    wrong = num.isna() | (num <= 0 if positive else False)
    for i in np.flatnonzero(wrong.to_numpy()):
        bad.append(
            {
                "where": df["_where"].iloc[i],
                "reason": f"{col} is not a{' positive' if positive else ''} "
                f"number: {df[col].iloc[i]!r}",
            }
        )
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


def _open_trace(
    path: Path, stem: str, bad: list[dict], required: Sequence[str]
) -> tuple[str, pd.DataFrame]:
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
        token, df = _open_trace(
            path,
            "summary_power",
            bad,
            (
                "dataset",
                "network",
                "batch_size",
                "optimizer",
                "power_limit",
                "time_per_epoch",
                "average_power",
            ),
        )
        gpu = ZEUS_GPUS.get(token.lower(), token.upper())
        cap = _numeric(df, "power_limit", bad)
        power = _numeric(df, "average_power", bad)
        epoch_s = _numeric(df, "time_per_epoch", bad)
        batch = _numeric(df, "batch_size", bad)
        out = pd.DataFrame(
            {
                "group": [
                    _slug(gpu.lower(), d, n, f"b{b:g}" if np.isfinite(b) else b, o)
                    for d, n, b, o in zip(df["dataset"], df["network"], batch, df["optimizer"])
                ],
                "cap_w": cap,
                "power_w": power,
                "throughput": 3600.0 / epoch_s,
                "gpus": 1,
                "gpu_model": gpu,
                "model": df["network"],
                "architecture": "dense",
                "batch": batch,
                "dataset": df["dataset"],
                "optimizer": df["optimizer"],
                "throughput_unit": "epochs/h",
                "_where": df["_where"],
            }
        )
        frames.append(_drop_bad(out, bad))
    return pd.concat(frames, ignore_index=True), bad


def perseus_sosp24_table(paths: Sequence[str | Path]) -> tuple[pd.DataFrame, list[dict]]:
    """Perseus SOSP'24 ``power_limit_sweeps_<gpu>.csv`` files -> a generic sweep table."""
    frames, bad = [], []
    for path in map(Path, paths):
        token, df = _open_trace(
            path,
            "power_limit_sweeps",
            bad,
            ("model_name", "batch_size", "dp", "tp", "pp", "time", "energy", "power_limit_0"),
        )
        gpu = token.upper()
        limit_cols = sorted(
            (c for c in df if re.fullmatch(r"power_limit_\d+", c)),
            key=lambda c: int(c.rsplit("_", 1)[1]),
        )
        dp, tp, pp = (_numeric(df, c, bad) for c in ("dp", "tp", "pp"))
        time_s, energy_j = _numeric(df, "time", bad), _numeric(df, "energy", bad)
        batch = _numeric(df, "batch_size", bad)
        limits = np.column_stack(
            [pd.to_numeric(df[c], errors="coerce").to_numpy(float) for c in limit_cols]
        )
        cap = np.full(len(df), np.nan)
        for i in range(len(df)):
            if not np.isfinite(pp.iloc[i]):
                continue
            k = int(pp.iloc[i])
            used, unused = limits[i, :k], limits[i, k:]
            if k > len(limit_cols):
                bad.append(
                    {
                        "where": df["_where"].iloc[i],
                        "reason": f"pp = {k} but only {len(limit_cols)} power_limit columns",
                    }
                )
            elif not (np.isfinite(used).all() and (used > 0).all() and (used == used[0]).all()):
                bad.append(
                    {
                        "where": df["_where"].iloc[i],
                        "reason": f"power_limit_0..{k - 1} must be one positive "
                        f"cap shared by all {k} pipeline stages, got {used.tolist()}",
                    }
                )
            elif (np.nan_to_num(unused) != 0).any():
                bad.append(
                    {
                        "where": df["_where"].iloc[i],
                        "reason": f"power_limit_{k}.. must be 0 or empty for a "
                        f"{k}-stage pipeline, got {unused.tolist()}",
                    }
                )
            else:
                cap[i] = used[0]
        gpus = dp * tp * pp
        out = pd.DataFrame(
            {
                "group": [
                    _slug(gpu.lower(), mdl, f"dp{d:g}tp{t:g}pp{p:g}", f"b{b:g}")
                    for mdl, d, t, p, b in zip(df["model_name"], dp, tp, pp, batch)
                ],
                "cap_w": cap,
                "power_w": energy_j / time_s,
                "throughput": batch / time_s,
                "gpus": gpus,
                "gpu_model": gpu,
                "model": df["model_name"],
                "architecture": "dense",
                "batch": batch,
                "dp": dp,
                "tp": tp,
                "pp": pp,
                "throughput_unit": "samples/s",
                "_where": df["_where"],
            }
        )
        frames.append(_drop_bad(out, bad))
    return pd.concat(frames, ignore_index=True), bad


# ---------------------------------------------------------------------------------------
# Per-run DCGM telemetry + step logs
# ---------------------------------------------------------------------------------------

TELEMETRY_FORMATS = ("dcgm-exporter", "dcgmi-dmon")
_MANIFEST_META = ("gpus", "gpu_model", *JOB_COLUMNS)


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
            raise IngestError(
                f"{df['_where'].iloc[i]}: {col} is not a{' positive' if col == 'tokens' else ''} "
                f"number: {df[col].iloc[i]!r}"
            )
    back = np.flatnonzero(np.diff(out["t_end_s"].to_numpy()) <= 0)
    if back.size:
        raise IngestError(f"{df['_where'].iloc[back[0] + 1]}: t_end_s does not increase")
    return out[STEP_COLUMNS]


def align_clocks(
    telemetry: pd.DataFrame, steps: pd.DataFrame, start_unix: float | None = None
) -> tuple[pd.DataFrame, pd.DataFrame]:
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
            raise IngestError(
                "telemetry has unix times but the step log relative ones: give start_unix "
                "(the unix time of the step log's zero)"
            )
        tel["t_s"] = tel["t_s"] - float(start_unix)
    elif steps_abs and not tel_abs:
        raise IngestError(
            "the step log has unix times but the telemetry relative ones; use one clock"
        )
    t0 = float(tel["t_s"].min()) if (tel_abs and steps_abs) else 0.0
    tel["t_s"] = tel["t_s"] - t0
    st["t_end_s"] = st["t_end_s"] - t0
    return tel, st


def read_run_telemetry(
    files: Sequence[Path],
    fmt: str,
    period_s: float | None,
    node: str | None,
    gpu_ids: Iterable[int] | None,
) -> pd.DataFrame:
    """One run's telemetry from its capture ``files`` in ``fmt`` (``dcgm-exporter`` scrapes, or one
    ``dcgmi dmon`` log per node sampled every ``period_s`` s), on the ``gpu_ids`` given, in the
    telemetry schema; notes on the reading in ``attrs["notes"]``.

    Raises IngestError for an unknown format (and the readers' own for bad files).
    """
    if fmt == "dcgm-exporter":
        return read_dcgm_exporter(files, node=node or "node0", gpu_ids=gpu_ids)
    if fmt == "dcgmi-dmon":
        parts = [
            read_dcgmi_dmon(f, period_s=period_s, node=node or f"node{k}", gpu_ids=gpu_ids)
            for k, f in enumerate(files)
        ]
        tel = pd.concat(parts, ignore_index=True)
        tel.attrs["notes"] = [n for p in parts for n in p.attrs["notes"]]
        return tel
    raise IngestError(
        f"telemetry_format must be one of {', '.join(TELEMETRY_FORMATS)}, not {fmt!r}"
    )


def dcgm_runs_table(
    manifest: str | Path,
    protocol: SummaryProtocol = SummaryProtocol(),
    telemetry_format: str | None = None,
) -> tuple[pd.DataFrame, list[dict], list[str]]:
    """A dcgm-runs manifest -> a generic sweep table, one summarised run per row; the rows
    that cannot be read (where, reason); notes on the captures (samples left out)."""
    manifest = Path(manifest)
    df = _manifest(manifest)
    rows, bad, notes = [], [], []
    for _, m in df.iterrows():
        where = m["_where"]
        try:
            fmt = (
                m.get("telemetry_format")
                if not pd.isna(m.get("telemetry_format", np.nan))
                else telemetry_format
            )
            files = [
                manifest.parent / p.strip() for p in str(m["telemetry"]).split(";") if p.strip()
            ]
            period = (
                float(m["period_s"]) if "period_s" in m and not pd.isna(m["period_s"]) else None
            )
            gpu_ids = (
                [int(g) for g in str(m["gpu_ids"]).split(";")]
                if "gpu_ids" in m and not pd.isna(m["gpu_ids"])
                else None
            )
            node = m["node"] if "node" in m and not pd.isna(m["node"]) else None
            start = (
                float(m["start_unix"])
                if "start_unix" in m and not pd.isna(m["start_unix"])
                else None
            )
            tel = read_run_telemetry(files, fmt or "", period, node, gpu_ids)
            notes += [f"{where}: {note}" for note in tel.attrs["notes"]]
            tel, steps = align_clocks(
                tel, read_steps(manifest.parent / str(m["steps"]).strip()), start
            )
            s = summarize_run(tel, steps, protocol)
        except (DcgmFormatError, IngestError, ValueError) as exc:
            bad.append({"where": where, "reason": str(exc)})
            continue
        row = {
            "group": m["group"],
            "cap_w": m["cap_w"],
            "power_w": s["power_w"],
            "throughput": s["tokens_per_s"],
            "power_w_sem": s["power_w_sem"],
            "throughput_sem": s["tokens_per_s_sem"],
            "power_w_mean": s["power_w_mean"],
            "tokens_per_s_mean": s["tokens_per_s_mean"],
            "gpus": m["gpus"] if "gpus" in m and not pd.isna(m["gpus"]) else s["gpus_seen"],
            "throughput_unit": "tokens/s",
            "aggregate": s["aggregate"],
            "n_samples_training": s["n_samples_training"],
            "n_steps_training": s["n_steps_training"],
            **{k: s[k] for k in ACTIVITY_METRICS if k in s},
            "_where": where,
        }
        if "repeat" in m and not pd.isna(m["repeat"]):
            row["repeat"] = m["repeat"]
        row.update(
            {k: m[k] for k in _MANIFEST_META if k in m and k != "gpus" and not pd.isna(m[k])}
        )
        rows.append(row)
    return pd.DataFrame(rows), bad, notes


# ---------------------------------------------------------------------------------------
# Entry point
# ---------------------------------------------------------------------------------------


def ingest(fmt: str, path: str | Path, **options: Any) -> IngestResult:
    """Read ``path`` (a file or folder) in format ``fmt``; see ``ingest_files`` for options."""
    return ingest_files(fmt, source_files(fmt, path), **options)


def ingest_files(
    fmt: str,
    files: Sequence[str | Path],
    *,
    on_bad_rows: str = "error",
    defaults: Mapping[str, Any] | None = None,
    throughput_unit: str | None = None,
    protocol: SummaryProtocol = SummaryProtocol(),
    telemetry_format: str | None = None,
) -> IngestResult:
    """Validated run rows from ``files`` (as ``source_files`` lists them; for ``dcgm-runs``
    the manifest first). ``on_bad_rows``: ``error`` raises on any bad row, ``skip`` leaves
    them out and lists them in ``rejected``; ``defaults`` fills columns a table lacks."""
    files = [Path(f) for f in files]
    notes: list[str] = []
    if fmt == "zeus-nsdi23":
        table, bad = zeus_nsdi23_table(files)
    elif fmt == "perseus-sosp24":
        table, bad = perseus_sosp24_table(files)
    elif fmt == "dcgm-runs":
        table, bad, notes = dcgm_runs_table(files[0], protocol, telemetry_format)
    elif fmt == "sweep-table":
        parts = [read_table(f) for f in files]
        table = pd.concat([p[0] for p in parts], ignore_index=True)
        bad = [b for p in parts for b in p[1]]
    else:
        raise IngestError(f"unknown ingest format {fmt!r}; known: {', '.join(FORMATS)}")
    if table.empty:
        raise IngestError(
            f"{', '.join(map(str, files))}: no rows could be read"
            + (f" ({len(bad)} bad, first: {bad[0]['where']}: {bad[0]['reason']})" if bad else "")
        )
    result = validate_sweep(
        table, throughput_unit=throughput_unit, defaults=defaults, source_bad=bad
    )
    result.inputs = [str(f) for f in files]
    result.notes += notes
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
            raise IngestError(
                f"ingest.path {ingest_cfg['path']!r} (resolved to {resolved}) does not exist; put the "
                f"{ingest_cfg['format']} files there or point ingest.path at them, e.g. "
                "snakemake --configfile <this config> --config 'ingest={path: /my/data}'"
            ) from None
        raise exc


def config_options(
    ingest_cfg: Mapping[str, Any], summary_cfg: Mapping[str, Any] | None = None
) -> dict[str, Any]:
    """``ingest_files`` keyword arguments from the config's ``ingest:`` and ``summary:`` slices."""
    return {
        "on_bad_rows": ingest_cfg.get("on_bad_rows", "error"),
        "defaults": ingest_cfg.get("defaults"),
        "throughput_unit": ingest_cfg.get("throughput_unit"),
        "telemetry_format": ingest_cfg.get("telemetry_format"),
        "protocol": SummaryProtocol.from_config(summary_cfg),
    }
