"""The quiet console (wattflex.snakemake_internals.quiet_console) under the real Snakemake CLI: one
progress line per job instead of each job's block, a failure still shown whole with its log
path, the full log under .snakemake/log/ and a dry run (`-n`, which shows each job's reasons) untouched."""

import os
import re
import subprocess
import sys

import pytest

from .conftest import REPO

pytestmark = pytest.mark.slow

#: The first line of a job's block as Snakemake prints it.
BLOCK = re.compile(r"^(?:local)?rule make:$", re.M)

SNAKEFILE = """
from wattflex.snakemake_internals import quiet_console
quiet_console()

rule all:
    input: expand("out/{i}.txt", i=range(4))

rule make:
    input: expand("in/{n}.txt", n=range(60))
    output: "out/{i}.txt"
    log: "logs/{i}.log"
    shell: "echo making {wildcards.i} > {log}; test {wildcards.i} != 3 && echo {wildcards.i} > {output}"
"""


def _run(work, *args, **env):
    return subprocess.run(
        [sys.executable, "-m", "snakemake", "--cores", "1", *args],
        cwd=work,
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(REPO / "workflow_scripts"), **env},
        timeout=300,
    )


@pytest.fixture
def work(tmp_path):
    (tmp_path / "Snakefile").write_text(SNAKEFILE)
    (tmp_path / "in").mkdir()
    for n in range(60):  # a long input list: one 1,000-character line per job's block
        (tmp_path / "in" / f"{n}.txt").write_text(f"input number {n} " * 4)
    return tmp_path


def test_one_progress_line_per_job_and_a_failure_shown_with_its_log(work):
    proc = _run(work, "--keep-going", "--show-failed-logs", "--printshellcmds")
    assert proc.returncode != 0
    lines = proc.stderr.splitlines()
    progress = [line for line in lines if line.startswith("[") and "/5]" in line]
    assert sorted(p.split("] ", 1)[1] for p in progress) == ["make i=0", "make i=1", "make i=2"]
    # no job's block but the failed one's, whose input list is the one long line
    assert "reason:" not in proc.stderr and proc.stderr.count("input: in/0.txt") == 1
    assert max(len(line) for line in lines if "input: in/0.txt" not in line) < 300
    # the failed job: Snakemake's whole block, its log path and the log itself
    assert "Error in rule make:" in proc.stderr and "log: logs/3.log" in proc.stderr
    assert "making 3" in proc.stderr
    # the full log keeps every job's block
    (full,) = (work / ".snakemake" / "log").iterdir()
    assert len(BLOCK.findall(full.read_text())) == 4


def test_a_dry_run_and_wattflex_log_full_print_snakemakes_own_blocks(work):
    dry = _run(work, "-n")
    assert (
        dry.returncode == 0 and dry.stdout.count("rule make:") + dry.stderr.count("rule make:") == 4
    )
    assert "reason:" in dry.stdout + dry.stderr
    full = _run(work, "--keep-going", WATTFLEX_LOG="full")
    assert len(BLOCK.findall(full.stderr)) == 4 and "input: in/0.txt" in full.stderr


def test_the_resources_line_is_cut_on_the_console_only(work):
    """--resources of many locks is one line of their reprs (the default campaign: 2,958
    characters): the console shows its start, the full log the whole line."""
    locks = [f"sweep_group_number_{i}=1" for i in range(60)]
    proc = _run(work, "--keep-going", "--resources", *locks)
    (line,) = [x for x in proc.stderr.splitlines() if x.startswith("Provided resources:")]
    assert len(line) < 250 and line.endswith("(the whole line: the full log)")
    (full,) = (work / ".snakemake" / "log").iterdir()
    assert "sweep_group_number_59" in full.read_text()
