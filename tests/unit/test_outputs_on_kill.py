"""Nothing lost, nothing stale, on a kill (issue 47, "Reliability classes"): a sidecar carries
its output's sha256 and every reader checks it, so an output and a sidecar that disagree after
a SIGKILL between the two renames are told apart; a write fsyncs the file and the folder
around the rename; a companion another command left beside a new output is removed. The kill
is a real SIGKILL of a real ``wattflex`` process."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from wattflex.provenance import StaleSidecarError, artifact_meta, read_csv, write_csv

SWEEPS = "group,cap_w,power_w,throughput\n{g},300,290,80\n{g},400,380,95\n{g},500,450,100\n"

STATS_TABLE = (
    "group,cluster,pfi_ratio\na,dense,1\nb,dense,2\nc,dense,3\nd,moe-pt,4\ne,moe-pt,5\nf,moe-pt,6\n"
)

# `wattflex ARGV`, SIGKILLed by itself the moment its sidecar has landed (before its CSV).
KILLED_BETWEEN_RENAMES = r"""
import os, signal, sys, json
from wattflex.cli import main
real_replace = os.replace
def replace(src, dst):
    real_replace(src, dst)
    if str(dst).endswith(".meta.json"):
        os.kill(os.getpid(), signal.SIGKILL)
