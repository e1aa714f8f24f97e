"""The command launch (wattflex.runs.command_run): a real, unmodified CPU training script
(tests/data/own_job/train_tiny_lm.py, a plain torch loop logging torchtitan-style lines) run
at a cap on FAKE NVML GPUs (tests/fakes/fake_pynvml.py, the only fake). A command that exits
non-zero, hangs past its limit or prints no throughput line fails with an error that says
which, its processes gone and the caps restored."""

import os
import sys
from pathlib import Path

import pytest

from tests.fakes.nvml_fixture import fake_nvml, limits_w  # noqa: F401 (fixture)
from tests.unit.runs.test_real_run import cuda_spec
from wattflex.provenance import read_json, read_parquet
from wattflex.runs import command_run
from wattflex.runs.command_run import CommandError, fill, program_path, run_command
from wattflex.runs.protection import holds_real_run
from wattflex.runs.runner import run_at_cap

OWN_JOB = Path(__file__).resolve().parents[2] / "data" / "own_job" / "train_tiny_lm.py"
pytestmark = pytest.mark.fake_gpu


def command_spec(tmp_path, *args, grace_s=60, throughput=None, **cuda):
    spec = cuda_spec(
        tmp_path,
        model="Llama-3.1-70B",
        task="pt",
        cap_control="nvml",
        sampler=True,
        sampler_period_s=0.1,
        **cuda,
    )
    spec["run"]["duration_s"] = 60
    spec["group"]["gpus"] = 2
    spec["group"]["command"] = {
        "launch": [
            sys.executable,
            str(OWN_JOB),
            "--steps",
            "30",
            "--batch",
            "8",
            "--seq",
            "64",
            *args,
        ],
        "throughput": throughput or {"preset": "torchtitan"},
        "env": {"OWN_JOB_RUN_DIR": "{run_dir}"},
        "grace_s": grace_s,
    }
    return spec


def no_process_left(tmp_path):
    """No process of this test's command is alive (found by the run directory in its environment)."""
    import psutil

    left = []
    for proc in psutil.process_iter():
        try:
            if (
                proc.environ().get("OWN_JOB_RUN_DIR", "").startswith(str(tmp_path))
                and proc.status() != psutil.STATUS_ZOMBIE
            ):
                left.append(proc.pid)
        except psutil.Error:
            pass
    return not left


@pytest.mark.slow
def test_fake_nvml_own_script_runs_capped_and_its_tps_lines_become_steps(fake_nvml, tmp_path):
    out = run_at_cap(command_spec(tmp_path, "--eval-freq", "10"), tmp_path / "run")
    assert sorted(p.name for p in out.iterdir()) == [
        "run.json",
        "steps.parquet",
        "telemetry.parquet",
        "train.log",
    ]
    log = (out / "train.log").read_text()
    logged = {
        int(line.split("step:")[1].split()[0]): float(
            line.split("tps: ")[1].split()[0].replace(",", "")
        )
        for line in log.splitlines()
        if "tps: " in line
    }
    assert sorted(logged) == list(range(1, 31))
    steps = read_parquet(out / "steps.parquet")
    assert steps["step"].iloc[-1] == 30 and steps["step"].is_monotonic_increasing
    # Lines read in one poll are one row (how many depends on the machine's timing): every row's
    # rate is its lines' job rates (tps per GPU x 2 GPUs) combined over their tokens.
    rate = steps["tokens"] / steps["t_end_s"].diff()
    first = steps["step"].shift(1)
    for prev, step, r in zip(first.iloc[1:], steps["step"].iloc[1:], rate.iloc[1:]):
        lines = range(int(prev) + 1, int(step) + 1)
        assert r == pytest.approx(len(lines) / sum(1 / (2 * logged[k]) for k in lines))
    run = read_json(out / "run.json")
    assert (
        run["backend"] == "cuda"
        and run["launch"] == "command"
        and run["provenance"]["backend"] == "cuda"
    )
    assert run["training"]["command"][1] == str(OWN_JOB) and run["training"]["exit_status"] == 0
    assert (
        run["training"]["throughput"]["source"] == "preset torchtitan"
        and run["training"]["lines_matched"] == 30
        and len(steps) >= 2
    )
    assert run["training"]["command_env"]["OWN_JOB_RUN_DIR"] == str(tmp_path / "run") or run[
        "training"
    ]["command_env"]["OWN_JOB_RUN_DIR"].startswith(str(tmp_path / ".run."))
    assert run["enforced_limit_w"] == [400.0, 400.0] and limits_w() == [700.0, 700.0]
    assert holds_real_run(out)  # protected as a harness run (backend cuda)
    tel = read_parquet(out / "telemetry.parquet")
    assert (tel["power_limit_w"] == 400.0).all() and run["telemetry"]["source"] == "nvml"
    assert steps["t_end_s"].iloc[-1] <= tel["t_s"].max() + 1.0  # one clock for both


