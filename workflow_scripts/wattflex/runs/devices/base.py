"""What a GPU backend offers, and the telemetry sampler thread that works on any of them.

``PowerCapDevice`` is one GPU's power-limit interface; ``runs.emulator.device.EmulatedDevice``
and ``devices.nvml.NvmlGpu`` both satisfy it, so cap logic (``wattflex.runs.devices.caps``) is the same
code for both. ``TelemetrySource`` is one GPU that can be sampled (``NvmlGpu``; the emulated
backend synthesises whole traces instead). ``TelemetrySampler`` polls sources from a
background thread on the clock the training process logs steps with.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any, Protocol, runtime_checkable

import pandas as pd

from wattflex.metrics import telemetry_columns

log = logging.getLogger("wattflex.runs.devices")

# Extra per-sample columns the NVML backend adds after TELEMETRY_COLUMNS:
# clock_event_reasons (NVML throttle bitmask), host_cpu_w / host_dram_w (RAPL, node level:
# on the row of the node's first GPU, NaN on the others, so a sum over rows is the node total).
EXTRA_COLUMNS = ["clock_event_reasons", "host_cpu_w", "host_dram_w"]


class CapError(RuntimeError):
    """A power cap could not be set, verified or restored."""


class CapConstraintError(CapError, ValueError):
    """The requested cap is outside what the GPU accepts."""


class CapPermissionError(CapError, PermissionError):
    """Not allowed to change power limits (needs root, or an admin-approved command)."""


LIMIT_TOLERANCE_W = 1.0  # NVML limits are in mW; differences below 1 W are rounding


def check_cap(device: PowerCapDevice, cap_w: float) -> None:
    """Refuse a cap outside what ``device`` accepts, with a message that says the range."""
    lo, hi = device.constraints()
    if not lo - LIMIT_TOLERANCE_W <= cap_w <= hi + LIMIT_TOLERANCE_W:
        raise CapConstraintError(
            f"{device.name}: cap {cap_w:g} W is outside the limits this GPU accepts "
            f"({lo:g}-{hi:g} W); pick caps inside that range"
        )


@runtime_checkable
class PowerCapDevice(Protocol):
    """One GPU's power limit: read constraints, set a cap (returns the enforced limit read
    back), read the enforced limit, put the original limit back."""

    @property
    def name(self) -> str:
        """The GPU's name as messages give it (``GPU 0 (NVIDIA H200)``)."""

    def constraints(self) -> tuple[float, float]:
        """The (lowest, highest) power limit in W the GPU accepts."""

    def set_cap(self, cap_w: float) -> float:
        """Set the power limit to ``cap_w`` W. Returns the enforced limit read back, in W.

        Raises CapConstraintError outside the GPU's range, CapPermissionError without the right,
        CapError when the limit read back is not the one set.
        """

    def enforced_limit_w(self) -> float:
        """The power limit in W the GPU enforces now."""

    def restore(self) -> None:
        """Put back the limit the GPU had before the first ``set_cap`` (no-op if none was set).

        Raises CapError when it cannot be put back.
        """


@runtime_checkable
class TelemetrySource(Protocol):
    """One GPU that yields one telemetry row (TELEMETRY_COLUMNS keys, NaN if unknown)."""

    def sample(self, t_s: float) -> dict[str, Any]:
        """One telemetry row at ``t_s`` s since the run's start: the TELEMETRY_COLUMNS keys (W, MHz,
        fractions 0-1...; NaN for what this source cannot read).
        """


def empty_row(t_s: float, node: str | int, gpu: int) -> dict[str, Any]:
    """A telemetry row at ``t_s`` s for ``gpu`` of ``node`` with every reading NaN (a source that
    failed to sample).
    """
    row: dict[str, Any] = {c: math.nan for c in telemetry_columns() + EXTRA_COLUMNS}
    row.update(t_s=t_s, node=node, gpu=gpu)
    return row


def telemetry_frame(rows: Sequence[dict[str, Any]]) -> pd.DataFrame:
    """Rows -> the telemetry table: TELEMETRY_COLUMNS first, then EXTRA_COLUMNS."""
    cols = telemetry_columns() + EXTRA_COLUMNS
    df = pd.DataFrame(list(rows), columns=cols)
    for c in cols:
        if c not in ("node", "gpu"):
            df[c] = pd.to_numeric(df[c], errors="coerce").astype(float)
    df["gpu"] = df["gpu"].astype(int)
    df["node"] = df["node"].astype(str)
    return df


class TelemetrySampler:
    """Poll ``sources`` every ``period_s`` from a daemon thread; ``t_s = time.time() - t0``.

    ``host`` (optional) is called once per sample and returns node-level columns (RAPL).
    A failing source never stops the thread: its error is logged once and the row is NaN.
    """

    def __init__(
        self,
        sources: Sequence[TelemetrySource],
        period_s: float,
        t0: float,
        host: Callable[[], dict[str, float]] | None = None,
        clock: Callable[[], float] = time.time,
    ):
        if period_s <= 0:
            raise ValueError(f"sampler period {period_s} s: must be > 0")
        self.sources, self.period_s, self.t0, self.host, self.clock = (
            list(sources),
            period_s,
            t0,
            host,
            clock,
        )
        self.rows: list[dict[str, Any]] = []
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._errors: set[str] = set()

    def sample_once(self) -> None:
        """Take one sample of every source (and the host's columns, on the first GPU's row) now; a
        failing source gives a NaN row and its error is logged once.
        """
        t_s = self.clock() - self.t0
        host = self._safe("host", self.host) if self.host else {}
        for i, src in enumerate(self.sources):
            row = self._safe(f"gpu{i}", src.sample, t_s)
            if row is None:
                row = empty_row(t_s, getattr(src, "node", ""), getattr(src, "index", i))
            if i == 0 and host:
                row.update(host)
            self.rows.append(row)

    def _safe(self, what: str, fn: Callable, *args: Any) -> Any:
        try:
            return fn(*args)
        except Exception as exc:  # a sensor read must never kill a measurement
            if what not in self._errors:
                self._errors.add(what)
                log.warning(
                    "telemetry %s failed (%s: %s); NaN for it from now on when it fails",
                    what,
                    type(exc).__name__,
                    exc,
                )
            return None

    def _run(self) -> None:
        next_t = self.clock()
        while not self._stop.is_set():
            self.sample_once()
            next_t = max(next_t + self.period_s, self.clock())  # a slow read skips ahead, no burst
            self._stop.wait(max(0.0, next_t - self.clock()))

    def start(self) -> TelemetrySampler:
        """Start sampling in a daemon thread. Returns itself."""
        self._thread = threading.Thread(target=self._run, name="wattflex-sampler", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop sampling, waiting for the thread at most max(5 s, two periods)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=max(5.0, 2 * self.period_s))

    def frame(self) -> pd.DataFrame:
        """The rows sampled so far as the telemetry table (see :func:`telemetry_frame`)."""
        return telemetry_frame(self.rows)

    def __enter__(self) -> TelemetrySampler:
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()
