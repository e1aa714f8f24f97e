"""What the operating system refuses (a read-only or full filesystem, a file where
a folder should be, a name too long), a closed pipe and Ctrl-C end a ``wattflex`` command with
one line naming the path and the cause (exit 2; 130 for Ctrl-C; quiet for a closed pipe), and
an output appears together with its sidecar or not at all.

The filesystem cases mount a small tmpfs of their own (root only: ``.ci/run`` runs as root);
the pair itself is also tested on any filesystem with a writer that fails between the files.
The path cases run the command in this process (``run_cli``, tests/unit/conftest.py); a closed
pipe and Ctrl-C are a process's, so those start one.
"""

from __future__ import annotations

import errno
import os
import signal
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from wattflex.provenance import OutputWriteError, csv_files, provenance, write_csv, write_together

from .test_cli_safety import ALLOC, STATS, SWEEPS

REPO = Path(__file__).resolve().parents[2]
ENV = {**os.environ, "PYTHONPATH": str(REPO / "workflow_scripts")}
WATTFLEX = [sys.executable, "-m", "wattflex.cli"]


def one_line(proc: subprocess.CompletedProcess, command: str) -> str:
    """The error line (the last on stderr; allocate reports its totals before writing)."""
    assert proc.returncode == 2, (proc.returncode, proc.stdout[-500:], proc.stderr[-2000:])
    lines = proc.stderr.strip().splitlines()
    assert "Traceback" not in proc.stderr and lines, proc.stderr[-2000:]
    assert [line for line in lines if "error" in line] == lines[-1:], proc.stderr[-2000:]
    assert lines[-1].startswith(f"wattflex {command}: error: "), lines[-1]
    return lines[-1]


@pytest.fixture
def inputs(tmp_path):
    (tmp_path / "sw.csv").write_text(SWEEPS)
    (tmp_path / "st.csv").write_text(STATS)
    (tmp_path / "cv.csv").write_text(ALLOC)
    return tmp_path


COMMANDS = {  # command line with an output path OUT
    "pfi": ["pfi", "sw.csv", "-o", "OUT"],
    "stats": ["stats", "st.csv", "-o", "OUT"],
    "allocate": ["allocate", "cv.csv", "--cut", "0.2", "-o", "OUT"],
}


def _argv(name: str, out: str) -> list[str]:
    return [out if a == "OUT" else a for a in COMMANDS[name]]


def _left(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir()) if folder.is_dir() else []


# ---- paths the OS refuses, any user --------------------------------------------------------


@pytest.mark.parametrize("command", COMMANDS)
def test_an_output_under_a_file_is_one_line(inputs, command, run_cli):
    (inputs / "afile").write_text("x")
    line = one_line(run_cli(*_argv(command, "afile/out.csv"), cwd=inputs), command)
    assert "afile/out.csv: afile, a folder above the output, is a file" in line, line


@pytest.mark.parametrize("command", COMMANDS)
def test_a_name_too_long_is_one_line(inputs, command, run_cli):
    name = "x" * 300 + ".csv"
    line = one_line(run_cli(*_argv(command, name), cwd=inputs), command)
    assert f"the name {'x' * 40}... is 304 bytes long; this filesystem allows 255" in line, line
    assert not [n for n in _left(inputs) if n.startswith(("x", ".x"))]


# ---- a filesystem of the test's own: read-only, then full (root) ---------------------------


@pytest.fixture
def small_fs(tmp_path):
    """A 256 KiB tmpfs mounted for this test (and unmounted after)."""
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root (.ci/run runs as root)")
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    proc = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=256k", "tmpfs", str(mnt)],
        capture_output=True,
        text=True,
    )
    if proc.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {proc.stderr.strip()}")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False)


def _fill(fs: Path, leave_bytes: int) -> None:
    """Fill ``fs`` until only ``leave_bytes`` (whole pages) are free."""
    st = os.statvfs(fs)
    free = st.f_bavail * st.f_frsize
    with open(fs / "filler", "wb") as fh:
        fh.write(b"\0" * max(0, free - leave_bytes))
    assert os.statvfs(fs).f_bavail * st.f_frsize == leave_bytes


