"""No wrong number with exit 0: inputs and options that would give one are read as meant (job
ids as text) or refused with one line naming what is wrong."""

import pytest

from tests.fakes.nvml_fixture import fake_nvml, limits_w  # noqa: F401 (fixture)
from wattflex.provenance import read_csv

CURVES = """job,power_w,throughput,cap_w,gpus
01,1600,3000,200,8
01,3000,7000,400,8
01,5500,10500,700,8
1,1550,60000,200,8
1,3100,130000,400,8
1,5400,150000,700,8
007,1600,3000,200,8
007,3000,7000,400,8
"""


@pytest.fixture
def curves(tmp_path):
    path = tmp_path / "curves.csv"
    path.write_text(CURVES)
    return path


def one_error_line(result, command: str) -> str:
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 2 and len(lines) == 1, result.stderr
    assert lines[0].startswith(f"wattflex {command}: ") and "Traceback" not in result.stderr
    return lines[0]


def test_allocate_keeps_job_ids_01_and_1_apart_and_007_whole(run_cli, curves, tmp_path):
    out = tmp_path / "alloc.csv"
    assert (
        run_cli(
            "allocate", curves, "--cut", "0.3", "--policy", "equal-weight", "-o", out, cwd=tmp_path
        ).returncode
        == 0
    )
    assert list(read_csv(out, dtype={"job": str})["job"]) == ["01", "1", "007"]


