"""A GPU is never left capped: cap state files, the restore guard, and restore-after-kill.

``CapGuard`` sets one power cap on every local GPU of a job and puts the original limits
back on normal exit, on an exception, on SIGINT/SIGTERM/SIGHUP/SIGQUIT/SIGUSR1/SIGUSR2
(SLURM's time limit sends SIGTERM; ``--signal`` and ``scancel -s`` may send the others, whose
default action also ends the process) and from ``atexit``. Before it changes anything it writes the original limits to
a state file (``<state_dir>/caps-<host>-<pid>.json``); SIGKILL cannot be caught, so the
next run on the node, or ``wattflex restore-caps`` in a SLURM epilog, restores from the
files whose process is gone.

Cap control modes:
* ``nvml``: NVML sets the limit directly (needs root);
* ``command``: an admin-approved command template, e.g. ``sudo /usr/local/bin/setcap {gpu}
  {watts}`` (``{gpu}`` = NVML index, ``{watts}`` = integer watts), run without a shell;
* ``observe``: change nothing, record the limits the GPUs have (shared machines).
"""

from __future__ import annotations

import atexit
import logging
import math
import os
import shlex
import signal
import socket
import string
import subprocess
import time
from collections.abc import Callable, Collection, Sequence
from pathlib import Path
from typing import Any

from wattflex.runs.devices import cap_state
from wattflex.runs.devices.base import (
    CapConstraintError,
    CapError,
    CapPermissionError,
    PowerCapDevice,
    check_cap,
)
from wattflex.runs.devices.cap_state import (
    STATE_DIR_ENV,
    UnsafeStateDir,
    default_state_dir,
    trusted_uids,
)
from wattflex.runs.devices.nvml import NvmlGpu, slurm_job_gpu_uuids

log = logging.getLogger("wattflex.runs.devices.caps")
MODES = ("nvml", "command", "observe")
# the termination signals a user, a shell or SLURM sends (all end the process by default): each restores the caps first
SIGNALS = tuple(
    s
    for s in ("SIGINT", "SIGTERM", "SIGHUP", "SIGQUIT", "SIGUSR1", "SIGUSR2")
    if hasattr(signal, s)
)

__all__ = [
    "CapGuard",
    "CapSignal",
    "CapError",
    "CapConstraintError",
    "CapPermissionError",
    "UnsafeStateDir",
    "STATE_DIR_ENV",
    "command_setter",
    "default_state_dir",
    "restore_from_state_dir",
    "MODES",
]


class CapSignal(SystemExit):
    """Raised in the main thread when a termination signal arrives while caps are set:
    unwinds through every ``finally``/``__exit__`` (restoring caps) and exits 128+signum."""

    def __init__(self, signum: int):
        super().__init__(128 + signum)
        self.signum = signum


CAP_COMMAND_FIELDS = ("gpu", "watts")


def cap_command_problem(template: str) -> str | None:
    """What is wrong with a cap command template, or None: it must split into words (no
    shell) and, as ``str.format`` reads it, name exactly the fields ``{gpu}`` and ``{watts}``
    (``{node}``, a lone ``{`` or ``{watts:x}`` would fail only when the first cap is set).
    The one rule of ``--cap-command`` and ``cuda.cap_command``."""
    example = "e.g. 'sudo /usr/local/bin/setcap {gpu} {watts}' ({{ and }} for a literal brace)"
    try:
        parts = shlex.split(template)
    except ValueError as exc:
        return f"cannot be split into words: {exc}"
    fields: set[str] = set()
    for part in parts:
        try:
            fields |= {name for _, name, _, _ in string.Formatter().parse(part) if name is not None}
            part.format(gpu=0, watts=300)
        except ValueError as exc:  # a lone { or }, a bad format spec
            return f"is not a valid template ({exc}); {example}"
        except (KeyError, IndexError, AttributeError):
            pass  # an unknown field: named below
    unknown = sorted(fields - set(CAP_COMMAND_FIELDS))
    if unknown:
        return (
            f"has placeholder(s) {', '.join('{' + f + '}' for f in unknown)}; only {{gpu}} and {{watts}} "
            f"are filled in, {example}"
        )
    if not set(CAP_COMMAND_FIELDS) <= fields:
        return f"must contain {{gpu}} and {{watts}}, {example}"
    return None