@pytest.mark.parametrize("command", COMMANDS)
def test_a_read_only_filesystem_is_one_line(inputs, small_fs, command, run_cli):
    subprocess.run(["mount", "-o", "remount,ro", str(small_fs)], check=True)
    line = one_line(run_cli(*_argv(command, str(small_fs / "out.csv")), cwd=inputs), command)
    assert (
        f"{small_fs / 'out.csv'}: cannot write into {small_fs} (a read-only file system)" in line
    ), line


@pytest.mark.parametrize("command", COMMANDS)
def test_a_full_filesystem_is_one_line_and_writes_nothing(inputs, small_fs, command, run_cli):
    _fill(small_fs, 0)
    line = one_line(run_cli(*_argv(command, str(small_fs / "out.csv")), cwd=inputs), command)
    assert f"{small_fs / 'out.csv'}" in line and "No space left on device" in line, line
    assert _left(small_fs) == ["filler"]


def test_a_disk_that_fills_between_the_csv_and_its_sidecar_leaves_neither(small_fs):
    """One free page: the CSV (under a page) fits, its sidecar (provenance, ~2 KiB) does not."""
    table = pd.DataFrame({"group": ["a", "b"], "pfi": [1.2, 1.5]})
    _fill(small_fs, os.statvfs(small_fs).f_frsize)
    with pytest.raises(OutputWriteError) as err:
        write_csv(table, small_fs / "pfi.csv", provenance(params={}))
    assert str(err.value).startswith(
        f"{small_fs / 'pfi.csv.meta.json'}: cannot write it: No space left on device"
    )
    assert _left(small_fs) == ["filler"]


# ---- the pair, on any filesystem -------------------------------------------------------------


def _failing(path):
    def write(tmp):
        Path(tmp).write_text("half")
        raise OSError(errno.ENOSPC, "No space left on device")

    return path, write


def test_a_failed_sidecar_keeps_the_old_pair(tmp_path):
    out = tmp_path / "t.csv"
    write_csv(pd.DataFrame({"a": [1]}), out, provenance(params={}))
    before = {p.name: p.read_bytes() for p in tmp_path.iterdir()}
    data, _ = csv_files(pd.DataFrame({"a": [2]}), out, provenance(params={}))
    with pytest.raises(OutputWriteError, match=r"none of its 2 files was written"):
        write_together([data, _failing(f"{out}.meta.json")])
    assert {p.name: p.read_bytes() for p in tmp_path.iterdir()} == before


def test_a_failed_rename_puts_the_set_back(tmp_path, monkeypatch):
    """A rename that fails after the sidecar was renamed: the old sidecar comes back."""
    out = tmp_path / "t.csv"
    write_csv(pd.DataFrame({"a": [1]}), out, provenance(params={}))
    before = {p.name: p.read_bytes() for p in tmp_path.iterdir()}
    real_replace = os.replace

    def replace(src, dst):
        if Path(dst) == out and str(src).endswith(".tmp"):
            raise OSError(errno.EIO, "Input/output error")
        return real_replace(src, dst)

    monkeypatch.setattr(os, "replace", replace)
    with pytest.raises(OutputWriteError, match="t.csv: cannot write it: Input/output error"):
        write_csv(pd.DataFrame({"a": [2]}), out, provenance(params={}))
    monkeypatch.undo()
    assert {p.name: p.read_bytes() for p in tmp_path.iterdir()} == before


# ---- a closed pipe, Ctrl-C ---------------------------------------------------------------------

PIPED = {
    "pfi": ["pfi", "sw.csv"],
    "stats": ["stats", "st.csv"],
    "allocate": ["allocate", "cv.csv", "--cut", "0.2"],
}


