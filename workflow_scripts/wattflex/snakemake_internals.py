"""Every place wattflex reaches into Snakemake's private internals, in one module.

Four hooks, each for a reason Snakemake's public interface does not cover:

- :func:`install_real_run_guard`: measured runs are never overwritten or re-measured
  (docs/reliability.md "Real runs are protected"). Snakemake decides write protection with
  ``os.access(W_OK)`` (always true for root) and deletes a job's outputs right before running
  it, so the guard wraps ``Job.check_protected_output``, which Snakemake awaits for every job
  it plans (when it builds the DAG and again before deleting outputs), and
  ``Job.outputs_older_than_script_or_notebook`` (the script-mtime rerun trigger).
- :func:`guard_delete_output`: ``--delete-all-output`` / ``--delete-temp-output`` call
  ``workflow.delete_output(only_temp=, dryrun=)`` after the Snakefile is parsed; it is wrapped.
- :func:`release_scheduler_timers`: the scheduler's non-daemon ``threading.Timer`` re-opening
  callbacks, cancelled when the run is over (the Snakefile's onsuccess/onerror).
- :func:`quiet_console`: a progress line per job on the console instead of each job's block
  (the handler Snakemake names ``DefaultStreamHandler`` and its ``DefaultFilter``).

:func:`check_internals` names each attribute and signature these hooks rely on and raises
:class:`SnakemakeInternalsChanged` when the installed Snakemake lacks one, so a Snakemake
release that changes them stops the workflow (and tests/unit/test_snakemake_internals.py)
instead of silently dropping the protection. pyproject.toml pins Snakemake to the minor
release this was checked against. Imports stay light: every `snakemake` start imports this.
"""

from __future__ import annotations

import functools
import importlib.util
import inspect
import logging
import os
import re
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from wattflex.runs.protection import holds_real_run, kept_real_runs, overwrite_refusal

#: The module of the callbacks Snakemake's job scheduler hands to its re-scheduling timers.
SCHEDULER_MODULE = "snakemake.scheduling.job_scheduler"

#: (object, attribute, parameters after self, kind) that the hooks below patch or call;
#: kind: "async" (coroutine function), "asyncgen" (async generator function), "def", "attr".
PATCHED = (
    ("snakemake.jobs.Job", "check_protected_output", (), "async"),
    ("snakemake.jobs.Job", "outputs_older_than_script_or_notebook", (), "asyncgen"),
    ("snakemake.workflow.Workflow", "delete_output", ("only_temp", "dryrun"), "def"),
    ("snakemake.dag.DAG", "needrun_jobs", ("exclude_finished",), "def"),
    ("snakemake.dag.DAG", "reason", ("job",), "def"),
    ("snakemake.workflow.Workflow", "touch", (), "attr"),
    ("snakemake.logging.DefaultFilter", "filter", ("record",), "def"),
)


class SnakemakeInternalsChanged(RuntimeError):
    """The installed Snakemake no longer has an internal that wattflex hooks."""


def _resolve(dotted: str) -> Any:
    module, _, name = dotted.rpartition(".")
    # Snakemake's modules load in the order its API imports them: snakemake.workflow imported
    # first in a process that has only imported snakemake.jobs is a circular import
    # (ImportError: partially initialized module), as a fresh pytest-xdist worker found.
    importlib.import_module("snakemake.api")
    return getattr(importlib.import_module(module), name)


def _problem(owner: str, attr: str, params: tuple[str, ...], kind: str) -> str | None:
    try:
        obj = _resolve(owner)
    except (ImportError, AttributeError) as exc:
        return f"{owner} is gone ({exc})"
    member = inspect.getattr_static(obj, attr, None)
    if member is None:
        return f"{owner}.{attr} is gone"
    if kind == "attr":
        return None
    func = getattr(member, "__wrapped__", member)  # our own guard, if already installed
    checks = {
        "async": (inspect.iscoroutinefunction, "a coroutine function"),
        "asyncgen": (inspect.isasyncgenfunction, "an async generator function"),
        "def": (inspect.isfunction, "a function"),
    }
    is_kind, what = checks[kind]
    if not is_kind(func):
        return f"{owner}.{attr} is no longer {what}"
    got = tuple(inspect.signature(func).parameters)[1:]
    return None if got == params else f"{owner}.{attr} takes {got}, expected {params}"


