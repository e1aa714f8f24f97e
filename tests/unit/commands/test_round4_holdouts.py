"""Issue 47: the held-back cases of round 4's classes. ``cluster-control`` when ``squeue``
hangs or answers odd JSON (FAKE ``squeue``/``srun``, tests/fakes/fake_slurm.py); odd
``control`` (FAKE NVML, two fake H200s) and ``cluster-control`` option values; DCGM captures
whose clock steps back between scrape files; ``pfi`` and ``run-at-cap`` options that were not
checked; ``/dev/zero`` as a config; an offer from single-point curves."""

from __future__ import annotations

import json
import resource
import subprocess
import sys
import time

import pytest

from tests.fakes import fake_slurm
from tests.fakes.nvml_fixture import fake_nvml, limits_w  # noqa: F401 (fixture)
from tests.unit.commands.test_cluster_control import (  # noqa: F401 (fixture)
    GOOD,
    REPO,
    cluster_control_args,
    cluster_control_process,
    slurm_bin,
)
from tests.unit.commands.test_odd_inputs import no_hang
from tests.unit.ingest.test_dcgm import exporter_capture
from wattflex import cli
from wattflex.ingest.dcgm import read_dcgm_exporter
from wattflex.ops.adapters.slurm import parse_squeue
from wattflex.ops.events import ScheduleError, read_schedule

# ---- cluster-control: squeue hangs or answers odd JSON ---------------------------------------


@pytest.mark.parametrize(
    ("job", "said"),
    [
        (fake_slurm.gpu_job(41, gpus="0-5000"), "GPU index range '0-5000' runs backwards or past"),
        (fake_slurm.gpu_job(41, gpus="3-1"), "GPU index range '3-1' runs backwards"),
        (fake_slurm.gpu_job(41, node="node[0-200000]"), "host range '0-200000'"),
        (fake_slurm.gpu_job(41, node="../../etc"), "'../../etc' is not a host name"),
        (fake_slurm.gpu_job("../41"), "job_id '../41' is not a Slurm job id"),
        (fake_slurm.gpu_job({"set": True, "number": 41}), "is not a Slurm job id"),
    ],
)
def test_a_job_squeue_describes_oddly_is_skipped_and_said(job, said):
    """Before: 5001 GPU indices, no GPU for 3-1 (silently uncontrolled), 200001 host names, a
    unit file named after ../../etc, a job id that is a dict's text."""
    said_to: list[str] = []
    doc = json.loads(fake_slurm.squeue_json(job, fake_slurm.gpu_job(42))["stdout"])
    jobs = parse_squeue(doc, report=said_to.append)
    assert [j.job_id for j in jobs] == ["42"]
    assert len(said_to) == 1 and said in said_to[0], said_to


def test_a_job_listed_twice_is_one_job():
    said_to: list[str] = []
    doc = json.loads(
        fake_slurm.squeue_json(fake_slurm.gpu_job(41), fake_slurm.gpu_job(41, gpus="2-3"))["stdout"]
    )
    (job,) = parse_squeue(doc, report=said_to.append)
    assert job.gpus == {"node0": (0, 1)} and "listed twice" in said_to[0]


def test_a_squeue_that_hangs_is_held_within_the_period(tmp_path, slurm_bin):  # noqa: F811
    """Before: each hung squeue stopped the coordinator for 60 s (and up to 4 tries a period):
    a 2 s run took minutes. Now: bounded, not retried within the period, the jobs held."""
    d = slurm_bin([GOOD, {**GOOD, "sleep": 30}])
    proc = cluster_control_process(cluster_control_args(tmp_path))
    start = time.monotonic()
    try:
        out, err = proc.communicate(timeout=120)
    finally:
        proc.kill()
    took = time.monotonic() - start
    assert proc.returncode == 0 and "Traceback" not in err, err
    assert "answered nothing in 5 s" in out + err
    assert took < 30, took  # 2 s of control, a 5 s bound on the hung call (not 4 x 60 s)
    assert fake_slurm.started(d) == 1


@pytest.mark.parametrize(
    ("option", "value", "said"),
    [
        ("--response-s", "-5", "--response-s"),
        ("--response-s", "nan", "--response-s"),
        ("--duration-s", "1e300", "at most a year"),
    ],
)
def test_odd_cluster_control_values_are_one_line(tmp_path, slurm_bin, option, value, said):  # noqa: F811
    """Before: a negative M&V response time ran (every event 'missed'); 1e300 s overflowed."""
    slurm_bin([GOOD])
    args = cluster_control_args(tmp_path)
    args += [option, value] if option not in args else []
    args[args.index(option) + 1] = value
    proc = cluster_control_process(args)
    try:
        _, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == 2 and err.count("\n") == 1 and said in err, err
    assert not (tmp_path / "b").exists()


def test_an_event_a_lifetime_away_is_refused(tmp_path):
    (tmp_path / "s.csv").write_text("event_id,start_s,end_s,target_kw\ne,0,1e300,1\n")
    with pytest.raises(ScheduleError, match="more than a year"):
        read_schedule(tmp_path / "s.csv")


# ---- control: periods that overflow time_t ---------------------------------------------------