@pytest.mark.parametrize("command", PIPED)
def test_a_closed_pipe_exits_quietly(inputs, command):
    """`wattflex ... | head -0`: the reader is gone before the first line is written."""
    reader, writer = os.pipe()
    os.close(reader)  # closed before the command starts: its first write meets EPIPE
    proc = subprocess.run(
        [*WATTFLEX, *PIPED[command]],
        cwd=inputs,
        stdout=writer,
        stderr=subprocess.PIPE,
        text=True,
        env=ENV,
        timeout=300,
    )
    os.close(writer)
    assert proc.returncode == 128 + signal.SIGPIPE, proc.stderr
    assert "Traceback" not in proc.stderr and "BrokenPipe" not in proc.stderr, proc.stderr
    assert "error" not in proc.stderr, proc.stderr


# ``wattflex allocate`` stopped mid-work at a known point: with its curves read, it sleeps at
# the start of the monotone fit (inside allocate_table), where a real SIGINT then lands. The
# pause is this test's, added in the child; the signal, the handler and the exit are the real ones.
PAUSED_ALLOCATE = """
import signal, sys, time
import wattflex.allocation.allocator as allocator

# Ctrl-C as a terminal delivers it to a foreground command: Python's own handler. A child of a
# backgrounded job inherits SIGINT ignored (POSIX: `cmd &` in a non-interactive shell), and
# Python then installs no handler: the signal would be dropped and the test time out.
signal.signal(signal.SIGINT, signal.default_int_handler)

def paused(*args, **kwargs):
    print("paused in monotone_fit", file=sys.stderr, flush=True)
    time.sleep(300)

allocator.monotone_fit = paused
from wattflex.cli import main
sys.exit(main(sys.argv[1:]))
"""


def test_ctrl_c_during_allocate_is_one_line_and_writes_nothing(inputs):
    proc = subprocess.Popen(
        [
            sys.executable,
            "-c",
            PAUSED_ALLOCATE,
            "allocate",
            "cv.csv",
            "--cut",
            "0.3",
            "-o",
            "out.csv",
        ],
        cwd=inputs,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=ENV,
    )
    seen = []
    for line in proc.stderr:  # Ctrl-C once the command has read its input (inside main, mid-work)
        seen.append(line)
        if line.startswith("paused in monotone_fit"):
            break
    assert proc.poll() is None, "".join(seen)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=120)
    err = "".join(seen) + err
    assert proc.returncode == 130, (proc.returncode, err[-2000:])
    assert (
        "Traceback" not in err and err.strip().splitlines()[-1] == "wattflex allocate: interrupted"
    ), err[-2000:]
    assert sorted(_left(inputs)) == ["cv.csv", "st.csv", "sw.csv"]


# ---- an input that is not a regular file says what it is ---------------------------------------

INPUT_COMMANDS = {
    "pfi": ["pfi"],
    "stats": ["stats"],
    "allocate": ["allocate", "--cut", "0.2"],
    "ingest": ["ingest", "sweep-table", "-o", "runs.csv"],
}


@pytest.mark.parametrize("kind", ["folder", "fifo"])
@pytest.mark.parametrize("command", INPUT_COMMANDS)
def test_an_input_that_is_not_a_regular_file_says_what_it_is(tmp_path, command, kind, run_cli):
    if kind == "folder" and command == "ingest":
        pytest.skip("ingest reads a folder of captures (tests/unit/ingest)")
    if kind == "folder":
        (tmp_path / "in").mkdir()
        (tmp_path / "in" / "x.csv").write_text(SWEEPS)
        expected = "in: is a directory, not a file"
    else:
        os.mkfifo(tmp_path / "in")
        expected = "in: is a FIFO (named pipe), not a regular file"
    argv = INPUT_COMMANDS[command]
    argv = [*argv[:2], "in", *argv[2:]] if command == "ingest" else [argv[0], "in", *argv[1:]]
    line = one_line(run_cli(*argv, cwd=tmp_path), command)
    assert expected in line, line
