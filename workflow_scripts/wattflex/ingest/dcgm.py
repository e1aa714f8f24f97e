"""DCGM telemetry from files people already have -> the wattflex telemetry schema.

Two text formats are read, both into a long table with ``TELEMETRY_COLUMNS`` (one row per
GPU per sample, NaN where the capture lacks a field), which ``telemetry.summarize_run``
then condenses with the same protocol as a wattflex run:

- **DCGM exporter scrapes** (Prometheus text exposition, what ``curl host:9400/metrics``
  returns). One scrape has no time of its own, so a capture must say when each scrape was
  taken: either the samples carry the exposition format's optional millisecond timestamp,
  or each scrape is preceded by a comment ``# scrape_time <unix seconds | ISO-8601>``, as
  written by e.g.
  ``while sleep 5; do echo "# scrape_time $(date +%s.%N)"; curl -s localhost:9400/metrics; done``;
  or the caller passes one time per file (``times``). Both the current ``DCGM_FI_*`` metric
  names and the old ``dcgm_*`` names of dcgm-exporter 1.x are understood.
- **``dcgmi dmon -e <field ids>``** output: a ``#Entity`` header of short field names
  (``POWER``, ``SMCLK``, ``DRAMA``...), an optional units line, then one ``GPU <i>`` row per
  GPU per sample, ``N/A`` for missing values. dmon prints no times: a sample starts when a
  GPU id repeats, and its time is either a timestamp the capture put at the start of the
  line (ISO-8601 or unix seconds, e.g. ``dcgmi dmon ... | ts '%Y-%m-%dT%H:%M:%.S'``) or
  ``sample index * period_s`` (the ``-d`` delay; sample 0 at t = 0, when dmon started).

Units are converted to the schema's (framebuffer MiB -> GiB, energy mJ -> J) and every value
is range-checked (a DRAM activity of 45 is a percentage where a 0-1 ratio is expected, a
power of 250000 is mW): a bad or unparseable line raises ``DcgmFormatError`` naming the file
and line, never a silent skip. All samples of one scrape / one dmon sample share one ``t_s``
so that ``job_series`` sums power over the job's GPUs at each instant. A capture whose clock
steps back (NTP, a node reboot) has samples of a GPU not later than an earlier one: they are
left out, with a note (``attrs["notes"]`` of the table), so that no instant counts twice.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Sequence
from datetime import UTC, datetime
from pathlib import Path

import numpy as np
import pandas as pd

from wattflex import metrics
from wattflex.metrics import telemetry_columns

# DCGM field id -> (exporter name, dmon short name, column, factor to the schema's unit), from
# the metric registry (wattflex.metrics; ids and names are DCGM's dcgm_fields).
FIELDS = metrics.dcgm_fields()
# The dmon field ids to ask for: `dcgmi dmon -e <DMON_FIELD_IDS> -d 5000`.
DMON_FIELD_IDS = ",".join(str(i) for i in FIELDS)
# Exporter metric names, with newer DCGM and dcgm-exporter 1.x names of the same fields.
EXPORTER_METRICS = {name: (col, f) for name, _, col, f in FIELDS.values()}
EXPORTER_METRICS.update(
    {
        k: (v, next(f for _, _, c, f in FIELDS.values() if c == v))
        for k, v in metrics.dcgm_aliases().items()
    }
)
DMON_NAMES = {short: (col, f) for _, short, col, f in FIELDS.values()}
# Plausible range of each column in the schema's unit, and the hint when a value is outside.
METRIC_RANGES = metrics.ranges()
_RANGE_SLACK = 1e-6  # ratios come out as 1.0000001 from float formatting


class DcgmFormatError(ValueError):
    """A capture that cannot be read as stated; the message names file and line."""


def range_problem(column: str, value: float) -> str | None:
    """Why ``value`` cannot be a ``column`` reading in the schema's unit, or None if it can."""
    lo, hi, unit = METRIC_RANGES[column]
    if not math.isfinite(value):
        return None  # NaN = not captured
    if value < lo - _RANGE_SLACK * max(1.0, abs(lo)) or value > hi + _RANGE_SLACK * max(1.0, hi):
        return f"{column} = {value:g} is outside {lo:g}-{hi:g} {unit}"
    return None


