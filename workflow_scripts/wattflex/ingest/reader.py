"""The one sweep-table reader: a CSV or parquet table, one row per run, read with each
row's file and line, checked, and turned into rows of ``runs.parquet`` (backend ``"ingest"``).

A sweep table has ``group, cap_w, power_w, throughput`` (``cap_kw``/``power_kw`` and
``tokens_per_s`` are accepted and converted) and optionally ``repeat, power_w_sem,
throughput_sem, gpus, gpu_model, model, architecture, task, cluster, set, seq_len, batch,
ep``, the steady-state telemetry columns of the runs contract (``sm_clock_mhz,
dram_active, ...``) and ``throughput_unit``. Power and caps are **job total** power and
**per-GPU** caps, as in ``runs.parquet``. Columns the table lacks can be given in
``defaults``. The other sources (``wattflex.ingest.sources``) turn their files into such a
table first.

Validation (``validate_sweep``). Every row is checked: numbers where numbers belong,
positive cap/power/throughput, plausible units (per-GPU cap 10-2000 W, per-GPU power
1-2000 W and at most 1.5x its cap, utilisations in %, activities as 0-1 ratios...), safe
group ids, known vocabulary for architecture/task/cluster, no duplicate (group, cap,
repeat), group metadata constant within a group. A bad row is reported with its file and
line (``file.csv line 17``; ``row`` for parquet) and every reason; nothing is dropped
silently: ``check_rejected`` raises on any bad row unless the caller skips them, and then
they are listed in ``IngestResult.rejected`` (the workflow writes them next to
``runs.parquet`` and counts them in the ingest report).

Throughput keeps the source's unit (``throughput_unit`` column): ``tokens_per_s`` in an
ingested ``runs.parquet`` holds that throughput, which is fine for everything downstream
(PFI and the allocation use throughput relative to each job's own ``T_max``).

The commands that take any table (``wattflex pfi``, ``wattflex stats``) read it here too,
typed as pandas would (``read_typed_table``), and check its cells with ``check_cells``, so
a bad row is named by file and line, with the same words, everywhere.
"""

from __future__ import annotations

import csv
import json
import os
import re
import stat
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from wattflex.ingest.dcgm import range_problem
from wattflex.provenance import StaleSidecarError, check_sidecar
from wattflex.run_ids import run_id
from wattflex.telemetry import ACTIVITY_METRICS
from wattflex.vocabulary import JOB_COLUMNS, VOCABULARY, cluster_of

