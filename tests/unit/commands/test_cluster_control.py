"""``wattflex cluster-control`` when SLURM answers badly (FAKE ``squeue`` and ``srun`` on PATH,
tests/fakes/fake_slurm.py: the agents are stand-ins that live their ``--duration-s``). A
``squeue`` that fails, at the start or mid-event, is retried then held (the last known jobs
keep their shares); a document that is no job list counts as a failure; a job described
badly is skipped with a report and the others followed. Whatever happens, every agent gets
the last word (restore) and no traceback is printed; a SIGTERM mid-event restores too."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.fakes import fake_slurm
from tests.fakes.fake_slurm import gpu_job, squeue_json
from wattflex import cli

PERIOD_S = 0.2
GOOD = squeue_json(gpu_job(41))
FAIL = {
    "rc": 1,
    "stderr": "squeue: error: slurm_load_jobs error: Socket timed out on send/recv operation\n",
}
REPO = Path(__file__).resolve().parents[3]


@pytest.fixture
def slurm_bin(tmp_path, monkeypatch):
    def put(answers):
        d = fake_slurm.install(tmp_path / "bin", answers)
        monkeypatch.setenv("PATH", f"{d}{os.pathsep}{os.environ['PATH']}")
        return d

    return put


def cluster_control_args(tmp_path, duration_s=2.0, end_s=1.5):
    sig = tmp_path / "ev.csv"
    sig.write_text(f"event_id,start_s,end_s,fraction\nev,0.5,{end_s},0.7\n")
    return [
        "cluster-control",
        "--signal",
        str(sig),
        "--budget-dir",
        str(tmp_path / "b"),
        "--basis",
        "nominal",
        "--period-s",
        str(PERIOD_S),
        "--duration-s",
        str(duration_s),
    ]


def last_word(tmp_path, unit="41.node0"):
    return json.loads((tmp_path / "b" / f"{unit}.budget.json").read_text())


@pytest.mark.parametrize(
    "answers, said",
    [
        ([FAIL], "SLURM failed"),  # from the start
        ([GOOD] * 4 + [FAIL], "SLURM failed"),  # mid-event
        ([GOOD, {"stdout": "[]"}], "no job list"),
        ([GOOD, {"stdout": json.dumps({"jobs": {"41": gpu_job(41)}})}], "no job list"),
        ([GOOD, {"stdout": "not json"}], "no JSON"),
        (
            [
                squeue_json(
                    gpu_job(41),
                    {
                        "name": "x",
                        "job_state": "RUNNING",
                        "nodes": "node1",
                        "gres_detail": ["gpu:1(IDX:0)"],
                    },
                )
            ],
            "job #1 skipped",
        ),
        ([squeue_json(gpu_job(41), gpu_job(42, gres_detail="gpu:1(IDX:0)"))], "job 42 skipped"),
        (
            [
                squeue_json(
                    gpu_job(41), {k: v for k, v in gpu_job(43).items() if k != "gres_detail"}
                )
            ],
            "job 43 skipped: cannot read it (no gres_detail",
        ),
    ],
)
def test_a_slurm_that_fails_or_answers_badly_is_held_and_every_agent_restored(
    tmp_path, slurm_bin, capsys, answers, said
):
    d = slurm_bin(answers)
    assert cli.main(cluster_control_args(tmp_path)) == 0
    out, err = capsys.readouterr()
    assert "Traceback" not in err and said in out + err
    assert (out + err).count(said) == 1  # said once, not every period
    if answers[0] is not FAIL:
        assert fake_slurm.started(d) == 1 and last_word(tmp_path)["budget_w"] is None
    else:
        assert fake_slurm.started(d) == 0  # no job known: nothing started
    assert int((d / "squeue.calls").read_text()) > 2


def test_a_held_job_keeps_its_share_while_squeue_fails_mid_event(
    tmp_path, slurm_bin, capsys, monkeypatch
):
    from wattflex.ops.services import coordinator

    shares = []
    write = coordinator.coordinate_once
    monkeypatch.setattr(
        coordinator,  # where the coordinator's loop looks it up
        "coordinate_once",
        lambda jobs, budget, *a, **k: (
            shares.append((len(jobs), budget)) or write(jobs, budget, *a, **k)
        ),
    )
    slurm_bin([GOOD] * 2 + [FAIL])
    assert cli.main(cluster_control_args(tmp_path)) == 0
    assert shares[-1] == (1, float("inf"))  # the last word: restore
    in_event = [n for n, b in shares[:-1] if b < float("inf")]
    assert in_event and set(in_event) == {1}  # the job held through the event


def cluster_control_process(args, **kw):
    """``wattflex cluster-control ARGS`` in its own process (a signal to it is not one to pytest)."""
    code = f"import sys; from wattflex import cli; sys.exit(cli.main({args!r}))"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO / "workflow_scripts"), str(REPO)])}
    return subprocess.Popen(
        [sys.executable, "-c", code],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        **kw,
    )


def test_a_sigterm_mid_event_restores_every_agent_and_stops_them(tmp_path, slurm_bin):
    d = slurm_bin([GOOD])
    proc = cluster_control_process(cluster_control_args(tmp_path, 60.0, 55.0))
    deadline = time.time() + 30
    while time.time() < deadline and not (
        fake_slurm.started(d)
        and (tmp_path / "b" / "41.node0.budget.json").exists()
        and last_word(tmp_path)["budget_w"] is not None
    ):
        time.sleep(0.05)
    assert last_word(tmp_path)["budget_w"] is not None  # mid-event, the agent given its share
    t_sent = time.time()
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 128 + signal.SIGTERM and "Traceback" not in err
    assert (
        last_word(tmp_path)["budget_w"] is None and last_word(tmp_path)["hold_until_unix"] is None
    )
    assert (
        fake_slurm.terminated(d) == 1 and time.time() - t_sent < 30
    )  # stopped soon, not at the planned end


@pytest.mark.parametrize(
    "option, value",
    [
        ("--period-s", "1e308"),
        ("--period-s", "1e9"),
        ("--duration-s", "nan"),
        ("--duration-s", "-5"),
    ],
)
def test_out_of_range_periods_and_durations_are_one_line(tmp_path, slurm_bin, option, value):
    slurm_bin([GOOD])
    args = cluster_control_args(tmp_path)
    args[args.index(option) + 1] = value
    proc = cluster_control_process(args)
    try:  # (before the range check, 1e308 s slept for ever)
        _, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert (
        proc.returncode == 2 and err.count("\n") == 1 and option in err and "Traceback" not in err
    )
    assert not (tmp_path / "b").exists()


@pytest.mark.parametrize(
    "content, words", [(None, "No such file"), ("job,action\n1,pause\n", "needs column(s) knob")]
)
def test_a_bad_knob_choice_is_one_line_before_anything_starts(tmp_path, slurm_bin, content, words):
    slurm_bin([GOOD])
    choice = tmp_path / "choice.csv"
    if content is not None:
        choice.write_text(content)
    proc = cluster_control_process(cluster_control_args(tmp_path) + ["--knob-choice", str(choice)])
    try:
        _, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert (
        proc.returncode == 2 and "--knob-choice" in err and words in err and "Traceback" not in err
    ), err
    assert not (tmp_path / "b").exists()