def _parse_time(token: str) -> float | None:
    """Unix seconds from a unix-seconds number or an ISO-8601 string (naive = UTC)."""
    try:
        return float(token)
    except ValueError:
        pass
    try:
        t = datetime.fromisoformat(token.strip())
    except ValueError:
        return None
    if t.tzinfo is None:
        t = t.replace(tzinfo=UTC)
    return t.timestamp()


def drop_backward_samples(
    records: list[dict], name: str, latest: dict[tuple[str, int], float] | None = None
) -> tuple[list[dict], list[str]]:
    """The records (in capture order) less each GPU's samples not later than its latest earlier
    one, and a note saying how many went. Kept, they would sort in beside the samples of those
    seconds already read, and ``job_series`` would add the two up as if they were two GPUs:
    a clock stepping back 15 s doubled a run's power. ``latest`` (each GPU's latest time so
    far, updated) carries the check across the files of one capture, one scrape a file."""
    latest = {} if latest is None else latest
    kept, dropped, back = [], 0, 0.0
    for record in records:
        key = (str(record["node"]), int(record["gpu"]))
        last = latest.get(key)
        if last is not None and record["t_s"] <= last:
            dropped, back = dropped + 1, max(back, last - record["t_s"])
            continue
        latest[key] = record["t_s"]
        kept.append(record)
    if not dropped:
        return kept, []
    return kept, [
        f"{name}: the clock goes back (by up to {back:g} s): left out {dropped} sample(s) not later "
        "than an earlier one of their GPU, so that no instant is counted twice"
    ]


def _frame(records: list[dict], notes: Sequence[str] = ()) -> pd.DataFrame:
    df = pd.DataFrame.from_records(records)
    columns = telemetry_columns()
    for col in columns:
        if col not in df:
            df[col] = np.nan
    df = df[columns]
    df["node"] = df["node"].astype(str)
    df["gpu"] = df["gpu"].astype(int)
    df = df.sort_values(["t_s", "node", "gpu"], kind="stable").reset_index(drop=True)
    df.attrs["notes"] = list(notes)
    return df


def _check(record: dict, where: str) -> None:
    for col, value in record.items():
        if col in METRIC_RANGES:
            problem = range_problem(col, value)
            if problem:
                raise DcgmFormatError(f"{where}: {problem}")


def _read_text(source: str | Path) -> tuple[str, str]:
    path = Path(source)
    try:
        return path.read_text(), str(path)
    except FileNotFoundError:
        raise DcgmFormatError(f"{path}: no such file") from None


# ---------------------------------------------------------------------------------------
# DCGM exporter (Prometheus text exposition)
# ---------------------------------------------------------------------------------------

_SAMPLE = re.compile(
    r"^(?P<name>[A-Za-z_:][A-Za-z0-9_:]*)(?:\{(?P<labels>.*)\})?\s+"
    r"(?P<value>\S+)(?:\s+(?P<ts>-?\d+))?\s*$"
)
_LABEL = re.compile(r'\s*([A-Za-z_][A-Za-z0-9_]*)\s*=\s*"((?:[^"\\]|\\.)*)"\s*(?:,|$)')
_SCRAPE_TIME = re.compile(r"^#\s*scrape_time\s+(\S+)\s*$")


def parse_labels(text: str, where: str) -> dict[str, str]:
    """``a="x",b="y\\"z"`` -> {a: x, b: y"z} (exposition-format escapes undone)."""
    labels, pos = {}, 0
    text = text.strip()
    while pos < len(text):
        m = _LABEL.match(text, pos)
        if not m:
            raise DcgmFormatError(f"{where}: cannot parse labels {{{text}}}")
        labels[m.group(1)] = (
            m.group(2)
            .replace("\\\\", "\0")
            .replace('\\"', '"')
            .replace("\\n", "\n")
            .replace("\0", "\\")
        )
        pos = m.end()
    return labels