BACKEND = "ingest"
# runs.parquet columns (the contract every source of runs writes), in order; ingest adds
# throughput_unit, source, source_line.
RUN_COLUMNS = [
    "group",
    "run_id",
    "cap_w",
    "repeat",
    "backend",
    "gpu_model",
    "gpus",
    *JOB_COLUMNS,
    "power_w",
    "power_w_sem",
    "tokens_per_s",
    "tokens_per_s_sem",
    "power_w_mean",
    "tokens_per_s_mean",
    *ACTIVITY_METRICS,
    "power_per_gpu_w",
    "throughput_unit",
    "source",
    "source_line",
]
# Constant within a group (a job's description, not a run's measurement).
GROUP_META = ("gpus", "gpu_model", *JOB_COLUMNS, "throughput_unit")
NUMERIC = (
    "cap_w",
    "power_w",
    "throughput",
    "power_w_sem",
    "throughput_sem",
    "gpus",
    "repeat",
    "seq_len",
    "batch",
    "ep",
    "power_w_mean",
    "tokens_per_s_mean",
    *ACTIVITY_METRICS,
)
INTEGER = ("gpus", "repeat", "seq_len", "batch", "ep")
# Source columns in another unit: name -> (our name, factor).
UNIT_ALIASES = {
    "cap_kw": ("cap_w", 1000.0),
    "power_kw": ("power_w", 1000.0),
    "power_kw_sem": ("power_w_sem", 1000.0),
}
THROUGHPUT_ALIASES = {
    "tokens_per_s": ("throughput", "tokens/s"),
    "tokens_per_s_sem": ("throughput_sem", None),
}
CAP_RANGE_W = (10.0, 2000.0)  # per GPU
POWER_RANGE_W = (1.0, 2000.0)  # per GPU
VALUE_COLUMNS = ("cap_w", "power_w", "throughput")  # a run's numbers: finite, positive
SEM_COLUMNS = ("power_w_sem", "throughput_sem")
MAX_POWER_OVER_CAP = 1.5  # averages above 1.5x the cap: job total vs per-GPU mix-up
# Group names are labels (no file path is made of an ingested group), and public sweeps name
# groups after their models (meta-llama/Llama-3.1-8B): letters, digits and . _ - / + : @.
GROUP_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._/+:@-]{0,199}$")
MAX_LISTED = 20  # bad rows spelled out in an error message
PARQUET_SUFFIXES = (".parquet", ".pq")
# The largest input read (``check_input_file``): a sweep table or capture, and a document
# (JSON/YAML config, model, spec, schedule). Bigger is a mistake (/dev/zero, a sparse file).
MAX_TABLE_BYTES = 512 * 2**20
MAX_DOC_BYTES = 64 * 2**20
# pandas.read_csv's default missing-value tokens: the tables the commands read
# (read_typed_table) have always taken these as empty cells.
PANDAS_NA = (
    "",
    "#N/A",
    "#N/A N/A",
    "#NA",
    "-1.#IND",
    "-1.#QNAN",
    "-NaN",
    "-nan",
    "1.#IND",
    "1.#QNAN",
    "<NA>",
    "N/A",
    "NA",
    "NULL",
    "NaN",
    "None",
    "n/a",
    "nan",
    "null",
)


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
        """The ingest in numbers for the provenance record: runs, groups and rejected rows, the inputs
        read, the notes, and the throughput units seen.
        """
        return {
            "n_runs": int(len(self.runs)),
            "n_groups": int(self.runs["group"].nunique()),
            "n_rejected": int(len(self.rejected)),
            "inputs": self.inputs,
            "notes": self.notes,
            "throughput_units": sorted(self.runs["throughput_unit"].dropna().unique().tolist()),
        }


# ---------------------------------------------------------------------------------------
# Reading tables with line numbers
# ---------------------------------------------------------------------------------------


def check_input_file(path: str | Path, what: str = "", max_bytes: int = MAX_TABLE_BYTES) -> None:
    """An input must be a readable regular file of at most ``max_bytes``: say what it is
    instead (a folder, a named pipe or device, missing, unreadable, too big) and what to
    give; ``what`` names the option (``--configfile``). Every command's input passes here,
    before it is opened: a FIFO would block the open, ``/dev/zero`` or a huge file would
    fill the memory."""
    path = Path(path)
    label = f"{what} {path}" if what else str(path)
    try:
        st = path.stat()
    except FileNotFoundError:
        raise IngestError(
            f"{label}: no such file" + (" (a broken symbolic link)" if path.is_symlink() else "")
        ) from None
    except OSError as exc:
        raise IngestError(f"{label}: cannot be read ({exc.strerror or exc})") from None
    if stat.S_ISDIR(st.st_mode):
        raise IngestError(
            f"{label}: is a directory, not a file: give the file in it "
            "(a folder of captures goes to `wattflex ingest <format> FOLDER`)"
        )
    if not stat.S_ISREG(st.st_mode):
        raise IngestError(
            f"{label}: is {_file_kind(st.st_mode)}, not a regular file: write it to a file and give that"
        )
    if not os.access(path, os.R_OK):
        raise IngestError(f"{label}: cannot be read (permission denied)")
    size = st.st_size
    if size > max_bytes:
        raise IngestError(
            f"{label}: is {size / 2**20:,.0f} MiB, over the {max_bytes / 2**20:,.0f} MiB limit "
            "of an input"
        )
    check_own_sidecar(path, label)


