"""DCGM as a telemetry source of real runs (``cuda.telemetry: nvml | dcgm | auto``).

Where a site runs dcgm-exporter or ``nv-hostengine`` with profiling, DCGM holds the GPUs'
profiling counters and NVML's GPM reads fail or conflict, so the predictor's features come
out NaN. Then the profiling fields are read from DCGM instead, and everything else still
from NVML, on the sampler's clock:

* from DCGM (``DCGM_COLUMNS``): ``dram_active`` (DCGM_FI_PROF_DRAM_ACTIVE, field 1005),
  ``sm_active`` (PROF_SM_ACTIVE, 1002), ``tensor_active`` (PROF_PIPE_TENSOR_ACTIVE, 1004),
  ``gpu_util`` (DEV_GPU_UTIL, 203), ``mem_copy_util`` (DEV_MEM_COPY_UTIL, 204): the
  predictor's inputs, from one source;
* from NVML (``devices.nvml.NvmlGpu``, GPM off): power, energy, clocks, temperature,
  framebuffer, the management and enforced limits, clock event reasons; RAPL host power.
  Caps are set and read back through NVML as always.

Two ways to read DCGM (``cuda.dcgm.mode``):

* ``dmon`` (default): a ``dcgmi dmon -e <field ids> -i <gpus> -d <period ms>`` subprocess for
  the run's length; each ``GPU <i>`` line is stamped with the sampler's clock when it
  arrives and the lines are parsed by ``wattflex.ingest.dcgm.parse_dcgmi_dmon``.
* ``exporter``: dcgm-exporter's ``/metrics`` (``cuda.dcgm.url``) fetched every sampler
  period, each scrape parsed by ``wattflex.ingest.dcgm.parse_dcgm_exporter`` and stamped
  with the time it was fetched.

Each NVML row gets the latest DCGM reading of its GPU at or before it, if that reading is
less than ``staleness_s`` old (else NaN: a stalled DCGM never fills a row with old values).

``auto`` decides once per node, at start, before any cap: NVML when GPM is readable on every
GPU of the node (``GpmReader`` took a first sample); else DCGM if it answers (``dmon``:
``dcgmi dmon -e <fields> -c 1`` prints a value for at least one of the fields within
``PROBE_TIMEOUT_S``; ``exporter``: the URL returns a scrape with at least one of them); else
NVML, profiling fields NaN. The choice and its
reason go into run.json (``telemetry.source``, ``nodes[].telemetry``) and the telemetry
parquet metadata (``telemetry_source``). ``dcgm`` that does not answer fails the run before
any cap is set. A GPM failure that starts mid-run does not switch sources.
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import math
import shutil
import signal
import subprocess
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from wattflex.ingest.dcgm import FIELDS, DcgmFormatError, parse_dcgm_exporter, parse_dcgmi_dmon
from wattflex.metrics import dcgm_profiling_columns

log = logging.getLogger("wattflex.runs.devices.dcgm_sampler")

TELEMETRY_MODES = ("nvml", "dcgm", "auto")
READ_MODES = ("dmon", "exporter")
# The profiling columns read from DCGM where GPM cannot (the metric registry's dcgm_profiling).
DCGM_COLUMNS = dcgm_profiling_columns()
COLUMN_FIELD_IDS = {col: fid for fid, (_, _, col, _) in FIELDS.items()}
DEFAULT_FIELD_IDS = tuple(COLUMN_FIELD_IDS[c] for c in DCGM_COLUMNS)
PROBE_TIMEOUT_S = 5.0
STOP_TIMEOUT_S = 5.0


@dataclass
class DcgmSettings:
    """``cuda.dcgm``: how DCGM is read (see the module docstring)."""

    mode: str = "dmon"
    url: str | None = None
    fields: tuple[int, ...] = DEFAULT_FIELD_IDS
    dcgmi: str = "dcgmi"

    @classmethod
    def from_spec(cls, dcgm: dict[str, Any] | None) -> DcgmSettings:
        """The settings of a spec's ``cuda.dcgm`` block (defaults: dmon mode, the default fields).

        Raises ValueError for an unknown mode, exporter mode without an http(s) URL, or a field id
        DCGM or the telemetry schema does not know.
        """
        dcgm = dict(dcgm or {})
        mode = str(dcgm.get("mode", "dmon"))
        if mode not in READ_MODES:
            raise ValueError(f"cuda.dcgm.mode {mode!r}: expected one of {', '.join(READ_MODES)}")
        url = dcgm.get("url")
        if mode == "exporter" and not (
            isinstance(url, str) and url.startswith(("http://", "https://"))
        ):
            raise ValueError(
                f"cuda.dcgm.url {url!r}: mode exporter needs the dcgm-exporter's http(s) URL, "
                "e.g. http://localhost:9400/metrics"
            )
        fields = tuple(int(f) for f in (dcgm.get("fields") or DEFAULT_FIELD_IDS))
        unknown = [f for f in fields if f not in FIELDS or FIELDS[f][2] not in DCGM_COLUMNS]
        if unknown:
            known = ", ".join(f"{COLUMN_FIELD_IDS[c]} ({c})" for c in DCGM_COLUMNS)
            raise ValueError(
                f"cuda.dcgm.fields {unknown}: not DCGM fields wattflex reads from DCGM; use some of {known}"
            )
        return cls(mode=mode, url=url, fields=fields, dcgmi=str(dcgm.get("dcgmi") or "dcgmi"))

    @property
    def columns(self) -> list[str]:
        """The telemetry columns the chosen DCGM fields fill, in field order."""
        return [FIELDS[f][2] for f in self.fields]

    def describe(self) -> dict[str, Any]:
        """The settings for run.json: mode, URL, field ids and their columns."""
        return {
            "mode": self.mode,
            "url": self.url,
            "fields": list(self.fields),
            "columns": self.columns,
        }


def probe(settings: DcgmSettings, timeout_s: float = PROBE_TIMEOUT_S) -> str | None:
    """None if DCGM answers as ``settings`` would read it, else why not (one line)."""
    if settings.mode == "dmon":
        prog = shutil.which(settings.dcgmi)
        if prog is None:
            return f"{settings.dcgmi} not found on PATH (install DCGM, or set cuda.dcgm.dcgmi)"
        # one sample of the very fields the run asks for: the host engine answers AND serves them
        cmd = [prog, "dmon", "-e", ",".join(map(str, settings.fields)), "-c", "1"]
        try:
            r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s)
        except (OSError, subprocess.TimeoutExpired) as exc:
            return f"{' '.join(cmd)}: no answer ({type(exc).__name__})"
        if r.returncode != 0:
            last = (r.stderr or r.stdout).strip().splitlines()[-1:] or [""]
            return f"{' '.join(cmd)} exited {r.returncode}: {last[0]} (is nv-hostengine running?)"
        try:
            records = parse_dcgmi_dmon(r.stdout, f"{' '.join(cmd)} output", period_s=1.0)
        except DcgmFormatError as exc:
            return str(exc)
        if not any(
            not math.isnan(rec.get(c, math.nan)) for rec in records for c in settings.columns
        ):
            return (
                f"{' '.join(cmd)} gives no value for {', '.join(settings.columns)} "
                f"(DCGM_FI_PROF_* need DCGM's profiling module on a supported GPU)"
            )
        return None
    try:
        records = parse_dcgm_exporter(fetch(settings.url, timeout_s), settings.url, time=0.0)
    except (OSError, urllib.error.URLError, ValueError) as exc:
        return f"dcgm-exporter at {settings.url}: {exc}"
    if not any(c in r for r in records for c in settings.columns):
        return f"dcgm-exporter at {settings.url} serves none of {', '.join(settings.columns)} (DCGM_FI_PROF_* need profiling)"
    return None


def fetch(url: str, timeout_s: float) -> str:
    """The body of ``url`` as text, waiting at most ``timeout_s`` s.

    Raises OSError (``urllib.error.URLError``) when it cannot be fetched.
    """
    with urllib.request.urlopen(url, timeout=timeout_s) as resp:
        return resp.read().decode(errors="replace")


def choose_source(
    mode: str,
    gpus: Sequence[Any],
    settings: DcgmSettings | None,
    answers: Callable[[DcgmSettings], str | None] = probe,
) -> dict[str, Any]:
    """``{"source": "nvml" | "dcgm", "reason": ...}`` for ``cuda.telemetry: mode`` on a node whose
    NVML GPUs are ``gpus`` (their ``gpm`` readers opened unless mode is dcgm). ``dcgm`` that
    does not answer raises, before any cap is set."""
    if mode not in TELEMETRY_MODES:
        raise ValueError(f"cuda.telemetry {mode!r}: expected one of {', '.join(TELEMETRY_MODES)}")
    settings = settings or DcgmSettings()
    if mode == "nvml":
        return {"source": "nvml", "reason": "cuda.telemetry: nvml"}
    if mode == "dcgm":
        why_not = answers(settings)
        if why_not:
            raise RuntimeError(
                f"cuda.telemetry: dcgm, but DCGM does not answer: {why_not}; "
                f"start it, or set cuda.telemetry: nvml or auto"
            )
        return {"source": "dcgm", "reason": "cuda.telemetry: dcgm", "dcgm": settings.describe()}
    gpm = sorted({g.gpm.status if g.gpm is not None else "off" for g in gpus})
    if gpm == ["enabled"]:
        return {"source": "nvml", "reason": "auto: GPM readable on every GPU"}
    why_not = answers(settings)
    if why_not:
        return {
            "source": "nvml",
            "reason": f"auto: GPM {'; '.join(gpm)}, and DCGM does not answer ({why_not}): "
            f"profiling fields NaN",
        }
    return {
        "source": "dcgm",
        "reason": f"auto: GPM {'; '.join(gpm)}; DCGM answers",
        "dcgm": settings.describe(),
    }


def _die_with_parent() -> None:
    """In the dmon child: SIGTERM when the process that started it dies, also by SIGKILL, so a
    killed run never leaves ``dcgmi dmon`` running (Linux ``prctl(PR_SET_PDEATHSIG)``)."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # 1 = PR_SET_PDEATHSIG