def _scheduler_problem() -> str | None:
    spec = importlib.util.find_spec(SCHEDULER_MODULE)
    if spec is None or not spec.origin:
        return f"{SCHEDULER_MODULE} is gone"
    if "threading.Timer(" not in Path(spec.origin).read_text():
        return f"{SCHEDULER_MODULE} no longer re-schedules with threading.Timer"
    return None


@functools.cache
def check_internals() -> None:
    """Raise SnakemakeInternalsChanged naming every patched internal that changed."""
    import snakemake  # its version, for the message (_resolve imports the modules, snakemake.api first)

    problems = [p for p in (*(_problem(*entry) for entry in PATCHED), _scheduler_problem()) if p]
    if problems:
        raise SnakemakeInternalsChanged(
            f"snakemake {getattr(snakemake, '__version__', '?')} changed internals wattflex hooks "
            f"(wattflex.snakemake_internals): {'; '.join(problems)}. Install the Snakemake version pinned in "
            f"pyproject.toml, or update wattflex/snakemake_internals.py."
        )


# ---- Real runs are never overwritten -----------------------------------------------------
_GUARDED_RULES: set[str] = set()


def _run_dir(job: Any) -> Path:
    return Path(str(job.output.run)).parent


def install_real_run_guard(rule_names: Iterable[str]) -> None:
    """Make Snakemake refuse, before it deletes anything, every job of ``rule_names`` (rules
    with a ``run`` output: run.json) whose run directory holds a real run not named in
    WATTFLEX_REDO_RUNS, in a dry run too; and drop the script-mtime trigger for such jobs (a
    real run depends on its spec alone: a ``git pull`` that touches the rule script is no
    reason to measure again). The ``--touch`` mode rewrites no file and is let through.
    Installed once per process."""
    from snakemake.exceptions import WorkflowError
    from snakemake.jobs import Job

    check_internals()
    _GUARDED_RULES.update(rule_names)
    if getattr(Job.check_protected_output, "_wattflex_guard", False):
        return
    check_protected_output = Job.check_protected_output
    outputs_older_than_script = Job.outputs_older_than_script_or_notebook

    @functools.wraps(check_protected_output)
    async def guarded_check(job):
        if (
            job.rule.name in _GUARDED_RULES
            and not job.dag.workflow.touch
            and kept_real_runs([_run_dir(job)])
        ):
            planned = [j for j in job.dag.needrun_jobs() if j.rule.name in _GUARDED_RULES]
            kept = kept_real_runs(dict.fromkeys(_run_dir(j) for j in planned)) or [_run_dir(job)]
            raise WorkflowError(
                overwrite_refusal(kept, str(job.dag.reason(job)).replace("\n", " ").strip())
            )
        await check_protected_output(job)

    @functools.wraps(outputs_older_than_script)
    async def guarded_script_trigger(job):
        if job.rule.name in _GUARDED_RULES and holds_real_run(_run_dir(job)):
            return
        async for f in outputs_older_than_script(job):
            yield f

    guarded_check._wattflex_guard = True
    Job.check_protected_output = guarded_check
    Job.outputs_older_than_script_or_notebook = guarded_script_trigger


def guard_delete_output(workflow: Any, refusal: Callable[[bool], str | None]) -> None:
    """Wrap ``workflow.delete_output`` (--delete-all-output / --delete-temp-output): when
    ``refusal(only_temp)`` returns a message, raise it instead of deleting (a dry run still
    lists what it would delete). Snakemake parses the Snakefile, then calls workflow.delete_output: the
    workflow object does not know the mode at parse time, so the call is guarded instead."""
    from snakemake.exceptions import WorkflowError

    check_internals()
    delete_output = workflow.delete_output

    def guarded(only_temp=False, dryrun=False):
        message = None if dryrun else refusal(only_temp)
        if message:
            raise WorkflowError(message)
        return delete_output(only_temp=only_temp, dryrun=dryrun)

    workflow.delete_output = guarded


