"""The CLI never writes into a measured run and does not race itself. ``run-at-cap``
claims OUTDIR in one step at the end (a run that landed there meanwhile is kept, as is this
one); no command's output lies in a measured run, not even through a symlinked folder; two
commands writing one output at once leave a CSV and sidecar that belong together, and a
sidecar takes its CSV's mode. The races run as real processes started at once."""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest

from tests.unit.commands.test_calibrate import _gemm_reading
from tests.unit.test_entry_points import spec  # noqa: F401  (the run spec fixture)

COMMANDS = Path(__file__).resolve().parents[3] / "workflow_scripts" / "wattflex" / "commands"
SWEEPS = "group,cap_w,power_w,throughput\n{g},300,290,80\n{g},400,380,95\n{g},500,450,100\n"
MEASURED = json.dumps({"run_id": "cap700", "provenance": {"backend": "cuda"}})

# One process of a race: loads the command first, says it is ready, waits for the gate file,
# then runs `wattflex ARGV` (after DELAY s). PAUSE > 0 stands for a slow filesystem: that long
# between a set's sidecar landing and its CSV landing (the window two writers can interleave in).
RACER = r"""
import json, os, sys, time
from wattflex.cli import main
import wattflex.commands.pfi, wattflex.pfi, wattflex.runs.runner, pandas
gate, job = sys.argv[1], json.loads(sys.argv[2])
if job["pause"]:
    real_replace = os.replace
    def replace(src, dst):
        real_replace(src, dst)
        if str(dst).endswith(".meta.json"):
            time.sleep(job["pause"])
    os.replace = replace
open(f"{gate}.ready.{os.getpid()}", "w").close()
while not os.path.exists(gate):
    time.sleep(0.005)
time.sleep(job["delay"])
sys.exit(main(job["argv"]))
"""


def run_at_once(cwd: Path, jobs: list[dict]) -> list[subprocess.CompletedProcess]:
    """``jobs`` (``{"argv", "delay", "pause"}``) as processes that all start their command at once."""
    gate = cwd / "gate"
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", RACER, str(gate), json.dumps({"delay": 0, "pause": 0, **j})],
            cwd=cwd,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for j in jobs
    ]
    deadline = time.monotonic() + 120
    while len(list(cwd.glob("gate.ready.*"))) < len(jobs) and time.monotonic() < deadline:
        assert all(p.poll() is None for p in procs), [p.communicate() for p in procs]
        time.sleep(0.02)
    gate.touch()
    return [subprocess.CompletedProcess(p.args, p.wait(120), *p.communicate()) for p in procs]


def measured_run(tmp_path: Path) -> Path:
    run_dir = tmp_path / "results" / "c" / "runs" / "g" / "cap700"
    run_dir.mkdir(parents=True)
    (run_dir / "run.json").write_text(MEASURED)
    (run_dir / "train.log").write_text("the measured run's log\n")
    return run_dir


def files_of(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in folder.iterdir()}


# --- run-at-cap claims OUTDIR only if nothing landed there during the run -----------------


def test_run_at_cap_keeps_a_measured_run_that_lands_in_outdir_during_the_run(
    tmp_path, spec, run_cli, monkeypatch
):
    """Before: the measured run was replaced by this emulated one, exit 0."""
    import wattflex.runs.runner as runner

    out = tmp_path / "out"
    emulate = runner.run_emulated_tables

    def run_while_a_measured_run_lands(s):
        out.mkdir()
        (out / "run.json").write_text(MEASURED)
        return emulate(s)

    monkeypatch.setattr(runner, "run_emulated_tables", run_while_a_measured_run_lands)
    (tmp_path / "spec.json").write_text(json.dumps(spec))
    proc = run_cli("run-at-cap", "spec.json", "out", cwd=tmp_path)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    assert (
        "out: OUTDIR was filled while this run ran: run.json; left it as it is. This run is kept in"
        in proc.stderr
    )
    assert files_of(out) == {"run.json": MEASURED.encode()}
    kept = Path(proc.stderr.split("This run is kept in ")[1].split(":")[0])
    assert json.loads((kept / "run.json").read_text())["provenance"]["backend"] == "emulated"


def test_two_run_at_cap_into_one_new_outdir_one_wins_and_no_run_is_lost(tmp_path, spec):
    """Before: both exited 0, and the first run was silently replaced by the second."""
    for cap in (400, 500):
        (tmp_path / f"spec{cap}.json").write_text(json.dumps({**spec, "cap_w": cap}))
    procs = run_at_once(
        tmp_path, [{"argv": ["run-at-cap", f"spec{cap}.json", "out"]} for cap in (400, 500)]
    )
    assert sorted(p.returncode for p in procs) == [0, 2], [(p.returncode, p.stderr) for p in procs]
    winner, loser = sorted(procs, key=lambda p: p.returncode)
    won_cap = json.loads((tmp_path / "out" / "run.json").read_text())["cap_w"]
    assert f"spec{won_cap:.0f}.json" in winner.args[-1]
    assert (
        "OUTDIR was filled while this run ran" in loser.stderr and "Traceback" not in loser.stderr
    )
    kept = Path(tmp_path, loser.stderr.split("This run is kept in ")[1].split(":")[0])
    assert json.loads((kept / "run.json").read_text())["cap_w"] == 900 - won_cap


