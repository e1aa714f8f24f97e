"""tests/tiers.py: what counts as starting Snakemake or torchrun, and where such a test may live."""

import subprocess
import sys

import pytest

from tests.tiers import (
    CONFORMANCE_MODULES,
    HOMES,
    SUITES,
    WORKFLOW_TESTS,
    pytest_collection_modifyitems,
    pytest_ignore_collect,
    started_tool,
    suite,
    tier_violation,
)

UNIT_TEST = WORKFLOW_TESTS.parent / "unit" / "test_x.py"


@pytest.mark.parametrize(
    "argv, tool",
    [
        ([sys.executable, "-m", "snakemake", "-n"], "Snakemake"),
        (["/venv/bin/snakemake", "--cores", "1"], "Snakemake"),
        (["setpriv", "--inh-caps=-all", sys.executable, "-m", "snakemake"], "Snakemake"),
        ("snakemake -n --cores 1", "Snakemake"),
        ([sys.executable, "-m", "torch.distributed.run", "--standalone", "x.py"], "torchrun"),
        (["torchrun", "--nproc-per-node=2", "x.py"], "torchrun"),
        ([sys.executable, "tests/fakes/fake_torchrun.py"], ""),
        ([sys.executable, "-m", "wattflex.cli", "pfi"], ""),
        ([sys.executable, "-c", "import snakemake"], ""),
    ],
)
def test_started_tool(argv, tool):
    assert started_tool(argv) == tool


def test_where_each_tool_may_run():
    """Both only marked slow and under tests/workflow/; the message says where to move the test."""
    assert HOMES == {"Snakemake": "tests/workflow/", "torchrun": "tests/workflow/torchrun/"}
    assert all(
        (WORKFLOW_TESTS.parents[1] / home).resolve().is_relative_to(WORKFLOW_TESTS)
        and (WORKFLOW_TESTS.parents[1] / home / "__init__.py").is_file()
        for home in HOMES.values()
    )
    for tool, home in HOMES.items():
        assert (
            tier_violation(tool, UNIT_TEST, slow=False)
            == f"starts {tool} but is not marked slow: mark it @pytest.mark.slow and move it under {home}"
        )
        assert (
            tier_violation(tool, UNIT_TEST, slow=True)
            == f"starts {tool} outside tests/workflow/: move it under {home}"
        )
        assert "not marked slow" in tier_violation(
            tool, WORKFLOW_TESTS / "torchrun" / "test_x.py", slow=False
        )
        assert tier_violation(tool, WORKFLOW_TESTS / "test_x.py", slow=True) == ""
        assert tier_violation(tool, WORKFLOW_TESTS / "torchrun" / "test_x.py", slow=True) == ""
    assert tier_violation("", UNIT_TEST, slow=False) == ""


def test_this_fast_test_may_not_start_snakemake_or_torchrun():
    """The guard is on in this very test (not slow, under tests/unit/): it fails the test before
    the process starts."""
    with pytest.raises(pytest.fail.Exception, match="starts Snakemake but is not marked slow"):
        subprocess.run([sys.executable, "-m", "snakemake", "--version"], capture_output=True)
    with pytest.raises(pytest.fail.Exception, match="starts torchrun but is not marked slow"):
        subprocess.run(
            [sys.executable, "-m", "torch.distributed.run", "--help"], capture_output=True
        )
    assert (
        subprocess.run([sys.executable, "-c", "print(1)"], capture_output=True, text=True).stdout
        == "1\n"
    )


class Item:
    """What the collection hook reads of a pytest item: its path and its own markers."""

    _fixtureinfo = type("FixtureInfo", (), {"name2fixturedefs": {}})

    def __init__(self, path, *own):
        self.path, self.own, self.marks = path, set(own), []

    def add_marker(self, mark):
        self.marks.append(mark.name)

    def get_closest_marker(self, name):
        return name if name in self.own else None


def test_every_conformance_module_is_there():
    assert all(m.is_file() for m in CONFORMANCE_MODULES)