def _exporter_blocks(text: str, name: str) -> Iterable[tuple[float | None, list[tuple[int, str]]]]:
    """Split a capture into scrapes at ``# scrape_time`` lines: (time or None, [(line no, line)])."""
    time, lines = None, []
    for no, line in enumerate(text.splitlines(), start=1):
        m = _SCRAPE_TIME.match(line.strip())
        if m:
            if lines:
                yield time, lines
            time = _parse_time(m.group(1))
            if time is None:
                raise DcgmFormatError(f"{name} line {no}: cannot read scrape time {m.group(1)!r}")
            lines = []
        elif line.strip() and not line.lstrip().startswith("#"):
            lines.append((no, line))
    if lines:
        yield time, lines


def parse_dcgm_exporter(
    text: str,
    name: str,
    time: float | None = None,
    node: str = "node0",
    gpu_ids: Iterable[int] | None = None,
) -> list[dict]:
    """Telemetry records (dicts of ``TELEMETRY_COLUMNS`` keys) from the text of one capture or
    one scrape; ``name`` is what error messages call it. A scrape's time is its
    ``# scrape_time`` line, else its samples' timestamps, else ``time``; none: error."""
    keep = None if gpu_ids is None else {int(g) for g in gpu_ids}
    records: list[dict] = []
    for block_time, lines in _exporter_blocks(text, name):
        rows: dict[tuple[str, int], dict] = {}
        stamps: list[float] = []
        for no, line in lines:
            where = f"{name} line {no}"
            m = _SAMPLE.match(line.strip())
            if not m:
                raise DcgmFormatError(
                    f"{where}: not a Prometheus sample line: {line.strip()[:80]!r}"
                )
            metric = EXPORTER_METRICS.get(m.group("name"))
            if metric is None:
                continue
            col, factor = metric
            labels = parse_labels(m.group("labels") or "", where)
            if "gpu" not in labels:
                raise DcgmFormatError(f"{where}: {m.group('name')} has no gpu label")
            try:
                gpu, value = int(labels["gpu"]), float(m.group("value")) * factor
            except ValueError:
                raise DcgmFormatError(
                    f"{where}: bad gpu label or value in {line.strip()[:80]!r}"
                ) from None
            if keep is not None and gpu not in keep:
                continue
            host = labels.get("Hostname") or labels.get("instance") or node
            row = rows.setdefault((host, gpu), {"node": host, "gpu": gpu})
            if col in row:
                raise DcgmFormatError(
                    f"{where}: second {m.group('name')} for gpu {gpu} on {host} in one "
                    "scrape; separate scrapes with '# scrape_time <t>' lines"
                )
            row[col] = value
            _check({col: value}, where)
            if m.group("ts"):
                stamps.append(int(m.group("ts")) / 1000.0)
        t = block_time if block_time is not None else (float(np.median(stamps)) if stamps else time)
        if t is None:
            raise DcgmFormatError(
                f"{name}: a scrape has no time: add '# scrape_time <unix s>' before each "
                "scrape, sample timestamps, or pass one time per file"
            )
        for row in rows.values():
            records.append({"t_s": t, **row})
    return records


def read_dcgm_exporter(
    sources: Sequence[str | Path],
    times: Sequence[float] | None = None,
    node: str = "node0",
    gpu_ids: Iterable[int] | None = None,
) -> pd.DataFrame:
    """Telemetry from DCGM exporter scrape files (see module docstring for how times are found).

    ``node`` is used when a sample has no ``Hostname`` label; ``gpu_ids`` keeps only those
    GPUs (a node's exporter reports all of them, a job may use a few). Metrics wattflex does
    not use are ignored; a used metric without a ``gpu`` label is an error.
    """
    if times is not None and len(times) != len(sources):
        raise DcgmFormatError(f"{len(times)} scrape times given for {len(sources)} files")
    records: list[dict] = []
    notes: list[str] = []
    latest: dict[tuple[str, int], float] = {}  # across the files: one scrape each, in order
    for i, source in enumerate(sources):
        text, name = _read_text(source)
        kept, dropped = drop_backward_samples(
            parse_dcgm_exporter(
                text, name, None if times is None else float(times[i]), node, gpu_ids
            ),
            name,
            latest,
        )
        records += kept
        notes += dropped
    if not records:
        raise DcgmFormatError(
            f"{', '.join(map(str, sources))}: no DCGM power/clock/activity samples found"
        )
    return _frame(records, notes)


