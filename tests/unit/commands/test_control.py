"""``wattflex control`` at its boundary: bad input stops it with one line and exit 2
before any limit changes; a SIGKILLed run's caps are restored before the next run reads any
limit as an original; every termination signal restores the caps. FAKE NVML only
(tests/fakes/fake_pynvml.py): two fake H200s, 200-700 W."""

import logging
import os
import re
import signal
from pathlib import Path

import pytest

from tests.fakes import fake_pynvml
from tests.fakes.nvml_fixture import control_process, fake_nvml, limits_w  # noqa: F401 (fixture)
from wattflex import cli

from .test_odd_inputs import no_hang

FAKES = Path(fake_pynvml.__file__).resolve().parent
REPO = FAKES.parents[1]

pytestmark = pytest.mark.fake_gpu

LOG_LINE = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} (DEBUG|INFO|WARNING|ERROR) wattflex")


# ---- case 4: a stale cap never becomes the "original" ---------------------------------------


def test_control_after_a_sigkill_restores_the_true_original_limit_fake_nvml(
    fake_nvml, tmp_path, capsys
):
    st = tmp_path / "st"
    proc = control_process(
        tmp_path,
        "--budget-w",
        "790",
        "--duration-s",
        "120",
        "--period-s",
        "0.2",
        "--state-dir",
        str(st),
    )
    proc.kill()
    proc.wait(timeout=30)
    stale = limits_w()
    assert (
        max(stale) <= 395 and len(list(st.glob("caps-*.json"))) == 1
    )  # SIGKILL: caps and the file left
    assert cli.main(["control", "--dry-run", "--budget-w", "1000", "--state-dir", str(st)]) == 0
    assert (
        "control (or wattflex restore-caps) first puts back GPU 0 -> 700 W"
        in capsys.readouterr().err
    )
    assert limits_w() == stale  # a dry run changes nothing
    assert (
        cli.main(
            [
                "control",
                "--budget-w",
                "1000",
                "--duration-s",
                "0.3",
                "--period-s",
                "0.1",
                "--state-dir",
                str(st),
            ]
        )
        == 0
    )
    out, err = capsys.readouterr()
    assert (
        f"restored the power limits left by killed process {proc.pid} (GPU 0 -> 700 W, GPU 1 -> 700 W"
        in err
    )
    assert "power limits restored" in out
    assert limits_w() == [700.0, 700.0]  # the true default, not 395 W
    assert not list(st.glob("caps-*.json"))


def test_control_refuses_gpus_a_live_controller_is_capping_fake_nvml(fake_nvml, tmp_path, capsys):
    st = tmp_path / "st"
    proc = control_process(
        tmp_path,
        "--budget-w",
        "790",
        "--duration-s",
        "120",
        "--period-s",
        "0.2",
        "--state-dir",
        str(st),
    )
    try:
        assert (
            cli.main(["control", "--budget-w", "1000", "--duration-s", "1", "--state-dir", str(st)])
            == 2
        )
        err = capsys.readouterr().err
        assert (
            f"process {proc.pid} is capping these GPUs now" in err
            and len(err.strip().splitlines()) == 1
        )
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=30)
    assert limits_w() == [700.0, 700.0]


@pytest.mark.parametrize("sig", [signal.SIGQUIT, signal.SIGUSR1, signal.SIGUSR2])
def test_control_restores_caps_on_quit_and_usr_signals_fake_nvml(fake_nvml, tmp_path, sig):
    proc = control_process(
        tmp_path,
        "--budget-w",
        "790",
        "--duration-s",
        "120",
        "--period-s",
        "0.2",
        "--state-dir",
        str(tmp_path / "st"),
    )
    proc.send_signal(sig)
    assert proc.wait(timeout=30) == 128 + sig, proc.stderr.read()
    assert limits_w() == [700.0, 700.0]
    assert not list((tmp_path / "st").glob("caps-*.json"))


# ---- cases 5 and 7: wrong numbers and tracebacks become one line, exit 2, nothing changed ----

RUN = ["--duration-s", "1", "--period-s", "0.1"]


def cap_command(template: str) -> list[str]:
    return ["--budget-w", "800", "--cap-control", "command", "--cap-command", template, *RUN]