def check_own_sidecar(path: Path, label: str) -> None:
    """A wattflex output's ``<path>.meta.json`` beside an input must describe that input: one
    whose ``sha256`` is another file's (a command killed between its renames, a file replaced
    by hand) is refused with one line. A file without a sidecar (a user's own table) passes."""
    sidecar = Path(f"{path}.meta.json")
    if not sidecar.is_file():
        return
    try:
        doc = json.loads(sidecar.read_bytes())
    except (OSError, ValueError) as exc:
        raise IngestError(f"{label}: its sidecar {sidecar} cannot be read ({exc})") from None
    if isinstance(doc, dict):
        try:
            check_sidecar(path, doc)
        except StaleSidecarError as exc:
            raise IngestError(str(exc).replace(str(path), label, 1)) from None


def _file_kind(mode: int) -> str:
    """What a file that is not a regular file or folder is, in words."""
    if stat.S_ISFIFO(mode):
        return "a FIFO (named pipe)"
    if stat.S_ISCHR(mode):
        return "a character device"
    if stat.S_ISBLK(mode):
        return "a block device"
    return "a socket" if stat.S_ISSOCK(mode) else "not a regular file"


def read_input_text(path: str | Path, what: str = "", max_bytes: int = MAX_DOC_BYTES) -> str:
    """The text (UTF-8) of a small input (a JSON or YAML document, a model, a spec), checked
    by ``check_input_file`` and read with a bounded read: a file that grows past
    ``max_bytes`` after the check is refused too."""
    check_input_file(path, what, max_bytes)
    with open(path, "rb") as fh:
        data = fh.read(max_bytes + 1)
    label = f"{what} {path}" if what else str(path)
    if len(data) > max_bytes:
        raise IngestError(f"{label}: over the {max_bytes / 2**20:,.0f} MiB limit of an input")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise IngestError(f"{label}: not UTF-8 text ({exc.reason} at byte {exc.start})") from None


def printable(path: str | os.PathLike) -> str:
    """``path`` as text that can be printed and stored (UTF-8, an Arrow string): a byte of a
    name that is not UTF-8 (Python keeps it as a lone surrogate) shown as ``\\xe9``."""
    return os.fsencode(path).decode("utf-8", "backslashreplace")


def read_csv_named(path: str | os.PathLike, what: str = "", **kwargs: Any) -> pd.DataFrame:
    """``pandas.read_csv(path, **kwargs)``, its refusal (text that is not UTF-8, a malformed
    or empty CSV) one :class:`IngestError` line that names the file (``what``: its role, as
    ``schedule``), never a bare codec error."""
    label = f"{what} {printable(path)}" if what else printable(path)
    try:
        return pd.read_csv(path, **kwargs)
    except UnicodeDecodeError as exc:
        raise IngestError(
            f"{label}: not UTF-8 text (byte {exc.object[exc.start]:#04x} is not UTF-8): "
            "save it as UTF-8"
        ) from None
    except (pd.errors.ParserError, pd.errors.EmptyDataError) as exc:
        raise IngestError(f"{label}: not a readable CSV ({' '.join(str(exc).split())})") from None


def strip_columns(df: pd.DataFrame, where: str | Path) -> pd.DataFrame:
    """``df`` with its column names stripped of blanks (`` cap_w`` is ``cap_w``); two names
    that are one once stripped are refused, by name, not left to fail later."""
    names = [str(c).strip() for c in df.columns]
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise IngestError(
            f"{where}: duplicate column name(s) {', '.join(map(repr, twice))} "
            f"(blanks around a name do not count; columns: {', '.join(map(repr, map(str, df.columns)))})"
        )
    df.columns = names
    return df


def check_single_values(df: pd.DataFrame, where: str | Path) -> None:
    """Every cell one value: a parquet table can hold lists or maps in a cell, which no
    reader of a table takes; the first such cell of each column is named."""
    bad = []
    # only object columns can hold a list or a map (a text column cannot: no select_dtypes
    # "object", which also picks text columns under pandas 3 and warns)
    for col in [c for c in df.columns if df[c].dtype == object]:
        nested = (
            df[col]
            .map(lambda v: isinstance(v, (list, tuple, dict, set, np.ndarray)))
            .to_numpy(bool)
        )
        if nested.any():
            i = int(np.flatnonzero(nested)[0])
            kind = "map" if isinstance(df[col].iloc[i], dict) else "list"
            bad.append(
                f"column {col!r} holds a {kind} in row {i + 1} ({int(nested.sum())} such cell(s))"
            )
    if bad:
        raise IngestError(f"{where}: cells must hold one number or text each: " + "; ".join(bad))