def test_offer_finds_job_007_and_keeps_01_apart_from_1(run_cli, curves, tmp_path):
    result = run_cli("offer", curves, "--job", "007", "--job", "01", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    jobs = [line.split()[0] for line in result.stdout.splitlines()[2:]]
    assert jobs == ["007"] * 3 + ["01"] * 3 + ["TOTAL"] * 3


@pytest.mark.parametrize(
    "solo",
    [
        "solo,700,5400,10000\nsolo,700,5450,10000\n",  # repeats at one cap, power differing by noise
        "solo,700,5400,10000\n",  # one run
    ],
)
def test_offer_charges_nothing_for_a_group_with_one_cap_and_says_so(run_cli, tmp_path, solo):
    runs = tmp_path / "runs.csv"
    runs.write_text(
        "group,cap_w,power_w,tokens_per_s\ndense,200,1600,3000\ndense,400,3000,7000\n"
        "dense,700,5500,10500\n" + solo
    )
    out = tmp_path / "offer.csv"
    assert run_cli("offer", runs, "-o", out, cwd=tmp_path).returncode == 0
    t = read_csv(out, keep_default_na=False).set_index(["job", "max_throughput_loss"])
    assert (t.loc["solo", "shed_kw"] == 0).all() and (t.loc["solo", "tokens_lost"] == 0).all()
    assert (t.loc["solo", "note"] == "one cap: no curve, cannot shed").all()
    assert (t.loc["TOTAL", "tokens_lost"] == t.loc["dense", "tokens_lost"]).all()


ALLOCATE = ["allocate", "curves.csv", "--cut", "0.3", "--policy", "curve-aware"]


@pytest.mark.parametrize(
    "command, option, value, allowed",
    [
        (ALLOCATE, "--curve-nodes", "0", "whole number >= 2 and <= 50"),
        (ALLOCATE, "--moe-ft-share", "-1", "finite number > 0"),
        (ALLOCATE, "--moe-ft-share", "nan", "finite number > 0"),
        (["offer", "curves.csv"], "--hours", "1e308", "finite number > 0 and <= 8784"),
        (["offer", "curves.csv"], "--hours", "0", "finite number > 0 and <= 8784"),
        (["offer", "curves.csv"], "--hours", "inf", "finite number > 0 and <= 8784"),
        (["pfi", "sweeps.csv"], "--rel-tol", "-1", "finite number >= 0 and <= 1"),
        (["pfi", "sweeps.csv"], "--rel-tol", "nan", "finite number >= 0 and <= 1"),
        (
            ["cluster-control", "--signal", "s.csv", "--budget-dir", "b"],
            "--duration-s",
            "nan",
            "finite number > 0",
        ),
        (
            ["cluster-control", "--signal", "s.csv", "--budget-dir", "b"],
            "--duration-s",
            "-5",
            "finite number > 0",
        ),
    ],
)
def test_out_of_range_options_are_refused_where_parsed(
    run_cli, curves, tmp_path, command, option, value, allowed
):
    (tmp_path / "sweeps.csv").write_text(
        "group,cap_w,power_w,throughput\ng,300,280,50\ng,700,600,100\n"
    )
    result = run_cli(*command, option, value, cwd=tmp_path)
    assert result.returncode == 2 and result.stdout == ""
    assert f"argument {option}: {value!r}: must be a {allowed}" in result.stderr
    assert "Traceback" not in result.stderr and not (tmp_path / "b").exists()


CAL_GROUP = "dense-ft-mistral24b-x8"  # a group of config/config.yaml


@pytest.mark.parametrize(
    "points, reason",
    [
        (
            [(300, 2400, 0), (500, 4000, 0), (700, 5600, 0)],
            "no PFI: throughput zero or flat across caps",
        ),
        (
            [(300, 2400, 100), (500, 4000, 100), (700, 5600, 100)],
            "no PFI: throughput zero or flat across caps",
        ),
        (
            [(300, 5600, 50), (500, 5600, 80), (700, 5600, 100)],
            "PFI 0: power identical across caps",
        ),
    ],
)
def test_calibrate_refuses_sweeps_that_cannot_pin_the_anchor(
    run_cli, repo, tmp_path, points, reason
):
    runs = tmp_path / "runs.csv"
    runs.write_text(
        "group,cap_w,power_w,throughput\n"
        + "".join(f"{CAL_GROUP},{c},{p},{t}\n" for c, p, t in points)
    )
    out = tmp_path / "cal.json"
    result = run_cli(
        "calibrate",
        "--runs",
        runs,
        "--configfile",
        repo / "config/config.yaml",
        "-o",
        out,
        cwd=tmp_path,
    )
    line = one_error_line(result, "calibrate")
    assert "cannot pin the fit" in line and f"{CAL_GROUP} ({reason})" in line
    assert not out.exists() and "anchor" not in result.stdout


def test_ingest_dcgm_runs_counts_no_instant_twice_when_the_capture_clock_steps_back(
    run_cli, tmp_path
):
    from tests.unit.ingest.test_dcgm import exporter_capture

    steps = "step,t_end_s,tokens,loss\n" + "".join(
        f"{s},{1795956000 + 2 * s},16384,1.0\n" for s in range(1, 100)
    )
    (tmp_path / "steps.csv").write_text(steps)
    power = {}
    for name, back in (("mono", 0.0), ("back", 15.0)):
        exporter_capture(tmp_path / f"{name}.prom", step_back_s=back, n=40)
        (tmp_path / f"{name}.csv").write_text(
            "group,cap_w,telemetry,telemetry_format,steps,gpu_model\n"
            f"g,700,{name}.prom,dcgm-exporter,steps.csv,H100\n"
        )
        result = run_cli(
            "ingest", "dcgm-runs", f"{name}.csv", "-o", f"{name}.runs.csv", cwd=tmp_path
        )
        assert result.returncode == 0, result.stderr
        power[name] = read_csv(tmp_path / f"{name}.runs.csv")["power_w"].item()
        assert ("the clock goes back" in result.stdout) == (name == "back")
    assert power["back"] == pytest.approx(power["mono"]) == 610


@pytest.mark.fake_gpu
@pytest.mark.parametrize(
    "name, text, message",
    [
        (
            "s.json",
            '{"events": [{"start_s": 0, "end_s": 60, "target_kw": true}]}',
            "target_kw true is not a number",
        ),
        ("s.csv", "time_s,fraction\n-100,0.5\n-50,0.6\n", "time_s ends at -50 s, before the start"),
    ],
)
def test_control_refuses_a_signal_that_would_be_followed_wrong_fake_nvml(
    fake_nvml, run_cli, tmp_path, name, text, message
):
    (tmp_path / name).write_text(text)
    result = run_cli(
        "control",
        "--signal",
        name,
        "--state-dir",
        tmp_path / "st",
        "--duration-s",
        "5",
        cwd=tmp_path,
    )
    assert message in one_error_line(result, "control") and limits_w() == [700.0, 700.0]


@pytest.mark.parametrize(
    "coefficients, intercept, message",
    [
        ('{"dram_copy_product": 1e308}', "1e308", "PFI of data row(s) 1, 2 is not a finite number"),
        (
            '{"dram_copy_product": 1e999}',
            "0.5",
            "coefficient 'dram_copy_product' inf is not a finite number",
        ),
    ],
)
def test_predict_refuses_a_model_that_gives_no_finite_pfi(
    run_cli, tmp_path, coefficients, intercept, message
):
    from wattflex.provenance import SCHEMA_VERSION

    (tmp_path / "model.json").write_text(
        f'{{"schema_version": "{SCHEMA_VERSION}", "features": ["dram_copy_product"], '
        f'"coefficients": {coefficients}, "intercept": {intercept}}}'
    )
    (tmp_path / "jobs.csv").write_text("job,dram_active,mem_copy_util\na,0.1,10\nb,0.4,30\n")
    result = run_cli("predict", "jobs.csv", "--model", "model.json", "-o", "pred.csv", cwd=tmp_path)
    assert message in one_error_line(result, "predict") and not (tmp_path / "pred.csv").exists()
