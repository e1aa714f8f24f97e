"""A SLURM job's own Snakemake dies with its job script (wattflex.smk.die_with_parent): real
processes, the job script a shell that is killed while its child runs, as scancel's SIGTERM
ends the batch shell first (the test cluster's proctrack/linuxproc then loses the child:
tests/workflow/test_slurm_multinode.py's left_alive check)."""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from wattflex.smk import die_with_parent, in_slurm_job_step

LIB = Path(__file__).resolve().parents[2] / "workflow_scripts"
CHILD = (
    "import sys, time\n"
    "from wattflex.smk import die_with_parent\n"
    "{call}\n"
    "print('ready', flush=True)\n"
    "time.sleep(60)\n"
)


def alive(pid: int) -> bool:
    """Whether ``pid`` runs (not gone, not a zombie its new parent has yet to reap)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(") ", 1)[1][0] != "Z"
    except (OSError, IndexError):
        return False


def orphan_after_parent_dies(call: str, wait_s: float = 2.0) -> tuple[int, bool]:
    """(child pid, alive ``wait_s`` after its parent shell was SIGKILLed) of a child that runs
    ``call`` before it says ready."""
    shell = subprocess.Popen(
        ["bash", "-c", f'{sys.executable} -c "$0"; echo parent-done', CHILD.format(call=call)],
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": str(LIB)},
    )
    try:
        assert shell.stdout.readline().strip() == "ready"
        pgrep = subprocess.run(["pgrep", "-P", str(shell.pid)], capture_output=True, text=True)
        child = int(pgrep.stdout.split()[0])
        shell.send_signal(signal.SIGKILL)
        shell.wait()
        deadline = time.monotonic() + wait_s
        while alive(child) and time.monotonic() < deadline:
            time.sleep(0.05)
        return child, alive(child)
    finally:
        shell.kill()


def test_a_process_that_asked_dies_with_its_parent():
    child, alive = orphan_after_parent_dies("assert die_with_parent()")
    assert not alive, f"pid {child} outlived its parent"


def test_without_it_the_orphan_lives_on():
    """The leak itself: what proctrack/linuxproc could no longer find."""
    child, alive = orphan_after_parent_dies("pass")
    try:
        assert alive
    finally:
        os.kill(child, signal.SIGKILL)


def test_only_the_snakemake_of_a_slurm_job_asks():
    job = {"SLURM_JOB_ID": "42"}
    argv = ["python", "-m", "snakemake", "--executor", "slurm-jobstep", "--jobs", "1"]
    assert in_slurm_job_step(argv, job)
    assert in_slurm_job_step(["snakemake", "--executor=slurm-jobstep"], job)
    assert not in_slurm_job_step(argv, {})  # not inside an allocation
    assert not in_slurm_job_step(["snakemake", "--executor", "slurm"], job)  # the submitting one
    assert not in_slurm_job_step(["snakemake", "--executor"], job)
    assert die_with_parent.__module__ == "wattflex.smk"