def test_each_test_is_in_one_suite_by_purpose():
    """tests/unit -> unit; tests/workflow -> integration; torchrun jobs and the SLURM modules ->
    conformance; a marker given in the test wins. ``slow`` marks every suite but unit."""
    cases = {
        (UNIT_TEST,): ["unit"],
        (WORKFLOW_TESTS / "test_x.py",): ["integration", "slow"],
        (WORKFLOW_TESTS / "torchrun" / "test_x.py",): ["conformance", "slow"],
        (WORKFLOW_TESTS / "test_slurm_x.py", "slurm"): ["conformance", "slow", "xdist_group"],
        (WORKFLOW_TESTS / "test_x.py", "conformance"): ["conformance", "slow"],
        (UNIT_TEST, "slow"): ["integration", "slow"],
        (CONFORMANCE_MODULES[0],): ["conformance", "slow"],
    }
    for (path, *own), marks in cases.items():
        item = Item(path, *own)
        pytest_collection_modifyitems([item])
        assert item.marks == marks, (path, own)
        assert suite(item) == marks[0] and marks[0] in SUITES


def test_the_fast_tier_does_not_collect_tests_workflow():
    class Config:
        def __init__(self, markexpr):
            self.markexpr = markexpr

        def getoption(self, name):
            return {"markexpr": self.markexpr}[name]

    workflow_module = WORKFLOW_TESTS / "test_x.py"
    assert pytest_ignore_collect(workflow_module, Config("not slow")) is True
    assert pytest_ignore_collect(WORKFLOW_TESTS / "torchrun", Config("not slow")) is True
    assert (
        pytest_ignore_collect(UNIT_TEST, Config("not slow")) is None
    )  # the unit tests are collected
    assert pytest_ignore_collect(workflow_module, Config("unit")) is True
    for markexpr in (
        "slow",
        "",
        "slow and not slurm",
        "not slurm",
        "integration",
        "conformance",
    ):  # any other selection: all
        assert pytest_ignore_collect(workflow_module, Config(markexpr)) is None


def test_xdist_keeps_each_group_on_one_worker(tmp_path):
    """With the installed pytest and pytest-xdist, ``--dist loadgroup`` really sends a group to one
    worker: each SLURM module's tests, which share its partition. pytest 9.2 broke this silently
    (pytest-xdist#1386: a group's tests then ran on several workers); this fails instead."""
    (tmp_path / "tests" / "workflow").mkdir(parents=True)
    (tmp_path / "tests" / "__init__.py").touch()
    (tmp_path / "tests" / "workflow" / "__init__.py").touch()
    (tmp_path / "tests" / "tiers.py").write_text((WORKFLOW_TESTS.parent / "tiers.py").read_text())
    (tmp_path / "tests" / "conftest.py").write_text('pytest_plugins = ["tests.tiers"]\n')
    (tmp_path / "pytest.ini").write_text(
        "[pytest]\nmarkers =\n    slow: s\n    slurm: s\n    unit: s\n    integration: s\n    conformance: s\n"
    )
    for name in "abc":
        (tmp_path / "tests" / "workflow" / f"test_{name}.py").write_text(
            "import pytest\npytestmark = pytest.mark.slurm\n"
            "def test_1(): pass\ndef test_2(): pass\n"
        )
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-n",
            "3",
            "--dist",
            "loadgroup",
            "-v",
            "-p",
            "no:cacheprovider",
            "tests",
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    ).stdout
    ran = [line.split() for line in out.splitlines() if " PASSED " in line]
    assert len(ran) == 6, out
    workers: dict[str, set[str]] = {}
    for words in ran:  # [gwN] [ 16%] PASSED tests/workflow/test_a.py::test_1@slurm:test_a
        module = words[-1].split("::")[0].rsplit("/", 1)[-1].removesuffix(".py")
        assert words[-1].endswith(f"@slurm:{module}"), out
        workers.setdefault(module, set()).add(words[0])
    assert sorted(workers) == ["test_a", "test_b", "test_c"]
    assert all(len(w) == 1 for w in workers.values()), (
        f"a SLURM module ran on several workers:\n{out}"
    )