def command_setter(template: str, timeout_s: float = 60.0) -> Callable[[int, float], None]:
    """``(gpu_index, watts) -> None`` that runs ``template`` (no shell) and checks its status."""
    problem = cap_command_problem(template)
    if problem:
        raise ValueError(f"cap_command {template!r}: {problem}")
    parts = shlex.split(template)

    def set_limit(gpu: int, watts: float) -> None:
        argv = [p.format(gpu=gpu, watts=int(round(watts))) for p in parts]
        try:
            r = subprocess.run(argv, capture_output=True, text=True, timeout=timeout_s)
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise CapError(f"cap command {shlex.join(argv)} could not run: {exc}") from exc
        if r.returncode != 0:
            msg = (r.stderr or r.stdout).strip().splitlines()[-1:] or [""]
            raise CapPermissionError(
                f"cap command {shlex.join(argv)} failed (exit {r.returncode}): {msg[0]}"
            )

    return set_limit


def limit_setter(mode: str, command: str | None) -> Callable[[int, float], None] | None:
    """The setter ``devices.nvml.NvmlGpu`` should use for ``mode`` (None = NVML directly)."""
    if mode not in MODES:
        raise ValueError(f"cap_control {mode!r}: expected one of {', '.join(MODES)}")
    if mode == "command":
        if not command:
            raise ValueError(
                "cap_control: command needs cap_command (e.g. 'sudo /usr/local/bin/setcap {gpu} {watts}')"
            )
        return command_setter(command)
    return None


