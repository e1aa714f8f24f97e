"""Issue 47, "Reliability classes": units a user might use, and numbers that validate then fail.

A schedule's ``target_kw`` written in W (1000 for the 1.4 kW of two GPUs) became a 1 MW
budget, ``control --budget-w`` in mW likewise, and ``allocate`` took curves in kW and capped
nothing, each with exit 0: each is now held against what the GPUs can draw, with a hint.
YAML's ``.nan`` passed every ``minimum`` of the schema (a comparison with NaN is false), in
the campaign config and the site file alike: a non-finite number is refused wherever the
schema reads one. ``control`` runs on FAKE NVML (tests/fakes/fake_pynvml.py: two fake H200s,
200-700 W)."""

from __future__ import annotations

import copy
import json

import pytest
import yaml

from tests.fakes.nvml_fixture import fake_nvml, limits_w  # noqa: F401 (fixture)
from tests.unit.commands.test_allocate_site import SITE
from wattflex import cli
from wattflex.config import load_config
from wattflex.errors import ConfigError
from wattflex.ops.events import ScheduleError, read_schedule
from wattflex.schema import REPO_ROOT


def _one_line_error(capsys, command: str) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"wattflex {command}: error: "), err
    return err[0]


@pytest.mark.fake_gpu
@pytest.mark.parametrize(
    ("schedule", "args", "message"),
    [
        # target_kw in W: 1000 W of 1.4 kW of GPUs read as 1 MW
        ("event_id,start_s,end_s,target_kw\ne1,0,5,1000\n", [], "target_kw is kW"),
        ('{"events": [{"start_s": 0, "end_s": 5, "target_kw": 1200}]}', [], "target_kw is kW"),
        # the one-off budget in mW (1.2 kW as 1200000)
        (None, ["--budget-w", "1200000"], "--budget-w is in W"),
    ],
)
def test_control_refuses_a_target_in_the_wrong_unit_fake_nvml(
    fake_nvml, tmp_path, capsys, schedule, args, message
):
    if schedule is not None:
        sig = tmp_path / ("s.json" if schedule.startswith("{") else "s.csv")
        sig.write_text(schedule)
        args = ["--signal", str(sig)]
    argv = ["control", *args, "--duration-s", "1", "--period-s", "0.1"]
    assert cli.main([*argv, "--state-dir", str(tmp_path / "st")]) == 2
    line = _one_line_error(capsys, "control")
    assert message in line and "1.4 kW these GPUs draw at their largest limits" in line, line
    assert limits_w() == [700.0, 700.0]


@pytest.mark.fake_gpu
def test_control_warns_of_a_target_that_curtails_nothing_fake_nvml(fake_nvml, tmp_path, capsys):
    sig = tmp_path / "s.csv"
    sig.write_text("event_id,start_s,end_s,target_kw\ne1,0,0.3,2\n")  # 2 kW of 1.4 kW of GPUs
    argv = ["control", "--signal", str(sig), "--period-s", "0.1"]
    assert cli.main([*argv, "--state-dir", str(tmp_path / "st")]) == 0
    assert "nothing is curtailed" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("curves", "message"),
    [
        # kW curves of a one-GPU job: 0.5 "W" per GPU
        ("job,power_w,throughput\nj,0.3,80\nj,0.5,100\n", "0.5 W per GPU"),
        # kW curves of an 8-GPU job with its gpus column
        ("job,power_w,throughput,gpus\nj,3.2,80,8\nj,5.6,100,8\n", "0.7 W per GPU (gpus 8)"),
        # mW curves of a 4-GPU job
        ("job,power_w,throughput,gpus\nj,1.2e6,80,4\nj,2.4e6,100,4\n", "in mW?"),
    ],
)
def test_allocate_refuses_curves_in_another_unit(tmp_path, run_cli, curves, message):
    """Before: exit 0, budget 900 W above the 0.5 "W" uncapped power, nothing capped."""
    (tmp_path / "c.csv").write_text(curves)
    proc = run_cli("allocate", "c.csv", "--budget-w", "900", cwd=tmp_path)
    assert proc.returncode == 2, proc.stdout
    assert message in proc.stderr and "c.csv:2: job 'j'" in proc.stderr, proc.stderr
    assert "power_w is watts" in proc.stderr


@pytest.mark.parametrize("value", [".nan", ".inf", "-.inf", ".NaN"])
def test_a_campaign_config_refuses_non_finite_numbers(tmp_path, value):
    """Before: `run: {duration_s: .nan}` passed `minimum: 60` and failed later, at use."""
    doc = yaml.safe_load((REPO_ROOT / "config" / "config.yaml").read_text())
    path = tmp_path / "c.yaml"
    text = yaml.safe_dump({**doc, "run": {**doc.get("run", {}), "duration_s": 1800}})
    path.write_text(text.replace("duration_s: 1800", f"duration_s: {value}"))
    with pytest.raises(ConfigError, match=r"run\.duration_s.*not a finite number"):
        load_config(path)


@pytest.mark.parametrize("value", [".nan", ".inf"])
def test_a_site_file_refuses_non_finite_limits(tmp_path, run_cli, value):
    """Before: a rack at `limit_kw: .nan` passed `exclusiveMinimum: 0` and held nothing."""
    site = copy.deepcopy(SITE)
    site["feeds"][0]["pdus"][0]["racks"][0]["limit_kw"] = 0.123
    (tmp_path / "site.yaml").write_text(yaml.safe_dump(site).replace("0.123", value))
    (tmp_path / "c.csv").write_text(
        "job,power_w,throughput,node\nj,300,80,node1\nj,500,100,node1\n"
    )
    proc = run_cli("allocate", "c.csv", "--cut", "0.2", "--site", "site.yaml", cwd=tmp_path)
    assert proc.returncode == 2 and "not a finite number" in proc.stderr, proc.stderr
    assert "limit_kw" in proc.stderr


@pytest.mark.parametrize("key", ["ramp_kw_per_s", "deadline_s", "target_kw", "start_s"])
@pytest.mark.parametrize("value", ["NaN", "Infinity"])
def test_a_json_schedule_refuses_non_finite_numbers(tmp_path, key, value):
    """Before: JSON's NaN (Python's json reads it) was taken for a blank: a ramp limit or a
    deadline of NaN silently became none."""
    event = {"start_s": 0, "end_s": 5, "fraction": 0.5, "ramp_kw_per_s": 1, "deadline_s": 3}
    event = {k: v for k, v in event.items() if not (key == "target_kw" and k == "fraction")}
    text = json.dumps({"events": [{**event, key: "X"}]}).replace('"X"', value)
    (tmp_path / "s.json").write_text(text)
    with pytest.raises(ScheduleError, match=f"{key} .* is not a finite number"):
        read_schedule(tmp_path / "s.json")


@pytest.mark.parametrize(
    ("argv", "hint"),
    [
        (["allocate", "c.csv", "--cut", "30"], "30% is 0.3"),
        (["offer", "c.csv", "--loss", "25"], "25% is 0.25"),
    ],
)
def test_a_fraction_written_as_a_percentage_gets_the_hint(tmp_path, run_cli, argv, hint):
    """Before: the range alone ("must be a fraction in [0, 1), got 30.0"), no word of percent."""
    (tmp_path / "c.csv").write_text("job,power_w,throughput,cap_w\nj,300,80,300\nj,500,100,700\n")
    proc = run_cli(*argv, cwd=tmp_path)
    assert proc.returncode == 2 and hint in proc.stderr, proc.stderr