def read_table(
    path: str | Path, *, na_values: Iterable[str] = ("",), pad_short_rows: bool = False
) -> tuple[pd.DataFrame, list[dict]]:
    """A CSV (cells as text) or parquet file, plus a ``_where`` column ("f.csv line 7").

    Blank CSV lines are skipped (they hold no data); a line with the wrong number of
    fields is returned as a bad row, not guessed at (``pad_short_rows``: a short line gets
    empty cells at the end, as pandas reads it). Cells equal to one of ``na_values`` are
    empty (NaN).
    """
    path = Path(path)
    check_input_file(path)
    if path.suffix.lower() in PARQUET_SUFFIXES:
        try:
            df = pd.read_parquet(path)
        except (OSError, ValueError) as exc:
            raise IngestError(
                f"{path}: cannot read: {(str(exc) or repr(exc)).splitlines()[0]}"
            ) from None
        strip_columns(df, path)
        check_single_values(df, path)
        df["_where"] = [f"{printable(path.name)} row {i + 1}" for i in range(len(df))]
        return df, []
    rows, wheres, bad = [], [], []
    # utf-8-sig: a spreadsheet's byte-order mark is not part of the first column's name
    with open(path, newline="", encoding="utf-8-sig") as fh:
        reader = csv.reader(fh)
        header = None
        try:
            for cells in reader:
                if not any(c.strip() for c in cells):
                    continue
                if header is None:
                    header = list(strip_columns(pd.DataFrame(columns=cells), path).columns)
                    continue
                where = f"{printable(path.name)} line {reader.line_num}"
                if pad_short_rows and len(cells) < len(header):
                    cells = cells + [""] * (len(header) - len(cells))
                if len(cells) != len(header):
                    bad.append(
                        {
                            "where": where,
                            "reason": f"{len(cells)} fields, the header has {len(header)}",
                        }
                    )
                    continue
                rows.append([c.strip() for c in cells])
                wheres.append(where)
        except (UnicodeDecodeError, csv.Error) as exc:
            raise IngestError(f"{path}: cannot read: {exc}") from None
    if header is None:
        raise IngestError(f"{path}: empty file (no header line)")
    df = pd.DataFrame(rows, columns=header, dtype=object).replace(dict.fromkeys(na_values, np.nan))
    df["_where"] = wheres
    return df, bad


# Columns that name things (a group, a job, a node): text in every table, never numbers, so
# ``01`` and ``1`` are two groups and ``007`` keeps its zeros.
ID_COLUMNS = ("group", "job", "clock_group", "node", "event_id")


def _id_text(value: Any) -> Any:
    """A number as its text (a parquet's integer id), anything else as it is: a missing cell
    stays missing, a list is still a list for ``check_single_values`` to name."""
    is_number = isinstance(value, (int, float, np.number)) and not isinstance(value, bool)
    return str(value) if is_number and value == value else value


def ids_as_text(df: pd.DataFrame) -> list[str]:
    """Make the ``ID_COLUMNS`` of ``df`` text in place (a parquet's integer ids as well; a
    missing cell stays missing) and return their names."""
    ids = [c for c in ID_COLUMNS if c in df.columns]
    for col in ids:
        df[col] = df[col].map(_id_text)
    return ids


def read_typed_table(path: str | Path) -> pd.DataFrame:
    """A CSV or parquet table typed as ``pandas.read_csv`` types it, for the commands that
    read any table: pandas' missing-value tokens (``PANDAS_NA``) are empty cells, a short
    line is padded with empty cells, a CSV column whose every cell is a number holds
    numbers, except the names in ``ID_COLUMNS``, text always. Each row keeps its ``_where``; a line with too many fields raises
    ``IngestError`` naming it."""
    df, bad = read_table(path, na_values=PANDAS_NA, pad_short_rows=True)
    if bad:
        raise IngestError(describe_bad_rows(bad))
    ids = ids_as_text(df)
    if Path(path).suffix.lower() not in PARQUET_SUFFIXES:
        for col in df.columns.drop(["_where", *ids]):
            try:
                df[col] = pd.to_numeric(df[col])
            except (
                ValueError,
                TypeError,
            ):  # some cell is text: a text column, typed as read_csv types one
                df[col] = df[col].infer_objects()
    return df