# ---- state files (wattflex.runs.devices.cap_state: what root may trust) ------------------
def _proc_start(pid: int) -> str | None:
    """Process start time (clock ticks since boot) to tell a live pid from a reused one."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return None


def _alive(pid: int, start: str | None) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return start is None or _proc_start(pid) in (None, start)


def _state_doc_problem(doc: Any) -> str | None:
    """What is wrong with a parsed state file (None when it has what a restore needs)."""
    if not isinstance(doc, dict):
        return f"a JSON object expected, found {type(doc).__name__}"
    if not isinstance(doc.get("pid", -1), int) or isinstance(doc.get("pid"), bool):
        return f"pid {doc['pid']!r} is not an integer"
    if doc.get("mode", "nvml") not in ("nvml", "command"):
        return f"mode {doc.get('mode')!r} is not nvml or command"
    if not isinstance(doc.get("gpus", []), list):
        return "gpus is not a list"
    for g in doc.get("gpus", []):
        if not (
            isinstance(g, dict)
            and isinstance(g.get("index"), int)
            and not isinstance(g.get("index"), bool)
            and isinstance(g.get("original_limit_w"), (int, float))
            and not isinstance(g["original_limit_w"], bool)
            and math.isfinite(g["original_limit_w"])
        ):
            return f"gpus entry {g!r:.60} lacks an integer index and a finite original_limit_w"
    return None


def restore_target_w(gpu: Any, recorded_w: float, owner: int | None) -> tuple[float, str]:
    """The limit to put back and why: the recorded original, clamped to the card's range; for a
    file another user owns (root restoring a user's run), the card's default limit, since that
    user could have written any number there."""
    lo, hi = gpu.constraints()
    if owner not in (0, os.geteuid()):
        default = float(gpu.default_limit_w())
        return (
            default,
            f"default {default:g} W (record owned by uid {owner}, not trusted for a value)",
        )
    target = min(max(float(recorded_w), lo), hi)
    return target, (
        "recorded"
        if target == recorded_w
        else f"recorded {recorded_w:g} W clamped to {lo:g}-{hi:g} W"
    )


def restore_setter(mode: str, cap_command: str | None) -> Callable[[int, float], None] | None:
    """How to restore a record of ``mode``: with the caller's installed cap command (never one read
    from the record), else NVML, which needs root."""
    if cap_command:
        return command_setter(cap_command)
    if mode == "command" and os.geteuid() != 0:
        raise CapError(
            "the record was made with cap_control: command; restoring it without root needs "
            "the installation's cap command (restore-caps --cap-command, or cuda.cap_command)"
        )
    return None


def restore_from_state_dir(
    state_dir: str | Path | None = None,
    force: bool = False,
    dry_run: bool = False,
    only_gpus: Sequence[int] | None = None,
    cap_command: str | None = None,
    job_uid: int | None = None,
    job_gpus: Collection[int] | None = None,
) -> list[dict[str, Any]]:
    """Restore the limits recorded in this host's state files whose process is gone (all of
    them with ``force``). Returns one record per file: path, gpus, action, error.

    Only records root, this user or ``job_uid`` own are read (``cap_state``); the others are
    reported as ``untrusted`` and left alone. A record of ``job_uid`` restores only the GPUs
    of ``job_gpus`` (the job's, as SLURM gives them), whatever it names. ``cap_command``: the
    installed cap command, used instead of NVML; the record's own mode only says whether root
    is needed."""
    return restore_records(
        state_dir,
        "caps",
        _state_doc_problem,
        lambda path, doc, owner: _restore_record(path, doc, owner, cap_command),
        force=force,
        dry_run=dry_run,
        only_gpus=only_gpus,
        job_uid=job_uid,
        job_gpus=job_gpus,
        what="cap",
    )


def restore_records(
    state_dir: str | Path | None,
    prefix: str,
    doc_problem: Callable[[Any], str | None],
    act: Callable[[Path, dict[str, Any], int | None], dict[str, Any]],
    force: bool = False,
    dry_run: bool = False,
    only_gpus: Sequence[int] | None = None,
    job_uid: int | None = None,
    job_gpus: Collection[int] | None = None,
    what: str = "cap",
) -> list[dict[str, Any]]:
    """The loop of every restore (caps here, clock locks in ``devices.clocks``): each trusted
    ``<prefix>-<host>-*.json`` whose process is gone (every one with ``force``) is handed to
    ``act(path, doc, owner)``; untrusted, damaged and live ones are reported, not acted on.

    A record another user owns (the job user's, trusted through ``job_uid``) is acted on only for
    its GPUs in ``job_gpus`` (SLURM's indices, matched by UUID through slurmd's device files:
    ``nvml.slurm_job_gpu_uuids``); its other GPUs are left alone and reported as an error (the
    record kept), and with no ``job_gpus``, or where they cannot be mapped, nothing of it is.
    The folder stays open from the reading to the removal of each restored record
    (``cap_state.held_records``)."""
    out = []
    pattern = f"{prefix}-{socket.gethostname()}-*.json"
    job_uuids: list[frozenset[str] | str] = []  # SLURM's GPUs as UUIDs, or why not (once, lazily)
    with cap_state.held_records(
        state_dir or default_state_dir(), pattern, trusted_uids(job_uid)
    ) as (dfd, records):
        for rec_file in records:
            path, doc = rec_file["path"], rec_file["doc"]
            if rec_file["untrusted"]:  # no wattflex run of a trusted user wrote it: act on nothing
                out.append({"path": str(path), "action": "untrusted", "note": rec_file["problem"]})
                continue
            bad = rec_file["problem"] or doc_problem(doc)
            if bad:  # a hand-edited or damaged file of ours: say so, go on with the others (exit 1)
                out.append(
                    {
                        "path": str(path),
                        "action": "unreadable",
                        "error": f"not a {what} state file: {bad}",
                    }
                )
                continue
            gpus, owner = doc.get("gpus", []), rec_file["owner"]
            rec: dict[str, Any] = {"path": str(path), "pid": doc.get("pid"), "kind": what}
            if only_gpus is not None and not {g["index"] for g in gpus} & set(only_gpus):
                continue
            if not force and _alive(int(doc.get("pid", -1)), doc.get("pid_start")):
                out.append({**rec, "gpus": gpus, "action": "skipped: its process is still running"})
                continue
            if owner not in (0, os.geteuid()) and job_gpus is not None and not job_uuids:
                try:
                    job_uuids.append(slurm_job_gpu_uuids(job_gpus))
                except RuntimeError as exc:  # GpuIdentityError, or no NVML
                    job_uuids.append(str(exc))
            gpus, foreign = _job_gpus_of(gpus, owner, job_gpus, job_uuids[0] if job_uuids else None)
            if foreign:
                rec["error"] = foreign
                if not gpus:
                    out.append({**rec, "gpus": [], "action": "refused"})
                    continue
            rec["gpus"] = gpus
            if dry_run:
                out.append({**rec, "action": "would restore"})
                continue
            done = {**rec, **act(path, {**doc, "gpus": gpus}, owner)}
            if done["action"] == "restored" and not foreign:
                cap_state.remove_record(dfd, rec_file["name"])
            out.append(done)
    return out


def _job_gpus_of(
    gpus: list[dict[str, Any]],
    owner: int | None,
    job_gpus: Collection[int] | None,
    job_uuids: frozenset[str] | str | None = None,
) -> tuple[list[dict[str, Any]], str | None]:
    """The record's GPUs a restore may touch, and why the others are left alone (None: all may).
    Root's and this user's own records name their GPUs; another user's (the job's) reach only the
    job's GPUs as SLURM gives them, matched by UUID (``job_uuids``: SLURM's indices mapped through
    slurmd's device files, ``nvml.slurm_job_gpu_uuids``, or why they could not be), never by the
    index digits: SLURM's IDX is gres.conf order, not NVML's."""
    if owner in (0, os.geteuid()):
        return gpus, None
    if job_gpus is None:
        return [], (
            f"a record of uid {owner} restores only its SLURM job's GPUs, and none were given "
            "(--job-gpus, or $SLURM_JOB_GPUS in the epilog): left alone, record kept"
        )
    slurm = ", ".join(map(str, sorted(job_gpus))) or "none"
    if not isinstance(job_uuids, frozenset):
        return [], (
            f"the GPUs of SLURM's job (SLURM: {slurm}) cannot be told by UUID ({job_uuids}): "
            f"nothing of this record of uid {owner} restored, record kept"
        )
    mine = [g for g in gpus if g.get("uuid") in job_uuids]
    others = [g["index"] for g in gpus if g.get("uuid") not in job_uuids]
    if not others:
        return mine, None
    return mine, (
        f"GPU(s) {', '.join(map(str, others))} of this record of uid {owner} are not its job's "
        f"(SLURM: {slurm}): left alone, record kept"
    )


def _restore_record(
    path: Path, doc: dict[str, Any], owner: int | None, cap_command: str | None
) -> dict[str, Any]:
    """Put back one record's GPUs (the caller removes the record when every GPU is back)."""
    try:
        setter = restore_setter(doc.get("mode", "nvml"), cap_command)
        done = []
        for g in doc["gpus"]:
            # by the recorded UUID (nvml.job_gpus): an index may be another GPU in this process
            gpu = NvmlGpu(g["index"], set_limit=setter, gpm=False, uuid=g.get("uuid"))
            target, why = restore_target_w(gpu, g["original_limit_w"], owner)
            gpu.set_limit_w(target)
            done.append({**g, "restored_w": target, "restored_from": why})
        log.warning(
            "restored power limits left by process %s: %s",
            doc.get("pid"),
            ", ".join(f"GPU {g['index']} -> {g['restored_w']:g} W" for g in done),
        )
        return {"action": "restored", "gpus": done}
    except (CapError, RuntimeError, ValueError) as exc:
        return {"action": "failed", "error": str(exc)}


# ---- the guard -----------------------------------------------------------------------------
def restore_each(gpus: Any, method: str = "restore") -> list[str]:
    """Restore every GPU's original limit (``method``: ``reset_clock`` for clock locks), trying
    all of them; the errors, one per GPU."""
    errors = []
    for g in gpus:
        try:
            getattr(g, method)()
        except Exception as exc:  # one failing GPU must not keep the others capped
            errors.append(f"{getattr(g, 'name', g)}: {exc}")
    return errors


class CapGuard:
    """Context manager: cap every GPU in ``gpus`` to ``cap_w`` for the duration of a run.

    Refuses a cap outside any GPU's constraints before changing anything. ``record()``
    returns what run.json stores: mode, requested cap, original / set / enforced limits.
    Subclasses (``devices.clocks.ClockGuard``) change what is set and undone through
    ``STATE_PREFIX``, ``WHAT``, ``__enter__`` and ``_undo``; the signals and state file are shared.
    """

    STATE_PREFIX = "caps"  # state file name: <prefix>-<host>-<pid>.json
    WHAT = "power limits"  # what the log and errors say is set and put back

    def __init__(
        self,
        gpus: Sequence[PowerCapDevice],
        cap_w: float,
        mode: str = "nvml",
        state_dir: str | Path | None = None,
        command: str | None = None,
        handle_signals: bool = True,
    ):
        if mode not in MODES:
            raise ValueError(f"cap_control {mode!r}: expected one of {', '.join(MODES)}")
        self.gpus, self.cap_w, self.mode, self.command = list(gpus), float(cap_w), mode, command
        self.state_dir = Path(state_dir) if state_dir else default_state_dir()
        self.handle_signals = handle_signals
        self.state_path = (
            self.state_dir / f"{self.STATE_PREFIX}-{socket.gethostname()}-{os.getpid()}.json"
        )
        self.original_w = [float(getattr(g, "original_limit_w", float("nan"))) for g in self.gpus]
        self.enforced_w: list[float] = []
        self.applied = False
        self._restoring = False
        self._pending_signal: int | None = None
        self._old_handlers: dict[int, Any] = {}
        self.events: list[dict[str, Any]] = []

    # signals ----------------------------------------------------------------------------
    def _on_signal(self, signum: int, frame: Any) -> None:
        self.events.append({"signal": signal.Signals(signum).name, "t": time.time()})
        if self._restoring:
            self._pending_signal = signum  # finish restoring first; the exit follows
            return
        log.warning(
            "%s received: restoring %s before exiting", signal.Signals(signum).name, self.WHAT
        )
        raise CapSignal(signum)

    def _install(self) -> None:
        atexit.register(self.restore)
        if not self.handle_signals:
            return
        for name in SIGNALS:
            sig = getattr(signal, name)
            try:
                self._old_handlers[sig] = signal.signal(sig, self._on_signal)
            except ValueError:  # not the main thread: atexit and the state file remain
                log.warning("cannot install %s handler outside the main thread", name)

    def _uninstall(self) -> None:
        atexit.unregister(self.restore)
        for sig, old in self._old_handlers.items():
            signal.signal(sig, old)
        self._old_handlers.clear()

    # cap ----------------------------------------------------------------------------------
    def _write_state(self, fields: dict[str, Any], per_gpu: list[dict[str, Any]]) -> None:
        """Write the state file (before anything changes), then arm the handlers."""
        cap_state.write_record(
            self.state_dir,
            self.state_path.name,
            {
                "host": socket.gethostname(),
                "pid": os.getpid(),
                "pid_start": _proc_start(os.getpid()),
                "created": time.time(),
                "mode": self.mode,
                **fields,
                "gpus": [
                    {"index": getattr(g, "index", i), "uuid": getattr(g, "uuid", None), **extra}
                    for i, (g, extra) in enumerate(zip(self.gpus, per_gpu))
                ],
            },
        )
        self._install()
        self.applied = True

    def __enter__(self) -> CapGuard:
        if self.mode == "observe":
            self.enforced_w = [g.enforced_limit_w() for g in self.gpus]
            return self
        for g in self.gpus:  # refuse before touching anything
            check_cap(g, self.cap_w)
        # the record names no command: a restore uses the installed one (restore_setter)
        self._write_state({"cap_w": self.cap_w}, [{"original_limit_w": w} for w in self.original_w])
        try:
            self.enforced_w = [g.set_cap(self.cap_w) for g in self.gpus]
        except BaseException:
            self.restore()
            raise
        log.info(
            "power cap %g W set on %d GPU(s); enforced %s W",
            self.cap_w,
            len(self.gpus),
            ", ".join(f"{w:g}" for w in self.enforced_w),
        )
        return self

    def restore(self, keep_handlers: bool = False) -> None:
        """Put every GPU back to its original limit (idempotent). The state file is removed
        only when all GPUs were restored, so a failed restore can be retried later.

        ``keep_handlers``: the caps go back now, but a later signal still raises ``CapSignal``
        (a run restored first on SIGTERM, then stopping its training, stays interruptible);
        the handlers go at ``__exit__``."""
        if not self.applied or self._restoring:
            if not keep_handlers and not self._restoring:
                self._uninstall()
            return
        self._restoring = True
        try:
            errors = self._undo()
            self.applied = False
            if not keep_handlers:
                self._uninstall()
            if errors:
                raise CapError(
                    f"could not restore every one of the {self.WHAT} (state file kept at "
                    f"{self.state_path}; run `wattflex restore-caps`): " + "; ".join(errors)
                )
            cap_state.remove_own_record(self.state_dir, self.state_path.name)
            self._log_restored()
        finally:
            self._restoring = False
        if self._pending_signal is not None:
            signum, self._pending_signal = self._pending_signal, None
            raise CapSignal(signum)

    def _undo(self) -> list[str]:
        """Put every GPU back; the errors, one per GPU."""
        return restore_each(self.gpus)

    def _log_restored(self) -> None:
        log.info("power limits restored: %s W", ", ".join(f"{w:g}" for w in self.original_w))

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        self.restore()

    def record(self) -> dict[str, Any]:
        """The ``cap`` record of run.json: the cap control mode, the cap asked for, the original and
        enforced limits (W), the state file (None when only observing) and the signals received.
        """
        return {
            "cap_control": self.mode,
            "cap_w_requested": self.cap_w,
            "original_limit_w": self.original_w,
            "enforced_limit_w": self.enforced_w,
            "state_file": str(self.state_path) if self.mode != "observe" else None,
            "signals": self.events,
        }