os.replace = replace
sys.exit(main(json.loads(sys.argv[1])))
"""


def _killed_pfi(tmp_path: Path, run_cli) -> Path:
    """out.csv holds a.csv's PFI; a second pfi (of b.csv) is killed between its renames."""
    for g in "ab":
        (tmp_path / f"{g}.csv").write_text(SWEEPS.format(g=g))
    argv = ["pfi", "{}.csv", "--mc-samples", "0", "-o", "out.csv"]
    assert run_cli(*[a.format("a") for a in argv], cwd=tmp_path).returncode == 0
    proc = subprocess.run(
        [sys.executable, "-c", KILLED_BETWEEN_RENAMES, json.dumps([a.format("b") for a in argv])],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == -9, proc.stderr
    assert set(pd.read_csv(tmp_path / "out.csv")["group"]) == {"a"}  # the old CSV
    assert (
        "b.csv" in json.loads((tmp_path / "out.csv.meta.json").read_text())["provenance"]["inputs"]
    )
    return tmp_path / "out.csv"


def test_a_sidecar_left_by_a_kill_between_the_renames_is_told_from_the_csv(tmp_path, run_cli):
    """Before: out.csv held a.csv's PFI under a sidecar naming b.csv, and every reader took it."""
    out = _killed_pfi(tmp_path, run_cli)
    with pytest.raises(StaleSidecarError, match=r"out\.csv: its sidecar .* describes another file"):
        read_csv(out)
    assert artifact_meta(out) is None  # no provenance rather than another file's
    # a command reading it as an input says so in one line (offer reads a PFI table)
    proc = run_cli("offer", "out.csv", cwd=tmp_path)
    assert proc.returncode == 2 and "describes another file" in proc.stderr, proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    # as does one that reads any table (stats), and the sweep reader (pfi of the pfi table)
    proc = run_cli("stats", "out.csv", cwd=tmp_path)
    assert proc.returncode == 2 and "describes another file" in proc.stderr, proc.stderr


def test_the_sidecar_carries_the_sha256_of_what_lies_beside_it(tmp_path, run_cli):
    (tmp_path / "a.csv").write_text(SWEEPS.format(g="a"))
    assert run_cli("pfi", "a.csv", "--mc-samples", "0", "-o", "o.csv", cwd=tmp_path).returncode == 0
    doc = json.loads((tmp_path / "o.csv.meta.json").read_text())
    assert doc["sha256"] == hashlib.sha256((tmp_path / "o.csv").read_bytes()).hexdigest()
    assert read_csv(tmp_path / "o.csv")["group"].tolist() == ["a"]
    # a file edited by hand after the fact is no longer its sidecar's
    with open(tmp_path / "o.csv", "a") as fh:
        fh.write("b,1,1,1\n")
    with pytest.raises(StaleSidecarError):
        read_csv(tmp_path / "o.csv")


def test_a_write_fsyncs_the_file_and_the_folder_around_the_rename(tmp_path, monkeypatch):
    """Before: no fsync at all; a power cut after "written" could leave an empty CSV."""
    synced: list[str] = []
    real_fsync = os.fsync

    def fsync(fd):
        synced.append(os.readlink(f"/proc/self/fd/{fd}"))
        return real_fsync(fd)

    real_replace = os.replace
    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(
        os, "replace", lambda s, d: (synced.append(f"rename {Path(d).name}"), real_replace(s, d))
    )
    write_csv(pd.DataFrame({"x": [1]}), tmp_path / "t.csv")
    folder = str(tmp_path)
    renames = [i for i, s in enumerate(synced) if s.startswith("rename ")]
    before, after = synced[: renames[0]], synced[renames[-1] + 1 :]
    assert sum(Path(s).name.startswith(".t.csv.") for s in before) == 2, synced  # both temp files
    assert folder in before and folder in after, synced


@pytest.mark.parametrize("companion", [".meta.json", ".totals.json"])
def test_a_companion_another_command_left_is_removed_with_a_new_output(
    tmp_path, run_cli, companion
):
    """Before: `allocate -o x.csv` then `pfi -o x.csv` left allocate's x.csv.totals.json beside
    the PFI table; `pfi -o x.csv` then `stats -o x.csv` left the PFI sidecar describing the JSON."""
    (tmp_path / "a.csv").write_text(SWEEPS.format(g="a"))
    curves = "job,power_w,throughput\nj,300,80\nj,500,100\n"
    (tmp_path / "curves.csv").write_text(curves)
    if companion == ".totals.json":
        first = ["allocate", "curves.csv", "--budget-w", "400", "-o", "x.csv"]
        second = ["pfi", "a.csv", "--mc-samples", "0", "-o", "x.csv"]
    else:
        first = ["pfi", "a.csv", "--mc-samples", "0", "-o", "x.csv"]
        (tmp_path / "t.csv").write_text(STATS_TABLE)
        second = ["stats", "t.csv", "-o", "x.csv"]
    assert run_cli(*first, cwd=tmp_path).returncode == 0
    assert (tmp_path / f"x.csv{companion}").exists()
    proc = run_cli(*second, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert not (tmp_path / f"x.csv{companion}").exists(), sorted(os.listdir(tmp_path))


def test_a_kill_leaves_no_stale_companion_unnoticed(tmp_path, monkeypatch):
    """A write killed after its renames but before removing the old companion: the companion's
    hash names the old file, so it is not taken for the new one's."""
    import wattflex.provenance as prov

    write_csv(pd.DataFrame({"x": [1]}), tmp_path / "t.csv")
    monkeypatch.setattr(prov, "_remove_stale_companions", lambda paths: None)
    prov.write_json({"y": 2}, tmp_path / "t.csv")  # the same name, another kind of output
    assert artifact_meta(tmp_path / "t.csv") is None


WRITE_AS_NOBODY = r"""
import pandas as pd, sys
from wattflex.provenance import write_csv
write_csv(pd.DataFrame({"x": [1]}), sys.argv[1])
"""


@pytest.mark.skipif(os.geteuid() != 0, reason="plants a folder for another uid (setpriv)")
def test_a_folder_one_may_write_but_not_list_still_takes_an_output():
    """The fsync of the folder needs it opened for reading: a user writing into a -wx folder
    (mode 0733, not theirs) must still get the output, the folder's sync passed over."""
    import shutil
    import tempfile

    folder = Path(tempfile.mkdtemp(prefix="wattflex-drop-", dir="/tmp"))  # pytest's are 0700
    folder.chmod(0o733)
    try:
        _write_as_nobody(folder)
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def _write_as_nobody(folder: Path) -> None:
    """write_csv into ``folder`` as uid 65534, then the output read back as root."""
    proc = subprocess.run(
        [
            "setpriv",
            "--reuid",
            "65534",
            "--regid",
            "65534",
            "--clear-groups",
            sys.executable,
            "-c",
            WRITE_AS_NOBODY,
            str(folder / "t.csv"),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        env={"PYTHONPATH": os.environ.get("PYTHONPATH", ""), "PATH": "/usr/bin:/bin"},
    )
    assert proc.returncode == 0, proc.stderr
    assert (folder / "t.csv").stat().st_uid == 65534
    assert read_csv(folder / "t.csv")["x"].tolist() == [1]