def _numbers(values: pd.Series) -> tuple[pd.Series, np.ndarray]:
    """``values`` as numbers (blank text is missing) and the positions of cells that hold
    something that is not a number."""
    raw = values.map(lambda v: np.nan if isinstance(v, str) and not v.strip() else v)
    num = pd.to_numeric(raw, errors="coerce")
    return num, np.flatnonzero((num.isna() & raw.notna()).to_numpy())


def _not_a_number(col: str, cell: Any) -> str:
    return f"{col} is not a number: {cell!r}"


def check_cells(
    df: pd.DataFrame, *, numeric: Iterable[str] = (), required: Iterable[str] = ()
) -> None:
    """Turn the ``numeric`` columns of a ``read_typed_table`` table into numbers (in place)
    and check that no ``required`` cell is empty; raise ``IngestError`` listing every bad
    row by its ``_where`` (absent columns are the caller's to report)."""
    numeric, required = list(numeric), list(required)
    reasons: list[list[str]] = [[] for _ in range(len(df))]
    for col in dict.fromkeys(required + numeric):
        if col not in df:
            continue
        if col in numeric:
            num, wrong = _numbers(df[col])
            for i in wrong:
                reasons[i].append(_not_a_number(col, df[col].iloc[i]))
        if col in required:
            empty = df[col].isna() | df[col].map(lambda v: isinstance(v, str) and not v.strip())
            for i in np.flatnonzero(empty.to_numpy(bool)):
                reasons[i].append(f"{col} is empty")
        if col in numeric:
            df[col] = num
    bad = [
        {"where": df["_where"].iloc[i], "reason": "; ".join(r)} for i, r in enumerate(reasons) if r
    ]
    if bad:
        raise IngestError(describe_bad_rows(bad))


def describe_bad_rows(rejected: pd.DataFrame | Sequence[Mapping[str, str]], hint: str = "") -> str:
    """The message every reader reports bad rows with: a count (then ``hint``), then
    ``where: reason`` for each of the first ``MAX_LISTED``."""
    rows = (
        rejected
        if isinstance(rejected, pd.DataFrame)
        else pd.DataFrame(list(rejected), columns=["where", "reason"])
    )
    lines = [
        f"  {w}: {r}" for w, r in rows[["where", "reason"]].head(MAX_LISTED).itertuples(index=False)
    ]
    more = len(rows) - MAX_LISTED
    return (
        f"{len(rows)} bad row(s){hint}:\n"
        + "\n".join(lines)
        + (f"\n  ... and {more} more" if more > 0 else "")
    )


# ---------------------------------------------------------------------------------------
# Validation of a generic sweep table
# ---------------------------------------------------------------------------------------


def _apply_aliases(
    df: pd.DataFrame, throughput_unit: str | None
) -> tuple[pd.DataFrame, str | None]:
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
        num, wrong = _numbers(df[col])
        for i in wrong:
            reasons[i].append(_not_a_number(col, df[col].iloc[i]))
        df[col] = num.astype(float)


def cap_problem(cap: float) -> str | None:
    """What is wrong with a per-GPU cap in W (a cap in kW or mW is out of range), or None;
    the one rule `wattflex pfi` and every ingest apply."""
    if np.isfinite(cap) and cap > 0 and not CAP_RANGE_W[0] <= cap <= CAP_RANGE_W[1]:
        return (
            f"cap_w = {cap:g} is outside {CAP_RANGE_W[0]:g}-{CAP_RANGE_W[1]:g} W per GPU "
            "(caps are per GPU, in W)"
        )
    return None