# ---- The scheduler's timers --------------------------------------------------------------
def release_scheduler_timers() -> int:
    """Let `snakemake` exit as soon as its run is over (the Snakefile's onsuccess/onerror).

    Snakemake's scheduler re-opens itself after every round through a threading.Timer of its
    --max-jobs-per-timespan window (1 s by default; the option's format allows no shorter),
    and the timer is not a daemon thread: the interpreter waits for the last one before it
    exits, up to a second of every run that executed jobs (0.97 s measured after a
    plot-setting rerun). Nothing is scheduled after those hooks, so the scheduler's pending
    timers are cancelled, and no other timer. Returns how many were cancelled."""
    import threading

    pending = [
        t
        for t in threading.enumerate()
        if isinstance(t, threading.Timer)
        and t.is_alive()
        and getattr(t.function, "__module__", "") == SCHEDULER_MODULE
    ]
    for timer in pending:
        timer.cancel()
    return len(pending)


# ---- A quiet console: one progress line per job ------------------------------------------
#: Scheduler chatter the compact console leaves to the full log (.snakemake/log/).
#: Longest resources line the compact console prints.
_LONGEST = 160
_CHATTER = re.compile(r"^(Select jobs to execute\.\.\.|Execute \d+ jobs\.\.\.)$")


class ProgressLines(logging.Filter):
    """A filter (and formatter) for Snakemake's console handler that prints one line per
    finished job, ``[12/275] run_at_cap group=dense-pt-qwen32b-x8, cap=400``, instead of each
    job's block (input and output lists, the reasons, resources: thousands of lines, some tens
    of thousands of characters long). Errors keep Snakemake's whole block, with the log path;
    the full log under ``.snakemake/log/`` keeps everything."""

    def __init__(self, formatter: logging.Formatter):
        super().__init__()
        self.formatter = formatter
        self.jobs: dict[Any, str] = {}
        self.finished: list[Any] = []

    def filter(self, record: logging.LogRecord) -> bool:
        """Whether Snakemake's console prints ``record``: a job's info is kept (not printed) to name it
        when it finishes, the finish is counted, a shell command with text and anything else not
        chatter is printed.
        """
        from snakemake_interface_logger_plugins.common import LogEvent

        event = getattr(record, "event", None)
        if event == LogEvent.JOB_INFO:
            wildcards = ", ".join(f"{k}={v}" for k, v in (record.wildcards or {}).items())
            self.jobs[record.jobid] = f"{record.rule_name} {wildcards}".strip()
            return False
        if event == LogEvent.JOB_FINISHED:
            self.finished.append(getattr(record, "job_id", None))
            return False
        if event == LogEvent.SHELLCMD:
            return bool(getattr(record, "cmd", None))
        if event in (None, LogEvent.JOB_STARTED) and _CHATTER.match(str(record.msg or "")):
            return False
        return True

    def format(self, record: logging.LogRecord) -> str:
        """The progress line for a PROGRESS record; Snakemake's own text for the rest."""
        from snakemake_interface_logger_plugins.common import LogEvent

        event = getattr(record, "event", None)
        if event == LogEvent.RESOURCES_INFO and len(str(record.msg)) > _LONGEST:
            # one line of every resource's repr (a lock per sweep group): its start only
            return f"{str(record.msg)[:_LONGEST]}… (the whole line: the full log)"
        if event != LogEvent.PROGRESS:
            return self.formatter.format(record)
        done = [self.jobs.pop(j, "") for j in self.finished]
        self.finished.clear()
        width = len(str(record.total))
        return f"[{record.done:>{width}}/{record.total}] " + (
            "; ".join(d for d in done if d) or "done"
        )


def quiet_console() -> bool:
    """Make Snakemake's console (not its full log file) print a progress line per job
    (:class:`ProgressLines`), unless this is a dry run (whose job table and reasons are the
    point), ``--verbose`` is on, or ``WATTFLEX_LOG=full``. Returns whether it did."""
    from snakemake.logging import DefaultFilter, logger

    if os.environ.get("WATTFLEX_LOG", "").lower() == "full":
        return False
    for handler in logger.handlers:
        if getattr(handler, "name", None) != "DefaultStreamHandler":
            continue
        default = next((f for f in handler.filters if isinstance(f, DefaultFilter)), None)
        if default is None or default.dryrun or default.verbose:
            return False
        if any(isinstance(f, ProgressLines) for f in handler.filters):
            return True
        lines = ProgressLines(handler.formatter)
        handler.addFilter(lines)
        handler.setFormatter(lines)
        return True
    return False