def test_run_at_cap_refuses_an_outdir_inside_a_measured_run_or_a_link(tmp_path, spec, run_cli):
    run_dir = measured_run(tmp_path)
    before = files_of(run_dir)
    (tmp_path / "spec.json").write_text(json.dumps(spec))
    (tmp_path / "empty").mkdir()
    os.symlink(tmp_path / "empty", tmp_path / "link")
    proc = run_cli("run-at-cap", "spec.json", run_dir / "sub", cwd=tmp_path)
    assert proc.returncode == 2 and f"OUTDIR lies in the measured run {run_dir}" in proc.stderr, (
        proc.stderr
    )
    proc = run_cli("run-at-cap", "spec.json", "link", cwd=tmp_path)
    assert proc.returncode == 2 and "link: OUTDIR is a symbolic link" in proc.stderr, proc.stderr
    assert files_of(run_dir) == before and not list((tmp_path / "empty").iterdir())


# --- no command writes into a measured run ------------------------------------------------


@pytest.mark.parametrize(
    "argv",
    [
        ["pfi", "sw.csv", "-o", "link/summary.json"],
        ["pfi", "sw.csv", "-o", "link/new/pfi.csv"],
        ["stats", "st.csv", "-o", "link/stats.json"],
        ["allocate", "cv.csv", "--cut", "0.3", "-o", "results/c/runs/g/cap700/run.json"],
        ["ingest", "sweep-table", "sw.csv", "-o", "link/runs.parquet"],
        ["offer", "cv.csv", "-o", "results/c/runs/g/cap700/offer.csv"],
        ["calibrate", "--gpu-check", "check.json", "-o", "link/cal.json"],
    ],
    ids=lambda a: f"{a[0]} -o {a[-1]}",
)
def test_no_command_writes_into_a_measured_run(tmp_path, run_cli, argv):
    """Before: pfi wrote through the link, allocate replaced the run's run.json (exit 0)."""
    run_dir = measured_run(tmp_path)
    os.symlink(run_dir, tmp_path / "link")
    (tmp_path / "sw.csv").write_text(SWEEPS.format(g="a"))
    (tmp_path / "st.csv").write_text(
        "group,cluster,pfi_ratio\ng1,dense,1.2\ng2,dense,1.4\ng3,moe,2.0\ng4,moe,2.5\n"
    )
    (tmp_path / "cv.csv").write_text("job,power_w,throughput\nj1,300,80\nj1,400,95\nj1,500,100\n")
    (tmp_path / "check.json").write_text(
        json.dumps({"steps": {"anchor_gemm": _gemm_reading(1740.0, 0.62)}})
    )
    before = files_of(run_dir)
    proc = run_cli(*argv, cwd=tmp_path)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    assert f"lies in the measured run {run_dir}" in proc.stderr and "backend cuda" in proc.stderr, (
        proc.stderr
    )
    assert files_of(run_dir) == before


def test_control_refuses_an_mv_folder_in_a_measured_run_before_making_it(tmp_path):
    """``control`` and ``cluster-control --mv-out``: checked before any cap is set or folder made."""
    from wattflex.commands.control import check_mv_dir
    from wattflex.provenance import OutputPathError

    run_dir = measured_run(tmp_path)
    with pytest.raises(OutputPathError, match="--mv-out lies in the measured run"):
        check_mv_dir(run_dir / "mv")
    assert not (run_dir / "mv").exists()


def test_every_command_checks_its_outputs_with_the_measured_run_check():
    """The core's check_outputs cannot know measured runs (the workflow writes their
    summary.json); a command that imported it directly would skip the check."""
    direct = []
    for path in sorted(set(COMMANDS.glob("*.py")) - {COMMANDS / "_outputs.py"}):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module == "wattflex.provenance":
                direct += [
                    f"{path.name}: {a.name}"
                    for a in node.names
                    if a.name in ("check_outputs", "check_writable")
                ]
    assert not direct, direct


# --- an output and its sidecar belong together ----------------------------------------------


def test_two_pfi_into_one_output_leave_a_csv_with_its_own_sidecar(tmp_path):
    """Before: A's sidecar landed, B's sidecar and CSV landed, then A's CSV: a.csv's groups
    under a sidecar naming b.csv."""
    for g in "ab":
        (tmp_path / f"{g}.csv").write_text(SWEEPS.format(g=g))
    argv = ["pfi", "{}.csv", "--mc-samples", "0", "-o", "out.csv"]
    procs = run_at_once(
        tmp_path,
        [
            {"argv": [a.format("a") for a in argv], "pause": 1.0},
            {"argv": [a.format("b") for a in argv], "delay": 0.3},
        ],
    )
    assert [p.returncode for p in procs] == [0, 0], [p.stderr for p in procs]
    groups = set(pd.read_csv(tmp_path / "out.csv")["group"])
    sidecar = json.loads((tmp_path / "out.csv.meta.json").read_text())
    assert [f"{g}.csv" for g in sorted(groups)] == list(sidecar["provenance"]["inputs"]), (
        groups,
        sidecar,
    )


def test_a_sidecar_takes_the_mode_of_its_output(tmp_path, run_cli):
    """Before: replacing a 0600 out.csv kept it 0600, but its sidecar stayed 0644."""
    (tmp_path / "sw.csv").write_text(SWEEPS.format(g="a"))
    argv = ["pfi", "sw.csv", "--mc-samples", "0", "-o", "out.csv"]
    assert run_cli(*argv, cwd=tmp_path).returncode == 0
    os.chmod(tmp_path / "out.csv", 0o600)
    assert run_cli(*argv, cwd=tmp_path).returncode == 0
    assert {(tmp_path / f).stat().st_mode & 0o777 for f in ("out.csv", "out.csv.meta.json")} == {
        0o600
    }
