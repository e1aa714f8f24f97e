"""Odd inputs (issue 37, "tracebacks and unclear errors"): one line and exit status 2, never a
traceback, a hang or a MemoryError. Every command's input passes one check
(``wattflex.ingest.reader.check_input_file``): a FIFO, a folder, a device or a file over the
size limit says what it is before it is opened; counts and GPU indices are bounded before a
list is made of them."""

import signal
from contextlib import contextmanager

import pytest

from tests.unit.test_cli_safety import SWEEPS as SWEEP

CURVES = "job,power_w,throughput\na,300,10\na,200,8\na,100,5\nb,300,10\nb,200,9\nb,100,7\n"

# command line of each input, IN standing for the odd file
INPUTS = {
    "pfi": ["pfi", "IN"],
    "stats": ["stats", "IN"],
    "allocate": ["allocate", "IN", "--cut", "0.2"],
    "offer": ["offer", "IN"],
    "offer --config": ["offer", "--config", "IN"],
    "predict --model": ["predict", "t.csv", "--model", "IN"],
    "doctor --configfile": ["doctor", "--configfile", "IN"],
    "cluster-control --signal": ["cluster-control", "--signal", "IN", "--budget-dir", "bd", "--duration-s", "1"],
    "run-at-cap SPEC": ["run-at-cap", "IN", "out"],
    "calibrate --gpu-check": ["calibrate", "--gpu-check", "IN"],
}
KINDS = {"fifo": "is a FIFO (named pipe), not a regular file", "folder": "is a directory, not a file",
         "/dev/zero": "/dev/zero: is a character device, not a regular file",
         "sparse 1 GiB": "is 1,024 MiB, over the"}


@contextmanager
def no_hang(seconds: int = 30):
    """A command that blocks on opening a FIFO fails the test instead of hanging it."""
    def stop(signum, frame):
        raise TimeoutError(f"the command still runs after {seconds} s (blocked opening the input?)")
    old = signal.signal(signal.SIGALRM, stop)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)


def odd_input(tmp_path, kind: str) -> str:
    path = tmp_path / "in"
    if kind == "fifo":
        import os

        os.mkfifo(path)
    elif kind == "folder":
        path.mkdir()
        (path / "x.csv").write_text(CURVES)
    elif kind == "sparse 1 GiB":
        with open(path, "wb") as fh:
            fh.truncate(2**30)  # sparse: no disk used
    else:
        return kind
    return "in"


def one_line(proc, command: str) -> str:
    assert proc.returncode == 2, (proc.returncode, proc.stderr[-2000:])
    assert "Traceback" not in proc.stderr, proc.stderr[-2000:]
    line = proc.stderr.strip().splitlines()[-1]
    assert line.startswith(f"wattflex {command}: error: "), proc.stderr[-2000:]
    return line


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("option", INPUTS)
def test_an_input_that_is_not_a_regular_file_or_too_big_says_what_it_is(tmp_path, option, kind, run_cli):
    (tmp_path / "t.csv").write_text("job,dram_active\nj,0.5\n")
    name = odd_input(tmp_path, kind)
    argv = [name if a == "IN" else a for a in INPUTS[option]]
    with no_hang():
        line = one_line(run_cli(*argv, cwd=tmp_path), argv[0])
    assert KINDS[kind] in line and f"{name}:" in line, line
    if kind == "sparse 1 GiB":
        assert "MiB limit of an input" in line, line


def test_offer_refuses_an_absurd_job_count_before_making_its_rows(tmp_path, run_cli):
    (tmp_path / "c.csv").write_text(CURVES)
    line = one_line(run_cli("offer", "c.csv", "--job", "a=10000000000", cwd=tmp_path), "offer")
    assert "--job 'a=10000000000': N must be a whole number in 1..100,000" in line, line
    assert run_cli("offer", "c.csv", "--job", "a=3", cwd=tmp_path).returncode == 0


@pytest.mark.parametrize("spec, index", [("0-99999999999", 99999999999), ("0,1024", 1024)])
def test_control_refuses_a_gpu_index_no_node_has_before_expanding_the_range(tmp_path, run_cli, spec, index):
    line = one_line(run_cli("control", "--dry-run", "--budget-w", "500", "--job", spec, cwd=tmp_path), "control")
    assert f"--job {spec!r}: GPU index {index} is over 1023" in line, line


def test_the_sweep_fixture_still_reads(tmp_path, run_cli):
    # the bound is a limit on odd files, not on ordinary ones
    (tmp_path / "s.csv").write_text(SWEEP)
    assert run_cli("pfi", "s.csv", cwd=tmp_path).returncode == 0