def value_problems(
    df: pd.DataFrame,
    sem_cols: Iterable[str | None] = SEM_COLUMNS,
    reasons: list[list[str]] | None = None,
) -> list[list[str]]:
    """The rules on a run's numbers that every reader applies (``wattflex pfi`` leaves such
    rows out, ingest rejects them): cap, power and throughput finite and positive, the cap a
    per-GPU cap in W (``cap_problem``), no negative SEM. Appends to ``reasons`` (one list per
    row of ``df``, new ones if None) and returns it; a cell already reported as not a number
    gets no second reason."""
    reasons = [[] for _ in range(len(df))] if reasons is None else reasons
    with np.errstate(invalid="ignore"):  # one vectorised test per rule, then only the rows it hits
        for col in VALUE_COLUMNS:
            v = df[col].to_numpy(dtype=float)
            for i in np.flatnonzero(~(np.isfinite(v) & (v > 0))):
                if not any(r.startswith(f"{col} is not a number") for r in reasons[i]):
                    reasons[i].append(
                        f"{col} is empty"
                        if np.isnan(v[i])
                        else f"{col} {v[i]:g} is not a finite positive number"
                    )
        cap = df["cap_w"].to_numpy(dtype=float)
        for i in np.flatnonzero((cap < CAP_RANGE_W[0]) | (cap > CAP_RANGE_W[1])):
            problem = cap_problem(cap[i])
            if problem:
                reasons[i].append(problem)
        for col in (c for c in sem_cols if c is not None and c in df):
            v = df[col].to_numpy(dtype=float)
            for i in np.flatnonzero(v < 0):
                reasons[i].append(f"{col} {v[i]:g} is negative")
    return reasons


def _row_checks(df: pd.DataFrame, reasons: list[list[str]]) -> None:
    value_problems(df, reasons=reasons)
    gpus = df["gpus"].to_numpy(float)
    for i in range(len(df)):
        r = reasons[i]
        group = df["group"].iloc[i]
        if pd.isna(group) or not GROUP_NAME.match(str(group)):
            r.append(
                f"group {group!r} is empty or has characters other than letters, digits, . _ - / + : @"
            )
        for col in INTEGER:
            v = df[col].iloc[i] if col in df else np.nan
            if col in ("gpus", "repeat") and col in df and not np.isfinite(v):
                if not any(s.startswith(f"{col} is not a number") for s in r):
                    r.append(f"{col} is empty")
            elif np.isfinite(v) and (v != int(v) or v < (0 if col == "repeat" else 1)):
                r.append(f"{col} must be a whole number >= {0 if col == 'repeat' else 1} ({v:g})")
        n = gpus[i] if np.isfinite(gpus[i]) and gpus[i] >= 1 else np.nan
        cap, power = df["cap_w"].iloc[i], df["power_w"].iloc[i]
        if np.isfinite(power) and power > 0 and np.isfinite(n):
            per_gpu = power / n
            if not POWER_RANGE_W[0] <= per_gpu <= POWER_RANGE_W[1]:
                r.append(
                    f"power_w / gpus = {per_gpu:g} W is outside {POWER_RANGE_W[0]:g}-{POWER_RANGE_W[1]:g} W "
                    "per GPU (power_w is the job total in W: kW, mW or a wrong gpus?)"
                )
            elif np.isfinite(cap) and cap > 0 and per_gpu > MAX_POWER_OVER_CAP * cap:
                r.append(
                    f"power_w / gpus = {per_gpu:g} W is over {MAX_POWER_OVER_CAP:g}x the cap {cap:g} W "
                    "(is power_w the job total with gpus missing?)"
                )
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
            reasons[i].append(
                f"duplicate run (group, cap_w, repeat) = ({same['group'].iloc[0]}, "
                f"{same['cap_w'].iloc[0]:g}, {int(same['repeat'].iloc[0])}): {lines}"
            )
    for col in GROUP_META:
        if col not in good:
            continue
        for _, part in good.groupby("group"):
            values = part[col].astype(str)
            first = values.iloc[0]
            for i in part.index[values != first]:
                reasons[i].append(
                    f"{col} {df[col].iloc[i]!r} differs from {first!r} "
                    f"({part['_where'].iloc[0]}, same group)"
                )