@pytest.mark.fake_gpu
@pytest.mark.parametrize(
    ("option", "value"),
    [
        ("--period-s", "1e300"),
        ("--period-s", "1e7"),
        ("--restore-stagger-s", "1e12"),
        ("--duration-s", "1e300"),
        ("--response-s", "1e300"),
        ("--budget-stale-s", "1e300"),
    ],
)
def test_control_refuses_periods_that_overflow_time_fake_nvml(
    fake_nvml, tmp_path, capsys, option, value
):
    argv = ["control", "--budget-w", "1000", "--state-dir", str(tmp_path / "st")]
    argv += ["--duration-s", "1"] if option != "--duration-s" else []
    with no_hang(20):  # before: a period of 1e300 s slept for ever
        assert cli.main([*argv, option, value]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and f"wattflex control: error: {option} {float(value):g}" in err[0], err
    assert limits_w() == [700.0, 700.0]


# ---- DCGM: a clock that steps back between scrape files --------------------------------------


def test_exporter_scrape_files_whose_clock_steps_back_count_no_instant_twice(tmp_path):
    """Before: the check ran per file; one scrape a file, a step back 15 s kept every sample,
    two samples of a GPU at one instant (the run's power doubled there)."""
    whole = exporter_capture(tmp_path / "all.prom", step_back_s=15.0).read_text()
    scrapes = ["# scrape_time" + s for s in whole.split("# scrape_time")[1:]]
    files = []
    for k, text in enumerate(scrapes):
        files.append(tmp_path / f"s{k:02d}.prom")
        files[-1].write_text(text)
    tel = read_dcgm_exporter(files)
    assert len(tel) == 2 * 9 and not tel.duplicated(["t_s", "node", "gpu"]).any()
    assert (tel.groupby("t_s")["power_w"].sum() == 610).all()
    assert sum("the clock goes back" in n for n in tel.attrs["notes"]) == 3


# ---- options that were not checked ------------------------------------------------------------


@pytest.mark.parametrize(
    "argv",
    [
        ["pfi", "a.csv", "--power-tol", "nan"],
        ["pfi", "a.csv", "--power-tol", "-0.1"],
        ["pfi", "a.csv", "--uncapped-cap-w", "nan"],
        ["pfi", "a.csv", "--uncapped-cap-w", "-700"],
        ["run-at-cap", "spec.json", "out", "--cap-w", "inf"],
    ],
)
def test_unchecked_number_options_are_usage_errors(tmp_path, run_cli, argv):
    """Before: pfi ran with NaN/negative tolerances (every cap 'binding' or none), exit 0."""
    (tmp_path / "a.csv").write_text("group,cap_w,power_w,throughput\na,300,290,80\na,500,450,100\n")
    proc = run_cli(*argv, cwd=tmp_path)
    assert proc.returncode == 2 and f"argument {argv[-2]}" in proc.stderr, proc.stderr


# ---- /dev/zero as a config --------------------------------------------------------------------


def _limited(argv: list[str]) -> subprocess.CompletedProcess:
    """``wattflex ARGV`` in a process held to 4 GiB of memory (reading /dev/zero for ever ran
    the machine out of it before)."""
    code = f"import sys; from wattflex import cli; sys.exit(cli.main({argv!r}))"

    def limit():
        resource.setrlimit(resource.RLIMIT_AS, (4 << 30, 4 << 30))

    return subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=120,
        preexec_fn=limit,
        env={"PYTHONPATH": f"{REPO / 'workflow_scripts'}:{REPO}", "PATH": "/usr/bin:/bin"},
    )


@pytest.mark.parametrize(
    ("argv", "said"),
    [
        (
            ["calibrate", "--published", "table7", "--configfile", "/dev/zero"],
            "/dev/zero: is not a regular file",
        ),
        (
            ["allocate", "c.csv", "--cut", "0.2", "--site", "/dev/zero"],
            "site file /dev/zero: is not a regular file",
        ),
    ],
)
def test_dev_zero_as_a_config_is_one_line(tmp_path, argv, said):
    """Before: calibrate read /dev/zero until the memory ran out; allocate said 'no such file'."""
    (tmp_path / "c.csv").write_text("job,power_w,throughput\nj,300,80\nj,500,100\n")
    argv = [str(tmp_path / a) if a == "c.csv" else a for a in argv]
    proc = _limited(argv)
    assert proc.returncode == 2 and said in proc.stderr, proc.stderr[-500:]
    assert len(proc.stderr.strip().splitlines()) == 1


# ---- an offer from single-point curves --------------------------------------------------------


def test_an_offer_of_single_point_curves_is_refused(tmp_path, run_cli):
    """Before: an offer of 0 kW at every loss level, exit 0."""
    (tmp_path / "one.csv").write_text("job,power_w,throughput,cap_w\nj,500,100,700\nk,400,90,700\n")
    proc = run_cli("offer", "one.csv", cwd=tmp_path)
    assert proc.returncode == 2 and "every job has a single measured point" in proc.stderr
    (tmp_path / "mixed.csv").write_text(
        "job,power_w,throughput,cap_w\nj,500,100,700\nk,300,80,300\nk,500,100,700\n"
    )
    assert run_cli("offer", "mixed.csv", cwd=tmp_path).returncode == 0  # one job can shed