@pytest.mark.slow
@pytest.mark.parametrize(
    "args, grace_s, throughput, message",
    [
        (
            ("--fail-at", "5"),
            60,
            None,
            r"(?s)the command exited with status 1.*simulated failure at step 5",
        ),
        (("--hang-at", "3"), -57, None, "the command ran past its time limit of 3 s"),
        (
            ("--quiet",),
            60,
            None,
            "the command printed no throughput line: none of its 2 output lines matched "
            "preset torchtitan",
        ),
        ((), 60, {"steps_file": "steps.csv"}, "wrote no step to its steps file"),
    ],
)
def test_fake_nvml_failed_command_says_which_and_restores(
    fake_nvml, tmp_path, args, grace_s, throughput, message
):
    spec = command_spec(tmp_path, *args, grace_s=grace_s, throughput=throughput)
    with pytest.raises(CommandError, match=message):
        run_command(spec, tmp_path / "run")
    assert limits_w() == [700.0, 700.0]
    assert [c[1] for c in fake_nvml.state()["set_calls"]] == [400_000, 400_000, 700_000, 700_000]
    assert not list((tmp_path / "state").glob("caps-*.json"))
    assert no_process_left(tmp_path)


def test_fake_nvml_missing_program_fails_before_any_cap(fake_nvml, tmp_path):
    spec = command_spec(tmp_path)
    spec["group"]["command"]["launch"] = ["no-such-trainer-xyz", "--steps", "3"]
    with pytest.raises(
        FileNotFoundError, match=r"launch\[0\]: program 'no-such-trainer-xyz' not found"
    ):
        run_command(spec, tmp_path / "run")
    assert fake_nvml.state()["set_calls"] == []


def test_fill_placeholders_and_refuse_unknown_ones():
    values = command_run.placeholders(
        {
            "group": {"id": "g", "gpus": 8},
            "cap_w": 450.0,
            "seed": 1,
            "run": {"duration_s": 600},
            "cuda": {"nproc_per_node": 8},
        },
        Path("/r"),
    )
    assert fill(
        ["--ngpu={gpus}", "{run_dir}/out", "{cap_w}", "{duration_s}", "{nproc_per_node}"], values
    ) == ["--ngpu=8", "/r/out", "450", "600", "8"]
    with pytest.raises(
        ValueError, match=r"command.launch\[1\] '\{steps\}': unknown placeholder \{steps\}"
    ):
        fill(["a", "{steps}"], values)


def test_program_path(tmp_path):
    assert program_path("sh") == os.path.realpath(program_path("sh")) or program_path("sh")
    assert program_path(sys.executable) == sys.executable
    assert (
        program_path(str(tmp_path / "nope")) is None and program_path("no-such-trainer-xyz") is None
    )


def test_doctor_checks_each_groups_command_program(tmp_path):
    from wattflex import diagnosis
    from wattflex.config import load_config

    cfg = load_config(Path(__file__).resolve().parents[3] / "config" / "config.yaml")
    own = {"launch": [sys.executable, str(OWN_JOB)], "throughput": {"preset": "torchtitan"}}
    gone = {**own, "launch": ["no-such-trainer-xyz"]}
    cfg = {
        **cfg,
        "backend": "cuda",
        "cuda": {**cfg["cuda"], "cap_control": "observe", "sampler": False},
        "groups": [
            {**cfg["groups"][0], "command": own},
            {**cfg["groups"][1], "id": "other", "command": gone},
        ],
    }
    found = {
        "nvml": {"available": True, "error": None, "gpus": [{"name": "NVIDIA H200"}]},
        "torch": {
            "version": "2.x",
            "built_with_cuda": "12.8",
            "cuda_available": True,
            "device_count": 1,
            "devices": [],
        },
        "cap_permission": {"likely": True, "basis": "test"},
    }
    c = diagnosis.check_config(cfg, found)
    assert f"group {cfg['groups'][0]['id']}'s command program" in c["needs"]
    assert [m["need"] for m in c["missing"]] == ["group other's command program"]
    assert "'no-such-trainer-xyz' not found" in c["missing"][0]["detail"]