def validate_sweep(
    table: pd.DataFrame,
    *,
    throughput_unit: str | None = None,
    defaults: Mapping[str, Any] | None = None,
    source_bad: Sequence[dict] = (),
) -> IngestResult:
    """Check a sweep table (cells as text or numbers, plus ``_where``) and build run rows.

    Returns every valid row as a run and every invalid one in ``rejected``; the caller
    decides whether rejected rows are fatal (``check_rejected``).
    """
    df = table.copy().reset_index(drop=True)
    if "_where" not in df:
        df["_where"] = [f"table row {i + 1}" for i in range(len(df))]
    strip_columns(df, "sweep table")
    check_single_values(df, "sweep table")
    df, throughput_unit = _apply_aliases(df, throughput_unit)
    missing = [c for c in ("group", "cap_w", "power_w", "throughput") if c not in df]
    if missing:
        raise IngestError(
            f"sweep table lacks column(s) {', '.join(missing)} (has "
            f"{', '.join(c for c in df.columns if c != '_where')}); need group, cap_w, power_w, "
            "throughput (or cap_kw, power_kw, tokens_per_s)"
        )
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
    rejected = pd.DataFrame(
        list(source_bad)
        + [
            {"where": df["_where"].iloc[i], "reason": "; ".join(r)}
            for i, r in enumerate(reasons)
            if r
        ],
        columns=["where", "reason"],
    )
    rejected = rejected.sort_values(
        "where", key=lambda w: w.map(_where_key), kind="stable"
    ).reset_index(drop=True)
    return IngestResult(runs=_run_rows(df[ok]), rejected=rejected, inputs=[], notes=notes)


def _where_key(where: str) -> tuple[str, int]:
    """Sort key of "file.csv line 12": file, then line number."""
    head, _, number = where.rpartition(" ")
    return (head, int(number)) if number.isdigit() else (where, 0)


def _derive_cluster(arch: Any, task: Any) -> Any:
    """The paper's clusters (wattflex.vocabulary.cluster_of); NaN outside the vocabulary."""
    cluster = cluster_of(arch, task)
    return np.nan if cluster is None else cluster


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
        out["cluster"] = out["cluster"].where(
            out["cluster"].notna(), pd.Series(derived, index=out.index, dtype=object)
        )
    out["gpus"] = df["gpus"].astype(int)
    for col in ("seq_len", "batch", "ep"):
        out[col] = df[col] if col in df else np.nan
    out["power_w"] = df["power_w"]
    out["power_w_sem"] = df["power_w_sem"] if "power_w_sem" in df else np.nan
    out["tokens_per_s"] = df["throughput"]
    out["tokens_per_s_sem"] = df["throughput_sem"] if "throughput_sem" in df else np.nan
    out["power_w_mean"] = df["power_w_mean"] if "power_w_mean" in df else df["power_w"]
    out["tokens_per_s_mean"] = (
        df["tokens_per_s_mean"] if "tokens_per_s_mean" in df else df["throughput"]
    )
    for col in ACTIVITY_METRICS:
        out[col] = df[col] if col in df else np.nan
    out["power_per_gpu_w"] = out["power_w"] / out["gpus"]
    out["throughput_unit"] = df["throughput_unit"]
    out["source"] = [w.rsplit(" ", 2)[0] for w in df["_where"]]
    out["source_line"] = [int(w.rsplit(" ", 1)[1]) for w in df["_where"]]
    extra = [
        c
        for c in df.columns
        if c not in out and c not in ("throughput", "throughput_sem", "_where")
    ]
    out = pd.concat([out[RUN_COLUMNS], df[extra]], axis=1)
    return out.sort_values(["group", "cap_w", "repeat"], kind="stable").reset_index(drop=True)


def check_rejected(result: IngestResult, on_bad_rows: str = "error") -> None:
    """Raise ``IngestError`` listing the bad rows unless ``on_bad_rows == "skip"``."""
    if on_bad_rows not in ("error", "skip"):
        raise IngestError(f"on_bad_rows must be 'error' or 'skip', not {on_bad_rows!r}")
    if result.rejected.empty or on_bad_rows == "skip":
        return
    raise IngestError(
        describe_bad_rows(result.rejected, " (on_bad_rows 'skip' leaves them out and lists them)")
    )