class _Reader:
    """What both readers are given: the settings, this node's GPUs and name, the sample period
    and the sampler's clock (times are seconds since ``t0`` on it)."""

    def __init__(
        self,
        settings: DcgmSettings,
        gpu_ids: Sequence[int],
        period_s: float,
        t0: float,
        node: str,
        clock: Callable[[], float] = time.time,
    ):
        self.settings, self.gpu_ids, self.period_s, self.t0, self.node, self.clock = (
            settings,
            [int(g) for g in gpu_ids],
            period_s,
            t0,
            node,
            clock,
        )


class DmonReader(_Reader):
    """``dcgmi dmon`` for the run's length; ``records()`` parses what it printed so far."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.lines: list[str] = []
        self.proc: subprocess.Popen | None = None
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        # parsed so far: records() parses only the lines that came since (a sweep asks every period)
        self._records: list[dict[str, Any]] = []
        self._parsed, self._header, self.errors = 0, "", []
        self._sample_gpus: set[str] = set()
        self._sample_start = 0  # index in lines of the sample being printed
        self._stopped = self._stopping = False

    @property
    def command(self) -> list[str]:
        """The ``dcgmi dmon`` command line: the fields, the GPUs, the period in ms (at least 1)."""
        return [
            self.settings.dcgmi,
            "dmon",
            "-e",
            ",".join(map(str, self.settings.fields)),
            "-i",
            ",".join(map(str, self.gpu_ids)),
            "-d",
            str(max(1, round(self.period_s * 1000))),
        ]

    def start(self) -> None:
        """Start ``dcgmi dmon`` (dying with this process) and the thread reading its lines.

        Raises OSError when ``dcgmi`` cannot be started.
        """
        self._stderr = tempfile.TemporaryFile("w+")  # a file: a chatty stderr never blocks dmon
        self.proc = subprocess.Popen(
            self.command,
            stdout=subprocess.PIPE,
            stderr=self._stderr,
            text=True,
            bufsize=1,
            preexec_fn=_die_with_parent,
        )
        self._thread = threading.Thread(target=self._read, name="wattflex-dcgmi-dmon", daemon=True)
        self._thread.start()

    def _read(self) -> None:
        assert self.proc is not None and self.proc.stdout is not None
        for line in self.proc.stdout:
            self.add_line(line)
        rc = self.proc.wait()
        if not self._stopping and rc != 0:  # died under the run: its fields are NaN from here
            log.warning(
                "dcgmi dmon exited %s mid-run (%s); DCGM fields NaN from %.0f s on",
                rc,
                self.describe()["stderr"],
                self.clock() - self.t0,
            )

    def add_line(self, line: str, t_s: float | None = None) -> None:
        """One line of dmon's output. dmon prints no times: a GPU line is stamped with ``t_s``
        (default: the sampler's clock now); a GPU id seen since the last sample start begins
        the next sample (the parser's rule), whose first line records() may cut before."""
        tokens = line.split()
        if tokens[:1] != ["GPU"] or len(tokens) < 2:
            with self._lock:
                self.lines.append(line.rstrip())
            return
        t_s = self.clock() - self.t0 if t_s is None else t_s
        with self._lock:
            if tokens[1] in self._sample_gpus:
                self._sample_gpus = set()
                self._sample_start = len(self.lines)
            self._sample_gpus.add(tokens[1])
            self.lines.append(f"{t_s:.3f} {line.strip()}")

    def stop(self) -> None:
        """Stop ``dcgmi dmon`` (SIGTERM, SIGKILL after the timeout) and wait for the reader thread."""
        self._stopping = True
        if self.proc is None:
            self._stopped = True
            return
        if self.proc.poll() is None:
            self.proc.terminate()
        try:
            self.proc.wait(STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        if self._thread is not None:
            self._thread.join(STOP_TIMEOUT_S)
        self._stopped = True

    def records(self) -> list[dict[str, Any]]:
        """Every complete sample so far (after ``stop``: every sample). The lines since the
        last call, up to the start of the sample still being printed, are parsed on their own
        under the last ``#Entity`` header seen (a chunk always begins a sample, so the
        parser's grouping is the same as over the whole output); a chunk that does not parse
        is logged once and left out, the rest kept."""
        with self._lock:
            cut = len(self.lines) if self._stopped else max(self._parsed, self._sample_start)
            new = self.lines[self._parsed : cut]
            self._parsed = cut
        header = self._header
        for line in new:
            if line.lstrip().startswith("#Entity"):
                self._header = line
        try:
            self._records += self._parse(header, new)
        except DcgmFormatError:  # keep every sample but the bad one(s)
            for sample_header, sample in _samples(header, new):
                try:
                    self._records += self._parse(sample_header, sample)
                except DcgmFormatError as exc:
                    if not self.errors:
                        log.warning("dcgmi dmon output unreadable (%s); that sample left out", exc)
                    self.errors.append(str(exc))
        return list(self._records)

    def _parse(self, header: str, lines: list[str]) -> list[dict[str, Any]]:
        return parse_dcgmi_dmon(
            "\n".join([header, *lines]), "dcgmi dmon output", node=self.node, gpu_ids=self.gpu_ids
        )

    def describe(self) -> dict[str, Any]:
        """The reader for run.json: the command, lines read, its exit status, the last line of its
        stderr when it failed, and the first five unreadable lines.
        """
        status = None if self.proc is None else self.proc.poll()
        err = ""
        if status not in (None, 0, -15):  # -15: our SIGTERM at the run's end
            self._stderr.seek(0)
            err = self._stderr.read().strip()
        return {
            "command": self.command,
            "lines": len(self.lines),
            "exit_status": status,
            "stderr": err.splitlines()[-1] if err else None,
            "unreadable": self.errors[:5],
        }


def _samples(header: str, lines: list[str]) -> list[tuple[str, list[str]]]:
    """dmon lines (stamped, from ``DmonReader.add_line``) cut into samples, each with the
    ``#Entity`` header in force at its start: a GPU id seen since the last start begins one."""
    out: list[tuple[str, list[str]]] = []
    seen: set[str] = set()
    for line in lines:
        tokens = line.split()
        if line.lstrip().startswith("#Entity"):
            header = line
        elif "GPU" in tokens[:2]:
            gpu = tokens[tokens.index("GPU") + 1] if len(tokens) > tokens.index("GPU") + 1 else ""
            if gpu in seen or not out:
                out.append((header, []))
                seen = set()
            seen.add(gpu)
            out[-1][1].append(line)
    return out


class ExporterReader(_Reader):
    """dcgm-exporter's ``/metrics`` fetched every ``period_s`` from a thread; each scrape is
    stamped with the time it was fetched (on the sampler's clock) and this node's name."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.rows: list[dict[str, Any]] = []
        self.scrapes, self.failures, self.last_error = 0, 0, None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def scrape_once(self) -> None:
        """Scrape the exporter once and keep its records at the time since ``t0``; a failure is counted
        and logged once, never raised.
        """
        t_s = self.clock() - self.t0
        try:
            records = parse_dcgm_exporter(
                fetch(self.settings.url, max(1.0, self.period_s)),
                self.settings.url,
                time=t_s,
                gpu_ids=self.gpu_ids,
            )
        except (OSError, urllib.error.URLError, DcgmFormatError) as exc:
            self.failures += 1
            if self.last_error is None:
                log.warning(
                    "dcgm-exporter %s failed (%s); DCGM fields NaN while it fails",
                    self.settings.url,
                    exc,
                )
            self.last_error = str(exc)
            return
        self.scrapes += 1
        self.rows += [{**r, "t_s": t_s, "node": self.node} for r in records]

    def _run(self) -> None:
        next_t = self.clock()
        while not self._stop.is_set():
            self.scrape_once()
            next_t = max(next_t + self.period_s, self.clock())
            self._stop.wait(max(0.0, next_t - self.clock()))

    def start(self) -> None:
        """Start scraping every period in a daemon thread."""
        self._thread = threading.Thread(
            target=self._run, name="wattflex-dcgm-exporter", daemon=True
        )
        self._thread.start()

    def stop(self) -> None:
        """Stop scraping, waiting for the thread at most max(the stop timeout, two periods)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(max(STOP_TIMEOUT_S, 2 * self.period_s))

    def records(self) -> list[dict[str, Any]]:
        """The records scraped so far, one per GPU and scrape."""
        return list(self.rows)

    def describe(self) -> dict[str, Any]:
        """The reader for run.json: URL, scrapes, failures and the last error."""
        return {
            "url": self.settings.url,
            "scrapes": self.scrapes,
            "failures": self.failures,
            "last_error": self.last_error,
        }


def merge_dcgm(
    nvml_rows: pd.DataFrame,
    dcgm_records: list[dict[str, Any]],
    columns: Sequence[str],
    staleness_s: float,
) -> pd.DataFrame:
    """``nvml_rows`` with ``columns`` replaced by each GPU's latest DCGM reading at or before
    the row (NaN where none is younger than ``staleness_s``). Only the key columns and the
    DCGM ones are merged: a one-run sweep calls this every sampler period."""
    out, cols = nvml_rows.copy(), list(columns)
    merged = {c: np.full(len(out), np.nan) for c in cols}
    if len(out) and dcgm_records:
        dcgm = pd.DataFrame(
            {
                "t_s": np.array([r["t_s"] for r in dcgm_records], dtype=float),
                "gpu": np.array([r["gpu"] for r in dcgm_records], dtype=np.int64),
                **{
                    c: np.array([r.get(c, np.nan) for r in dcgm_records], dtype=float) for c in cols
                },
            }
        )
        left = pd.DataFrame(
            {
                "t_s": out["t_s"].to_numpy(dtype=float),
                "gpu": out["gpu"].to_numpy(dtype=np.int64),
                "_row": np.arange(len(out)),
            }
        )
        m = pd.merge_asof(
            left.sort_values("t_s", kind="stable"),
            dcgm.sort_values("t_s", kind="stable"),
            on="t_s",
            by="gpu",
            direction="backward",
            tolerance=staleness_s,
        )
        rows = m["_row"].to_numpy()
        for c in cols:
            merged[c][rows] = m[c].to_numpy(dtype=float)
    for c in cols:
        out[c] = merged[c]
    return out


@dataclass
class DcgmSampler:
    """The NVML ``TelemetrySampler`` (GPM off) with the profiling columns from DCGM; the same
    start / stop / frame as the sampler it wraps."""

    nvml: Any  # devices.base.TelemetrySampler
    reader: Any  # DmonReader | ExporterReader
    columns: list[str]
    staleness_s: float
    errors: list[str] = field(default_factory=list)

    @classmethod
    def open(
        cls, nvml_sampler: Any, settings: DcgmSettings | None, gpu_ids: Sequence[int], node: str
    ) -> DcgmSampler:
        """The NVML sampler joined with a DCGM reader (dmon or exporter, as ``settings`` say) on
        ``gpu_ids`` of ``node``, sampling at the NVML sampler's period; a DCGM reading older than two
        periods and a second is not used.
        """
        settings = settings or DcgmSettings()
        reader_cls = DmonReader if settings.mode == "dmon" else ExporterReader
        period = nvml_sampler.period_s
        reader = reader_cls(
            settings, gpu_ids, period, nvml_sampler.t0, node, clock=nvml_sampler.clock
        )
        # two periods and a second of slack: dmon prints on its own phase, a scrape takes time
        return cls(nvml_sampler, reader, settings.columns, staleness_s=2 * period + 1.0)

    @property
    def period_s(self) -> float:
        """The sampling period in s (the NVML sampler's)."""
        return self.nvml.period_s

    def start(self) -> DcgmSampler:
        """Start the DCGM reader, then the NVML sampler. Returns itself."""
        self.reader.start()
        self.nvml.start()
        return self

    def stop(self) -> None:
        """Stop the NVML sampler, then the DCGM reader."""
        self.nvml.stop()
        self.reader.stop()

    def frame(self) -> pd.DataFrame:
        """The NVML telemetry with the DCGM columns merged in by GPU and time; unreadable DCGM output
        leaves those columns NaN (logged once), never losing the NVML trace.
        """
        try:
            records = self.reader.records()
        except DcgmFormatError as exc:  # never lose the NVML trace over a bad DCGM line
            if str(exc) not in self.errors:
                self.errors.append(str(exc))
                log.warning("DCGM output unreadable (%s); DCGM fields NaN", exc)
            records = []
        return merge_dcgm(self.nvml.frame(), records, self.columns, self.staleness_s)

    def describe(self) -> dict[str, Any]:
        """The DCGM reading for run.json: the reader's record, the columns, the staleness bound (s)
        and the errors met.
        """
        return {
            **self.reader.describe(),
            "columns": self.columns,
            "staleness_s": self.staleness_s,
            "errors": self.errors,
        }

    def __enter__(self) -> DcgmSampler:
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()