# ---------------------------------------------------------------------------------------
# dcgmi dmon
# ---------------------------------------------------------------------------------------

_DMON_ROW = re.compile(
    r"^(?P<stamp>\S+(?:[T ]\d{2}:\d{2}:\d{2}(?:\.\d+)?(?:Z|[+-]\d{2}:?\d{2})?)?\s+)?"
    r"GPU\s+(?P<gpu>\d+)\s+(?P<values>.*)$"
)


def read_dcgmi_dmon(
    source: str | Path,
    period_s: float | None = None,
    node: str = "node0",
    gpu_ids: Iterable[int] | None = None,
) -> pd.DataFrame:
    """Telemetry from ``dcgmi dmon`` output (see module docstring). ``period_s`` = the ``-d``
    delay in seconds, needed when the lines carry no timestamps."""
    text, name = _read_text(source)
    records = parse_dcgmi_dmon(text, name, period_s, node, gpu_ids)
    if not records:
        raise DcgmFormatError(f"{name}: no 'GPU <i>' sample lines")
    return _frame(*drop_backward_samples(records, name))


def parse_dcgmi_dmon(
    text: str,
    name: str,
    period_s: float | None = None,
    node: str = "node0",
    gpu_ids: Iterable[int] | None = None,
) -> list[dict]:
    """Telemetry records (dicts of ``TELEMETRY_COLUMNS`` keys) from ``dcgmi dmon`` text, which
    may be a partial capture (none: empty list); ``name`` is what error messages call it."""
    keep = None if gpu_ids is None else {int(g) for g in gpu_ids}
    header: list[str] | None = None
    records: list[dict] = []
    sample, seen, sample_t = -1, set(), None
    for no, raw in enumerate(text.splitlines(), start=1):
        line = raw.strip()
        where = f"{name} line {no}"
        if not line:
            continue
        if line.startswith("#"):
            tokens = line.lstrip("#").split()
            if tokens and tokens[0].lower() == "entity":
                header = tokens[1:]
                unknown = [t for t in header if t not in DMON_NAMES]
                if unknown and len(unknown) == len(header):
                    raise DcgmFormatError(
                        f"{where}: none of the dmon fields {header} is one wattflex reads "
                        f"(use dcgmi dmon -e {DMON_FIELD_IDS})"
                    )
            continue
        if line.split()[0] in ("ID", "Id", "id"):
            continue  # the units line under the header
        m = _DMON_ROW.match(line)
        if not m:
            raise DcgmFormatError(f"{where}: not a dcgmi dmon line: {line[:80]!r}")
        if header is None:
            raise DcgmFormatError(f"{where}: data before the '#Entity' header line")
        values = m.group("values").split()
        if len(values) != len(header):
            raise DcgmFormatError(
                f"{where}: {len(values)} values for {len(header)} fields {header}"
            )
        gpu = int(m.group("gpu"))
        stamp = _parse_time(m.group("stamp").strip()) if m.group("stamp") else None
        if m.group("stamp") and stamp is None:
            raise DcgmFormatError(
                f"{where}: cannot read the timestamp {m.group('stamp').strip()!r}"
            )
        if gpu in seen or sample < 0:  # a repeated GPU id starts the next sample
            sample, seen, sample_t = sample + 1, set(), stamp
        seen.add(gpu)
        if keep is not None and gpu not in keep:
            continue
        if sample_t is None and period_s is None:
            raise DcgmFormatError(
                f"{where}: dcgmi dmon lines carry no time: give period_s (the -d delay)"
            )
        record = {
            "t_s": sample_t if sample_t is not None else sample * float(period_s),
            "node": node,
            "gpu": gpu,
        }
        for short, token in zip(header, values):
            if short not in DMON_NAMES:
                continue
            col, factor = DMON_NAMES[short]
            if token.upper() in ("N/A", "NA", "-"):
                record[col] = np.nan
                continue
            try:
                record[col] = float(token) * factor
            except ValueError:
                raise DcgmFormatError(f"{where}: {short} value {token!r} is not a number") from None
        _check(record, where)
        records.append(record)
    return records