@pytest.mark.parametrize(
    "args, message",
    [
        (
            ["--budget-w", "100", *RUN],
            "--budget-w 100 W is below these GPUs' floor of 400 W (the sum of their minimum caps, 2 GPU(s))",
        ),
        (
            ["--dry-run", "--budget-w", "100"],
            "--budget-w 100 W is below these GPUs' floor of 400 W",
        ),
        (["--budget-w", "nan", *RUN], "--budget-w nan: must be a finite number > 0"),
        (["--budget-w", "inf", *RUN], "--budget-w inf: must be a finite number > 0"),
        (["--budget-w", "-50", *RUN], "--budget-w -50: must be a finite number > 0"),
        (
            ["--budget-w", "800", "--duration-s", "1", "--period-s", "0"],
            "--period-s 0: must be a finite number >= 0.1",
        ),
        (
            ["--budget-w", "800", "--duration-s", "1", "--period-s", "0.001"],
            "--period-s 0.001: must be a finite number >= 0.1",
        ),
        (
            ["--budget-w", "800", "--duration-s", "nan"],
            "--duration-s nan: must be a finite number > 0",
        ),
        (
            ["--budget-w", "800", "--job-gpus", "5", *RUN],
            "GPU index 5 does not exist (this node has 2 GPUs: 0-1)",
        ),
        (
            ["--dry-run", "--budget-w", "800", "--job-gpus", "0-5"],
            "GPU index 2 does not exist (this node has 2 GPUs: 0-1)",
        ),
        (
            ["--budget-w", "800", "--job-gpus", "3-1", *RUN],
            "--job-gpus '3-1': range 3-1 runs backwards (write 1-3)",
        ),
        (["--budget-w", "800", "--job-gpus", ",", *RUN], "--job-gpus ',': names no GPU"),
        (["--budget-w", "800", "--moe-ft", "7", *RUN], "--moe-ft 7: this node has 2 job(s)"),
        (
            [
                "--budget-w",
                "800",
                "--cap-control",
                "command",
                "--cap-command",
                "no-such-setcap-xyz {gpu} {watts}",
                *RUN,
            ],
            "--cap-command 'no-such-setcap-xyz {gpu} {watts}': 'no-such-setcap-xyz' is not an executable on PATH",
        ),
        (
            [
                "--budget-w",
                "800",
                "--cap-control",
                "command",
                "--cap-command",
                "false {gpu} {watts}",
                *RUN,
            ],
            "cap command false 0 ",
        ),
        (
            ["--budget-w", "800", "--cap-control", "command", "--cap-command", "true", *RUN],
            "must contain {gpu} and {watts}",
        ),
        # a template that str.format cannot fill is refused before "controlling...", not at the first cap
        (
            cap_command("echo {node} {gpu} {watts}"),
            "--cap-command 'echo {node} {gpu} {watts}': has placeholder(s) {node}; only {gpu} and {watts} are filled in",
        ),
        (
            cap_command("echo { {gpu} {watts}"),
            "--cap-command 'echo { {gpu} {watts}': is not a valid template",
        ),
        (cap_command("echo {gpu} {watts} }"), "is not a valid template (Single '}' encountered"),
        (cap_command("echo {gpu} {watts:q}"), "is not a valid template (Unknown format code 'q'"),
        (cap_command("echo {{gpu}} {watts}"), "must contain {gpu} and {watts}"),
        (cap_command("echo {} {gpu} {watts}"), "has placeholder(s) {}"),
        (
            ["--budget-w", "800", "--cap-control", "command", *RUN],
            "--cap-control command needs --cap-command",
        ),
        (
            ["--signal", "{fifo}", *RUN],
            "schedule {fifo}: is a FIFO (named pipe), not a regular file",
        ),
        (
            ["--budget-w", "800", "--state-dir", "{file}", *RUN],
            "--state-dir {file}: is a file, not a directory",
        ),
    ],
)
def test_control_bad_input_is_one_line_and_changes_nothing_fake_nvml(
    fake_nvml, tmp_path, capsys, args, message
):
    afile = tmp_path / "a_file"
    afile.write_text("not a directory\n")
    os.mkfifo(tmp_path / "fifo")
    args = [a.replace("{file}", str(afile)).replace("{fifo}", str(tmp_path / "fifo")) for a in args]
    if "--state-dir" not in args:
        args += ["--state-dir", str(tmp_path / "st")]
    with no_hang():  # a FIFO --signal blocked the open
        assert cli.main(["control", *args]) == 2
    out, err = capsys.readouterr()
    # the error is one line; the log's timestamped lines (--log-level) are another channel
    lines = [line for line in err.strip().splitlines() if not LOG_LINE.match(line)]
    assert len(lines) == 1 and lines[0].startswith("wattflex control: error: "), err
    assert (
        message.replace("{file}", str(afile)).replace("{fifo}", str(tmp_path / "fifo")) in lines[0]
    )
    assert "Traceback" not in err and "power limits restored" not in out
    assert limits_w() == [700.0, 700.0] and afile.read_text() == "not a directory\n"
    assert not list((tmp_path / "st").glob("caps-*.json"))


def test_control_signal_below_the_floors_warns_and_holds_the_floors_fake_nvml(
    fake_nvml, tmp_path, capsys, caplog
):
    sig = tmp_path / "s.csv"
    sig.write_text("time_s,fraction\n0,0.2\n0.4,0.2\n")  # 0.2 * 1400 W = 280 W < the 400 W floor
    with caplog.at_level(logging.WARNING, logger="wattflex.ops.services.node_agent"):
        assert (
            cli.main(
                [
                    "control",
                    "--signal",
                    str(sig),
                    "--period-s",
                    "0.1",
                    "--state-dir",
                    str(tmp_path / "st"),
                ]
            )
            == 0
        )
    out, err = capsys.readouterr()
    assert (
        "dips to 280 W at t=0 s, below these GPUs' floor of 400 W" in err
        and "power limits restored" in out
    )
    below = [r for r in caplog.records if "below the jobs' floor 400 W" in r.getMessage()]
    assert len(below) >= 2  # every such period, not once
    capped = {mw for _, mw in fake_nvml.state()["set_calls"] if mw < 700_000}
    assert capped == {200_000} and limits_w() == [700.0, 700.0]
