"""The Snakemake internals wattflex hooks (wattflex.snakemake_internals) exist in the installed
Snakemake, with the signatures the hooks assume; a change is an error, never a silent no-op;
and pyproject.toml pins Snakemake to the release this is checked against."""

import inspect
import tomllib
from importlib.metadata import version
from pathlib import Path
from types import SimpleNamespace

import pytest
from packaging.specifiers import SpecifierSet
from snakemake.exceptions import WorkflowError
from snakemake.jobs import Job

from wattflex import snakemake_internals as internals

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(autouse=True)
def _fresh_check():
    internals.check_internals.cache_clear()
    yield
    internals.check_internals.cache_clear()


def _snakemake_requirement() -> SpecifierSet:
    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    (req,) = [d for d in deps if d.split(">")[0].split("<")[0].split("=")[0].strip() == "snakemake"]
    return SpecifierSet(req[len("snakemake") :])


def test_the_installed_snakemake_is_the_pinned_release():
    spec = _snakemake_requirement()
    installed = version("snakemake")
    assert installed in spec, (
        f"snakemake {installed} is outside pyproject's {spec}: check the internals, then re-pin"
    )
    # one minor release: a minor release may change the internals wattflex hooks
    major, minor = (int(x) for x in installed.split(".")[:2])
    assert f"{major}.{minor + 1}.0" not in spec and f"{major}.{minor}.0" in spec


def test_every_patched_internal_exists_with_the_assumed_signature():
    internals.check_internals()  # raises SnakemakeInternalsChanged otherwise
    assert inspect.signature(
        internals._resolve("snakemake.workflow.Workflow").delete_output
    ).parameters.keys() == {"self", "only_temp", "dryrun"}
    # the scheduler's timers are created in the module whose callbacks are cancelled
    from snakemake.scheduling import job_scheduler

    assert job_scheduler.__name__ == internals.SCHEDULER_MODULE
    assert "threading.Timer(" in inspect.getsource(job_scheduler.JobScheduler)


@pytest.mark.parametrize(
    "change, named",
    [
        (
            lambda mp: mp.setattr(Job, "check_protected_output", lambda self: None),
            "no longer a coroutine function",
        ),
        (lambda mp: mp.delattr(Job, "outputs_older_than_script_or_notebook"), "is gone"),
        (
            lambda mp: mp.setattr(
                internals._resolve("snakemake.workflow.Workflow"),
                "delete_output",
                lambda self, only_temp=False, dryrun=False, quiet=False: None,
            ),
            "takes",
        ),
        (
            lambda mp: mp.setattr(
                internals, "SCHEDULER_MODULE", "snakemake.scheduling.no_such_module"
            ),
            "is gone",
        ),
    ],
)
def test_a_changed_internal_stops_the_workflow_loudly(monkeypatch, change, named):
    change(monkeypatch)
    with pytest.raises(internals.SnakemakeInternalsChanged, match=named):
        internals.check_internals()
    with pytest.raises(internals.SnakemakeInternalsChanged, match="pinned in pyproject.toml"):
        internals.install_real_run_guard(["run_at_cap"])


def test_the_guard_keeps_the_wrapped_signatures():
    internals.install_real_run_guard(["run_at_cap"])
    assert Job.check_protected_output._wattflex_guard
    internals.check_internals.cache_clear()
    internals.check_internals()  # the installed guard still passes the check (it wraps, same signature)


def test_delete_output_is_refused_when_told_and_a_dry_run_lists_as_before():
    calls = []
    workflow = SimpleNamespace(
        delete_output=lambda only_temp=False, dryrun=False: calls.append((only_temp, dryrun))
    )
    internals.guard_delete_output(
        workflow, lambda only_temp: f"refused ({'temp' if only_temp else 'all'})"
    )
    workflow.delete_output(dryrun=True)
    with pytest.raises(WorkflowError, match=r"refused \(temp\)"):
        workflow.delete_output(only_temp=True)
    assert calls == [(False, True)]
    allowed = SimpleNamespace(
        delete_output=lambda only_temp=False, dryrun=False: calls.append((only_temp, dryrun))
    )
    internals.guard_delete_output(allowed, lambda only_temp: None)
    allowed.delete_output()
    assert calls == [(False, True), (False, False)]
