"""A GPU is never left clock-locked: the SM clock lock guard and restore-after-kill (``knob: clock``).

``ClockGuard`` locks the SM clock of every local GPU of a job through NVML
(``nvmlDeviceSetGpuLockedClocks(f, f)``) and releases it (``nvmlDeviceResetGpuLockedClocks``)
on normal exit, an exception, the termination signals and ``atexit``, exactly as
:class:`wattflex.runs.devices.caps.CapGuard` puts power limits back (it is one: the signal
handling and the trusted state files, :mod:`wattflex.runs.devices.cap_state`, are shared).
Before it locks anything it writes ``<state_dir>/clocks-<host>-<pid>.json``; SIGKILL cannot be
caught, so ``wattflex restore-caps`` (the SLURM epilog) resets the locks recorded in files whose
process is gone. A reset takes no value from the record (NVML has no "previous lock" to put
back: the driver's default is no lock), so nothing a record says can set a clock.

Modes: ``nvml`` (root: NVML locks directly) and ``observe`` (change nothing, record the clock).
Without root, SLURM's ``--gpu-freq`` is the other way to lock a job's clocks (slurmd resets them
at the job's end).
"""

from __future__ import annotations

import logging
from collections.abc import Collection, Sequence
from pathlib import Path
from typing import Any

from wattflex.runs.devices.base import CapConstraintError, CapError
from wattflex.runs.devices.caps import CapGuard, restore_each, restore_records
from wattflex.runs.devices.nvml import NvmlGpu

log = logging.getLogger("wattflex.runs.devices.clocks")
CLOCK_MODES = ("nvml", "observe")

__all__ = [
    "ClockGuard",
    "ClockHold",
    "CLOCK_MODES",
    "check_clock",
    "restore_clocks_from_state_dir",
]


def check_clock(gpu: Any, clock_mhz: float) -> None:
    """Refuse a lock outside the GPU's SM clock range (``NvmlGpu.sm_clock_range``)."""
    lo, hi = gpu.sm_clock_range()
    if not lo <= clock_mhz <= hi:
        raise CapConstraintError(
            f"{getattr(gpu, 'name', gpu)}: SM clock {clock_mhz:g} MHz is outside "
            f"its range {lo:g}-{hi:g} MHz"
        )


class ClockGuard(CapGuard):
    """Context manager: lock every GPU in ``gpus`` at ``clock_mhz`` for the duration of a run.

    Refuses a clock outside any GPU's range before changing anything. ``record()`` returns
    what run.json stores: mode, requested clock, the SM clocks read after locking."""

    STATE_PREFIX = "clocks"
    WHAT = "SM clock locks"

    def __init__(
        self,
        gpus: Sequence[Any],
        clock_mhz: float,
        mode: str = "nvml",
        state_dir: str | Path | None = None,
        handle_signals: bool = True,
    ):
        if mode not in CLOCK_MODES:
            raise ValueError(f"clock_control {mode!r}: expected one of {', '.join(CLOCK_MODES)}")
        super().__init__(gpus, clock_mhz, "observe", state_dir, handle_signals=handle_signals)
        self.mode, self.clock_mhz = mode, float(clock_mhz)
        self.clocks_read: list[float] = []

    def __enter__(self) -> ClockGuard:
        if self.mode == "observe":
            self.clocks_read = [g.sm_clock_mhz() for g in self.gpus]
            return self
        for g in self.gpus:  # refuse before touching anything
            check_clock(g, self.clock_mhz)
        self._write_state({"clock_mhz": self.clock_mhz}, [{} for _ in self.gpus])
        try:
            for g in self.gpus:
                g.lock_clock(self.clock_mhz)
            self.clocks_read = [g.sm_clock_mhz() for g in self.gpus]
        except BaseException:
            self.restore()
            raise
        log.info(
            "SM clock locked at %g MHz on %d GPU(s); reading %s MHz",
            self.clock_mhz,
            len(self.gpus),
            ", ".join(f"{c:g}" for c in self.clocks_read),
        )
        return self

    def _undo(self) -> list[str]:
        return restore_each(self.gpus, "reset_clock")

    def _log_restored(self) -> None:
        log.info("SM clock locks reset on %d GPU(s)", len(self.gpus))

    def record(self) -> dict[str, Any]:
        """The ``clocks`` record of run.json: the clock control mode, the SM clock asked for (MHz), the
        clocks read back, the state file (None when only observing) and the signals received.
        """
        return {
            "clock_control": self.mode,
            "clock_mhz_requested": self.clock_mhz,
            "sm_clock_mhz": self.clocks_read,
            "state_file": str(self.state_path) if self.mode != "observe" else None,
            "signals": self.events,
        }