def test_config_check_refuses_a_bad_command_naming_the_group(tmp_path):
    from wattflex.config import ConfigError
    from wattflex.runs.campaign_checks import check_commands

    group = {"id": "g", "gpus": 2, "seq_len": 64}
    check_commands(
        [
            {
                **group,
                "command": {"launch": ["trainer", "--n={gpus}"], "throughput": {"preset": "nemo"}},
            }
        ]
    )
    with pytest.raises(
        ConfigError, match=r"group g: command.launch\[1\] '\{ngpu\}': unknown placeholder"
    ):
        check_commands(
            [{**group, "command": {"launch": ["t", "{ngpu}"], "throughput": {"preset": "nemo"}}}]
        )
    with pytest.raises(
        ConfigError, match="group g: command.throughput.preset: unknown preset 'titan'"
    ):
        check_commands([{**group, "command": {"launch": ["t"], "throughput": {"preset": "titan"}}}])


@pytest.mark.slow
def test_fake_nvml_staircase_steps_the_own_scripts_caps_in_one_run_and_stops_it(
    fake_nvml, tmp_path
):
    from tests.unit.runs.sweep.test_sweep_real import CAPS, set_calls_w, sweep_spec
    from wattflex.runs.sweep.real import write_real_sweep_run

    spec = sweep_spec(tmp_path, "staircase")
    # Far more steps than the staircase needs: the sweep stops the script when it is done.
    spec["group"]["command"] = command_spec(tmp_path, grace_s=60)["group"]["command"]
    spec["group"]["command"]["launch"][3] = "100000"
    spec["group"]["gpus"] = 2
    out = tmp_path / "staircase"
    write_real_sweep_run(spec, out)
    calls = set_calls_w()
    assert calls == [c for cap in CAPS for c in (cap, cap)] + [700.0, 700.0] and limits_w() == [
        700.0,
        700.0,
    ]
    assert no_process_left(tmp_path)
    run = read_json(out / "run.json")
    assert run["launch"] == "command" and run["stop_reason"] == "all_caps_measured"
    assert [v["cap_w"] for v in run["visits"]] == CAPS and run["training"]["stopped_by_wattflex"]
    steps = read_parquet(out / "steps.parquet")
    assert len(steps) >= 10 and steps["step"].iloc[-1] < 100000


@pytest.mark.slow
def test_fake_nvml_staircase_of_a_command_that_prints_no_throughput_fails_restored(
    fake_nvml, tmp_path
):
    from tests.unit.runs.sweep.test_sweep_real import sweep_spec
    from wattflex.runs.sweep.real import write_real_sweep_run

    spec = sweep_spec(tmp_path, "staircase")
    spec["group"]["command"] = command_spec(tmp_path, "--quiet")["group"]["command"]
    with pytest.raises(CommandError, match="printed no throughput line"):
        write_real_sweep_run(spec, tmp_path / "staircase")
    assert limits_w() == [700.0, 700.0] and no_process_left(tmp_path)


def test_a_failed_command_runs_record_is_protected_and_says_which(tmp_path):
    from wattflex.runs.failures import record_failed_run

    spec = command_spec(tmp_path)
    out = record_failed_run(
        spec, tmp_path / "run", CommandError("the command exited with status 3"), 2
    )
    run = read_json(out / "run.json")
    assert (
        run["status"] == "failed"
        and run["error"] == "CommandError: the command exited with status 3"
    )
    assert holds_real_run(out)


def test_real_runs_code_is_never_fingerprinted():
    from wattflex import fingerprint

    script = Path(__file__).resolve().parents[3] / "workflow_scripts" / "run_at_cap.py"
    assert not [
        m for m in fingerprint.closure(script) if m in ("runs.command_run", "runs.throughput")
    ]


@pytest.mark.fake_gpu
def test_fake_nvml_clock_run_of_an_own_command_locks_the_clock_while_it_runs(fake_nvml, tmp_path):
    """A ``knob: clock`` group with its own command: the SM clock is locked before the command
    starts and reset after it (fake NVML, named so), as the harness's runs do; run.json says so."""
    out = run_at_cap(command_spec(tmp_path) | {"clock_mhz": 1395.0}, tmp_path / "run")
    calls = fake_nvml.state()["clock_calls"]
    assert [c[1:] for c in calls[:2]] == [[1395, 1395], [1395, 1395]]
    assert [c[1:] for c in calls[2:]] == [["reset"], ["reset"]]
    assert all(g["locked_mhz"] is None for g in fake_nvml.state()["gpus"])
    run = read_json(out / "run.json")
    assert run["knob"] == "clock" and run["clock_mhz"] == 1395.0
    assert run["nodes"][0]["clock_lock"]["clock_mhz_requested"] == 1395.0
