"""Three suites by purpose, each a pytest marker given at collection (:func:`suite`):

- ``unit`` (``pytest -m unit``, every commit; target <= 90 s on 2 cores): in-process, everything
  outside tests/workflow/ that is not marked otherwise;
- ``integration`` (``-m integration``, every commit): the workflow's own runs under
  tests/workflow/, one shared tiny campaign (tests/shared_builds.py) and dry runs;
- ``conformance`` (``-m conformance``, in CI): against the real upstream thing, each scoped to the
  code it guards: torchrun jobs (tests/workflow/torchrun/), the local SLURM cluster (the ``slurm``
  marker), the in-process modules of ``CONFORMANCE_MODULES`` (real training, real servers), and
  any test marked ``conformance`` (a real browser).

The whole suite's target: <= 10 min on 2 cores; benchmarks/bench_tests.py times each suite.
``slow`` (integration or conformance) is kept as a marker, so ``-m "not slow"`` still selects
the unit suite.

Everything under tests/workflow/ is slow. A test that starts Snakemake or torchrun must be
marked slow and live under tests/workflow/ (the torchrun ones go in tests/workflow/torchrun/): a
test that breaks this fails when it starts the process, naming the rule, so the fast tier stays fast.
(Processes started by the started process, and fixtures wider than a test, are not watched.)
With pytest-xdist (``-n 4 --dist loadgroup``), tests that share a wide fixture run on one worker.
"""

from __future__ import annotations

import atexit
import os
import subprocess
import sys
from pathlib import Path

import pytest

WORKFLOW_TESTS = Path(__file__).resolve().parent / "workflow"
# What starts Snakemake or torchrun: the console scripts, or python -m of their modules.
SCRIPTS = {"snakemake": "Snakemake", "torchrun": "torchrun"}
MODULES = {
    "snakemake": "Snakemake",
    "torch.distributed.run": "torchrun",
    "torch.distributed.launch": "torchrun",
}
# Where a test that starts each tool goes, under WORKFLOW_TESTS (the guard's message says so).
HOMES = {"Snakemake": "tests/workflow/", "torchrun": "tests/workflow/torchrun/"}


def started_tool(argv) -> str:
    """'Snakemake' or 'torchrun' if ``argv`` starts one, else ''."""
    args = [argv] if isinstance(argv, (str, bytes, os.PathLike)) else list(argv)
    args = [os.fsdecode(a) for a in args]
    if len(args) == 1 and " " in args[0]:  # a shell command line
        args = args[0].split()
    for i, arg in enumerate(args):
        if os.path.basename(arg) in SCRIPTS:
            return SCRIPTS[os.path.basename(arg)]
        if arg == "-m" and i + 1 < len(args) and args[i + 1] in MODULES:
            return MODULES[args[i + 1]]
    return ""


def tier_violation(tool: str, test_path: Path, slow: bool) -> str:
    """Why a test at ``test_path`` may not start ``tool`` ('' if it may)."""
    if not tool:
        return ""
    if not slow:
        return f"starts {tool} but is not marked slow: mark it @pytest.mark.slow and move it under {HOMES[tool]}"
    if not test_path.resolve().is_relative_to(WORKFLOW_TESTS):
        return f"starts {tool} outside tests/workflow/: move it under {HOMES[tool]}"
    return ""


SUITES = ("unit", "integration", "conformance")
CONFORMANCE_DIRS = (WORKFLOW_TESTS / "torchrun",)
# In-process, but against the real upstream thing at length (a minute or more of the unit suite
# each, measured with --durations on the shared 2-core machine, 2026-12-07): the harness training
# real transformers + peft models of every family, glibc's malloc with real torch tensors in
# fresh interpreters, the plan's activation factors against a real layer of every family (38 s
# of CPU), real OpenADR 2.0b / 3 VTN servers followed for seconds per test.
CONFORMANCE_MODULES = tuple(
    WORKFLOW_TESTS.parent / "unit" / m
    for m in (
        "runs/training/test_training.py",
        "runs/training/test_hostmem.py",
        "runs/training/test_loss_decided_once.py",
        "runs/test_activation_factors.py",
        "ops/test_openadr.py",
        "ops/test_openadr3.py",
    )
)