class ClockHold:
    """A clock lock that follows a changing target (a ``wattflex control`` agent's budget file
    naming the knob menu's clock during an event): :meth:`follow` locks ``gpus`` at each new
    clock through a :class:`ClockGuard` (state file, signals, ``atexit``) and resets the lock
    when the target is None; :meth:`close` resets it, however the agent ends."""

    def __init__(
        self, gpus: Sequence[Any], mode: str = "nvml", state_dir: str | Path | None = None
    ):
        self.gpus, self.mode, self.state_dir = list(gpus), mode, state_dir
        self.guard: ClockGuard | None = None
        self.mhz: float | None = None

    def follow(self, clock_mhz: float | None) -> None:
        """Hold ``clock_mhz`` (None: no lock); a clock the GPUs refuse raises, nothing left locked."""
        if clock_mhz == self.mhz:
            return
        self.close()
        if clock_mhz is not None:
            guard = ClockGuard(self.gpus, clock_mhz, self.mode, self.state_dir)
            guard.__enter__()
            self.guard, self.mhz = guard, float(clock_mhz)

    def close(self) -> None:
        """Release the lock held now, if any (the GPUs' clocks reset, the state file removed)."""
        guard, self.guard, self.mhz = self.guard, None, None
        if guard is not None:
            guard.restore()


def _clock_doc_problem(doc: Any) -> str | None:
    if not isinstance(doc, dict):
        return f"a JSON object expected, found {type(doc).__name__}"
    if not isinstance(doc.get("pid", -1), int) or isinstance(doc.get("pid"), bool):
        return f"pid {doc['pid']!r} is not an integer"
    gpus = doc.get("gpus", [])
    if not isinstance(gpus, list) or not all(
        isinstance(g, dict) and isinstance(g.get("index"), int) and not isinstance(g["index"], bool)
        for g in gpus
    ):
        return "gpus is not a list of entries with an integer index"
    return None


def restore_clocks_from_state_dir(
    state_dir: str | Path | None = None,
    force: bool = False,
    dry_run: bool = False,
    only_gpus: Sequence[int] | None = None,
    job_uid: int | None = None,
    job_gpus: Collection[int] | None = None,
) -> list[dict[str, Any]]:
    """Reset the clock locks recorded in this host's ``clocks-*`` files whose process is gone
    (all of them with ``force``); one record per file: path, gpus, action, error (as
    :func:`wattflex.runs.devices.caps.restore_from_state_dir`, a record of ``job_uid`` reaching
    only ``job_gpus``). Needs NVML (root)."""
    return restore_records(
        state_dir,
        "clocks",
        _clock_doc_problem,
        lambda path, doc, owner: _reset_record(path, doc),
        force=force,
        dry_run=dry_run,
        only_gpus=only_gpus,
        job_uid=job_uid,
        job_gpus=job_gpus,
        what="clock",
    )


def _reset_record(path: Path, doc: dict[str, Any]) -> dict[str, Any]:
    """Reset one record's GPUs (the caller removes the record when every one is reset)."""
    try:
        for g in doc["gpus"]:
            gpu = NvmlGpu(g["index"], gpm=False)
            if g.get("uuid") and gpu.uuid != g["uuid"]:
                raise CapError(
                    f"GPU index {g['index']} is now {gpu.uuid}, state file says {g['uuid']}"
                )
            gpu.reset_clock()
        log.warning(
            "reset SM clock locks left by process %s on GPU(s) %s",
            doc.get("pid"),
            ", ".join(str(g["index"]) for g in doc["gpus"]),
        )
        return {"action": "restored"}
    except (CapError, RuntimeError, ValueError) as exc:
        return {"action": "failed", "error": str(exc)}