def suite(item) -> str:
    """The suite of a collected test: the one it is marked with, else ``conformance`` for a
    SLURM or torchrun test, ``integration`` for the rest of tests/workflow/ (or a test marked
    slow), ``unit`` for everything else."""
    marked = [name for name in SUITES if item.get_closest_marker(name)]
    if marked:
        return marked[0]
    path = Path(item.path).resolve()
    if (
        item.get_closest_marker("slurm")
        or any(path.is_relative_to(d) for d in CONFORMANCE_DIRS)
        or path in CONFORMANCE_MODULES
    ):
        return "conformance"
    if path.is_relative_to(WORKFLOW_TESTS) or item.get_closest_marker("slow"):
        return "integration"
    return "unit"


def xdist_group(item) -> str:
    """The pytest-xdist worker group (``--dist loadgroup``) of a test ('' for any worker): a SLURM
    test module's tests go to one worker (the module has a partition of the session's cluster to
    itself: tests/slurm_cluster.py); tests that share a module- or session-scoped fixture of
    their own (a Snakemake run of a campaign, a VTN) go to one worker, which builds it once."""
    if item.get_closest_marker("slurm"):
        return f"slurm:{Path(item.path).stem}"
    shared = sorted(
        f"{d.scope}:{d.baseid}::{name}"
        for name, defs in item._fixtureinfo.name2fixturedefs.items()
        for d in defs
        if d.baseid not in ("", "tests")  # the root conftest's are constants
        and (d.scope == "module" or d.scope == "session" and d.argnames)
    )  # a session one that builds
    return shared[0] if shared else ""


def pytest_configure(config):
    """An xdist worker ends without Python's finalization (module teardown, torch's and
    matplotlib's destructors, a last collection of every test's garbage): the controller waits
    for each worker to exit, and that took 5.4 s after the last worker's tests on the fast tier
    at -n 3 (1.2 s with this; benchmarks/results/tests.md). Registered here, before anything a
    test registers, so those handlers (weakref finalizers included) run first; the two registered
    before it are skipped, logging's shutdown among them (a worker logs to no file of its own)."""
    if hasattr(config, "workerinput"):

        def exit_now():
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(0)

        atexit.register(exit_now)


UNIT_ONLY = ("unit", "not slow")  # the -m expressions that select the unit suite alone


def pytest_ignore_collect(collection_path, config):
    """The unit suite (``-m unit`` or ``-m "not slow"``) selects nothing under tests/workflow/
    (none of it is unit), so it does not import those modules: ~0.7 s of CPU less per xdist worker."""
    if config.getoption("markexpr") in UNIT_ONLY and Path(collection_path).resolve().is_relative_to(
        WORKFLOW_TESTS
    ):
        return True
    return None


@pytest.hookimpl(tryfirst=True)  # before xdist's own hook reads the xdist_group marks
def pytest_collection_modifyitems(items):
    for item in items:
        name = suite(item)
        item.add_marker(getattr(pytest.mark, name))
        if name != "unit":
            item.add_marker(pytest.mark.slow)
        if group := xdist_group(item):
            item.add_marker(pytest.mark.xdist_group(group))


@pytest.fixture(autouse=True)
def _tier_guard(request, monkeypatch):
    slow = request.node.get_closest_marker("slow") is not None
    test_path = Path(request.node.path)
    popen_init = subprocess.Popen.__init__

    def guarded(self, args, *rest, **kwargs):
        why = tier_violation(started_tool(args), test_path, slow)
        if why:
            pytest.fail(f"{request.node.nodeid} {why} (tests/tiers.py)", pytrace=False)
        popen_init(self, args, *rest, **kwargs)

    monkeypatch.setattr(subprocess.Popen, "__init__", guarded)
