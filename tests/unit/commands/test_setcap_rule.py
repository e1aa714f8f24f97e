"""Capping without root: ``wattflex setcap-rule`` prints the wrapper, the
sudoers rule and the cap command; the wrapper (slurm/wattflex-setcap) caps only GPUs of the
calling user's running SLURM job on this node, within the card's range.

The root tests run the wrapper through REAL sudo as uid 65534 (``setpriv``), with a sudoers
drop-in made by the command and checked by ``visudo -cf``, and FAKE nvidia-smi and squeue
(tests/fakes/fake_nvidia_smi.py, fake_slurm_jobs.py) in a root-owned 0755 folder."""

from __future__ import annotations

import itertools
import json
import os
import secrets
import shutil
import socket
import stat
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from tests.fakes import fake_pynvml
from wattflex.runs.devices.caps import command_setter

FAKES = Path(fake_pynvml.__file__).resolve().parent
NOBODY = 65534
NODE = socket.gethostname().split(".")[0]


# ---- what the command prints (any user) -------------------------------------------------------------
def test_the_install_steps_name_the_wrapper_the_sudoers_rule_and_a_cap_command_the_run_accepts(
    run_cli, tmp_path
):
    proc = run_cli("setcap-rule", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert "wattflex setcap-rule --part wrapper > /root/wattflex-setcap" in out
    assert (
        "install -m 0755 -o root -g root /root/wattflex-setcap /usr/local/sbin/wattflex-setcap"
        in out
    )
    assert (
        "%wattflex ALL=(root) NOPASSWD: /usr/local/sbin/wattflex-setcap" in out
        and "visudo -cf" in out
    )
    assert "cap_command: sudo -n /usr/local/sbin/wattflex-setcap {gpu} {watts}" in out
    cmd = run_cli("setcap-rule", "--part", "cap-command", cwd=tmp_path).stdout.strip()
    assert cmd == "sudo -n /usr/local/sbin/wattflex-setcap {gpu} {watts}"
    command_setter(cmd)  # the run's template check accepts it


def test_the_wrapper_part_is_the_shipped_script_with_the_given_paths(run_cli, tmp_path, repo):
    proc = run_cli(
        "setcap-rule",
        "--part",
        "wrapper",
        "--nvidia-smi",
        "/opt/nv/bin/nvidia-smi",
        "--squeue",
        "/opt/slurm/bin/squeue",
        "--node-name",
        "gpu01",
        cwd=tmp_path,
    )
    text = proc.stdout
    assert text.startswith("#!/usr/bin/python3 -I\n")
    assert (
        '\nNVIDIA_SMI = "/opt/nv/bin/nvidia-smi"\n' in text
        and '\nSQUEUE = "/opt/slurm/bin/squeue"\n' in text
    )
    assert "SCONTROL" not in text and '\nNODE_NAME = "gpu01"' in text
    shipped = (repo / "slurm" / "wattflex-setcap").read_text()
    assert len(text.splitlines()) == len(shipped.splitlines())
    compile(text, "wattflex-setcap", "exec")
    assert os.stat(repo / "slurm" / "wattflex-setcap").st_mode & 0o111


@pytest.mark.parametrize(
    "args, message",
    [
        (
            ["--group", "wheel ALL=(ALL) ALL"],
            "--group 'wheel ALL=(ALL) ALL': expected a user or group name",
        ),
        (["--user", "a,b"], "--user 'a,b': expected a user or group name"),
        (["--path", "bin/setcap"], "--path 'bin/setcap': expected an absolute path"),
        (
            ["--nvidia-smi", '/x/"; import os'],
            "--nvidia-smi '/x/\"; import os': expected an absolute path",
        ),
        (["--node-name", "a b"], "--node-name 'a b': expected a host name"),
    ],
)
def test_names_and_paths_that_would_change_the_rule_or_the_script_are_refused(
    run_cli, tmp_path, args, message
):
    proc = run_cli("setcap-rule", *args, cwd=tmp_path)
    assert proc.returncode == 2 and message in proc.stderr and proc.stdout == ""


# ---- the wrapper behind real sudo, as a non-root user ----------------------------------------------
needs_root_sudo = pytest.mark.skipif(
    os.geteuid() != 0 or not all(shutil.which(p) for p in ("sudo", "visudo", "setpriv")),
    reason="installing a sudoers rule and switching to uid 65534 needs root, sudo, visudo and setpriv",
)


@pytest.fixture
def rig(run_cli, tmp_path):
    """A root-owned 0755 folder outside pytest's 0700 one, with the wrapper (made by
    ``setcap-rule --part wrapper`` pointing at the fakes there), the fakes and two FAKE GPUs;
    and a sudoers drop-in letting ``nobody`` run exactly that wrapper (removed afterwards)."""
    where = Path(tempfile.mkdtemp(prefix="wattflex_setcap_"))
    where.chmod(0o755)
    dropin = Path("/etc/sudoers.d") / f"wattflex_test_{secrets.token_hex(4)}"
    try:
        for fake, names in (
            ("fake_nvidia_smi.py", ["nvidia-smi"]),
            ("fake_slurm_jobs.py", ["squeue", "slurmd"]),
        ):
            for name in names:
                shutil.copy(FAKES / fake, where / name)
                (where / name).chmod(0o755)
        shutil.copy(FAKES / "fake_pynvml.py", where / "fake_pynvml.py")
        fake_pynvml.reset(n_gpus=4, path=where / "gpus.json")
        os.environ.pop(fake_pynvml.STATE_ENV)
        (where / "gpus.json").chmod(0o644)
        (where / "gres.json").write_text(json.dumps({"gpus": 4}))
        for k in range(4):  # SLURM's GPU k is the device file nvidia<k>, NVIDIA minor k
            os.mknod(where / f"nvidia{k}", 0o600 | stat.S_IFCHR, os.makedev(NVIDIA_MAJOR, k))
        nvidia_driver(where / "nvidia-proc", {k: k for k in range(4)})
        wrapper = where / "wattflex-setcap"
        made = run_cli(
            "setcap-rule",
            "--part",
            "wrapper",
            "--nvidia-smi",
            where / "nvidia-smi",
            "--squeue",
            where / "squeue",
            "--slurmd",
            where / "slurmd",
            "--nvidia-proc",
            where / "nvidia-proc",
            cwd=tmp_path,
        )
        assert made.returncode == 0, made.stderr
        wrapper.write_text(made.stdout + "\n")
        wrapper.chmod(0o755)
        rule = run_cli(
            "setcap-rule", "--part", "sudoers", "--user", "nobody", "--path", wrapper, cwd=tmp_path
        ).stdout
        assert rule.startswith(f"nobody ALL=(root) NOPASSWD: {wrapper}")
        candidate = tmp_path / "sudoers"
        candidate.write_text(rule + "\n")
        check = subprocess.run(["visudo", "-cf", str(candidate)], capture_output=True, text=True)
        assert check.returncode == 0, check.stdout + check.stderr
        shutil.copy(candidate, dropin)
        dropin.chmod(0o440)
        yield where
    finally:
        dropin.unlink(missing_ok=True)
        shutil.rmtree(where, ignore_errors=True)


NVIDIA_MAJOR = (
    195  # the NVIDIA character devices' major (Linux, Documentation/admin-guide/devices.txt)
)


def bus(gpu: int) -> str:
    """FAKE GPU ``gpu``'s PCI bus id as nvidia-smi writes it (tests/fakes/fake_nvidia_smi.py)."""
    return f"00000000:{gpu + 1:02X}:00.0"


def nvidia_driver(folder: Path, minor_to_gpu: dict[int, int]) -> None:
    """A FAKE /proc/driver/nvidia/gpus: a folder per GPU named by its PCI bus id, whose
    ``information`` names its device minor, as the driver writes it ("Device Minor:  N")."""
    shutil.rmtree(folder, ignore_errors=True)
    for minor, gpu in minor_to_gpu.items():
        (folder / f"0000:{gpu + 1:02x}:00.0").mkdir(parents=True)
        (folder / f"0000:{gpu + 1:02x}:00.0" / "information").write_text(
            f"Model: \t\t NVIDIA H200\nIRQ:   \t\t 42\nGPU UUID: \t GPU-fake-{gpu:04d}\n"
            f"Video BIOS: \t ??.??.??.??.??\nBus Type: \t PCIe\nDMA Size: \t 52 bits\n"
            f"DMA Mask: \t 0xfffffffffffff\nBus Location: \t 0000:{gpu + 1:02x}:00.0\n"
            f"Device Minor: \t {minor}\nGPU Excluded:\t No\n"
        )
    folder.chmod(0o755)


def jobs(where: Path, *entries: dict) -> None:
    (where / "jobs.json").write_text(json.dumps(list(entries)))
    (where / "jobs.json").chmod(0o644)


JOB_IDS = itertools.count(4001)


def job(uid=NOBODY, user="nobody", state="RUNNING", **nodes) -> dict:
    """A SLURM job of ``uid``: its GPU indices per node (default GPUs 0-1 on this node)."""
    return {
        "id": next(JOB_IDS),
        "uid": uid,
        "user": user,
        "state": state,
        "nodes": nodes or {NODE: "0-1"},
    }


def as_nobody_sudo(where: Path, *args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [
            "setpriv",
            f"--reuid={NOBODY}",
            f"--regid={NOBODY}",
            "--clear-groups",
            "sudo",
            "-n",
            str(where / "wattflex-setcap"),
            *args,
        ],
        capture_output=True,
        text=True,
        cwd="/",
        env=env or {"PATH": "/usr/bin:/bin"},
    )


def set_calls(where: Path) -> list[list[str]]:
    calls = where / "nvidia-smi.calls"
    lines = calls.read_text().splitlines() if calls.exists() else []
    return [a for a in map(json.loads, lines) if "-pl" in a]


@needs_root_sudo
def test_sudo_lets_a_job_user_cap_the_gpus_of_their_job_and_nothing_else(rig):
    jobs(rig, job(), job(uid=1000, user="alice", **{NODE: "2-3"}))
    for gpu, watts in (("0", "300"), ("1", "700"), ("1", "200")):
        r = as_nobody_sudo(rig, gpu, watts)
        assert r.returncode == 0, r.stderr
    assert set_calls(rig) == [
        ["-i", bus(0), "-pl", "300"],
        ["-i", bus(1), "-pl", "700"],
        ["-i", bus(1), "-pl", "200"],
    ]
    assert [g["limit_mw"] for g in fake_pynvml_state(rig)["gpus"]] == [
        300_000,
        200_000,
        700_000,
        700_000,
    ]

    refusals = {
        ("2", "300"): "GPU 2 (0000:03:00.0) is not a GPU of a running SLURM job of uid 65534",
        ("7", "300"): "-i 7 --query-gpu=pci.bus_id,power.min_limit,power.max_limit "
        "--format=csv,noheader,nounits failed (exit 6): No devices were found",
        ("0", "199"): "199 W is outside GPU 0's range 200-700 W",
        ("0", "701"): "701 W is outside GPU 0's range 200-700 W",
    }
    refusals |= {
        ("0", w): f"WATTS {w!r} is not a plain integer"
        for w in ("300.5", "3e2", "0x12c", "+300", " 300", "٣٠٠", "-1", "")
    }
    refusals |= {
        (g, "300"): f"GPU {g!r} is not a plain integer"
        for g in ("-1", "0,1", "all", "00000000:01:00.0")
    }
    for (gpu, watts), message in refusals.items():
        r = as_nobody_sudo(rig, gpu, watts)
        assert r.returncode == 2 and message in r.stderr, (gpu, watts, r.stderr)
    assert (
        as_nobody_sudo(rig, "0").returncode == 2
        and as_nobody_sudo(rig, "0", "300", "1").returncode == 2
    )
    assert len(set_calls(rig)) == 3


@needs_root_sudo
def test_a_gpu_is_known_by_its_device_and_bus_id_not_by_slurms_index_digits(rig):
    """Issue 51: SLURM's IDX counts slurmd's GPU records, not nvidia-smi's numbering. Here the
    driver gives SLURM's GPU k (device file nvidia<k>, minor k) the bus of nvidia-smi's GPU
    (k + 2) % 4: a job on SLURM's GPU 0 may cap nvidia-smi's GPU 2, found through minor 0 and
    the bus id, and not nvidia-smi's GPU 0 (another job's); the cap is set by bus id."""
    nvidia_driver(rig / "nvidia-proc", {k: (k + 2) % 4 for k in range(4)})
    jobs(rig, job(**{NODE: "0"}), job(uid=1000, user="alice", **{NODE: "1-3"}))
    r = as_nobody_sudo(rig, "0", "300")
    assert r.returncode == 2, r.stderr
    assert (
        f"GPU 0 (0000:01:00.0) is not a GPU of a running SLURM job of uid 65534 on {NODE} "
        "(its GPUs here: 0000:03:00.0 (SLURM's GPU 0))" in r.stderr
    ), r.stderr
    r = as_nobody_sudo(rig, "2", "300")
    assert r.returncode == 0, r.stderr
    assert set_calls(rig) == [["-i", bus(2), "-pl", "300"]]
    assert [g["limit_mw"] for g in fake_pynvml_state(rig)["gpus"]] == [700_000] * 2 + [
        300_000,
        700_000,
    ]


@needs_root_sudo
def test_a_device_file_that_is_not_an_nvidia_gpu_is_refused(rig):
    """SLURM's GPU record naming a device of another driver (here /dev/null's 1:3) caps nothing."""
    (rig / "nvidia0").unlink()
    os.mknod(rig / "nvidia0", 0o600 | stat.S_IFCHR, os.makedev(1, 3))
    jobs(rig, job(**{NODE: "0"}))
    r = as_nobody_sudo(rig, "0", "300")
    assert r.returncode == 2 and "is not an NVIDIA GPU device (char 195:N)" in r.stderr, r.stderr
    assert set_calls(rig) == []


@needs_root_sudo
def test_no_running_job_here_no_cap(rig):
    for entries in ([], [job(state="PENDING")], [job(**{"othernode": "0-1"})]):
        jobs(rig, *entries)
        r = as_nobody_sudo(rig, "0", "300")
        assert (
            r.returncode == 2
            and f"GPU 0 is not a GPU of a running SLURM job of uid 65534 on {NODE} "
            f"(its GPUs here: none)"
            in r.stderr
        ), r.stderr
    assert set_calls(rig) == []


@needs_root_sudo
def test_the_callers_environment_chooses_nothing(rig, tmp_path):
    """A PATH with the caller's own nvidia-smi/squeue first and a SUDO_UID of alice's: sudo
    resets both, and the wrapper runs only the absolute paths root wrote into it."""
    evil = Path(tempfile.mkdtemp(prefix="wattflex_evil_"))
    try:
        evil.chmod(0o755)
        for name in ("nvidia-smi", "squeue"):
            (evil / name).write_text(f"#!/bin/sh\ntouch {evil}/ran-{name}\necho 1000\n")
            (evil / name).chmod(0o755)
        jobs(rig, job(uid=1000, user="alice", **{NODE: "0-3"}))
        r = as_nobody_sudo(
            rig, "3", "300", env={"PATH": f"{evil}:/usr/bin:/bin", "SUDO_UID": "1000"}
        )
        assert r.returncode == 2 and "not a GPU of a running SLURM job of uid 65534" in r.stderr, (
            r.stderr
        )
        assert list(evil.glob("ran-*")) == [] and set_calls(rig) == []
    finally:
        shutil.rmtree(evil, ignore_errors=True)


@needs_root_sudo
def test_without_the_sudoers_rule_sudo_refuses_and_nothing_is_set(rig):
    jobs(rig, job())
    other = rig / "other-setcap"
    shutil.copy(rig / "wattflex-setcap", other)
    r = subprocess.run(
        [
            "setpriv",
            f"--reuid={NOBODY}",
            f"--regid={NOBODY}",
            "--clear-groups",
            "sudo",
            "-n",
            str(other),
            "0",
            "300",
        ],
        capture_output=True,
        text=True,
        cwd="/",
    )
    assert r.returncode == 1 and "password is required" in r.stderr
    assert set_calls(rig) == []


def fake_pynvml_state(where: Path) -> dict:
    return json.loads((where / "gpus.json").read_text())


@needs_root_sudo
def test_a_capguard_in_command_mode_caps_and_restores_as_the_job_user(rig, run_cli, tmp_path):
    """End to end as uid 65534: NvmlGpu reads the FAKE NVML GPUs, CapGuard sets 300 W through
    ``sudo -n wrapper {gpu} {watts}`` and puts the original 700 W back on exit."""
    jobs(rig, job())
    cap_command = run_cli(
        "setcap-rule", "--part", "cap-command", "--path", rig / "wattflex-setcap", cwd=tmp_path
    ).stdout.strip()
    state = Path(tempfile.mkdtemp(prefix="wattflex_state_"))
    os.chown(state, NOBODY, NOBODY)
    code = (  # noqa: UP031
        "import sys, json; sys.path[:0] = [%r]; import fake_pynvml; sys.modules['pynvml'] = fake_pynvml\n"
        "from wattflex.runs.devices.caps import CapGuard, limit_setter\n"
        "from wattflex.runs.devices.nvml import NvmlGpu\n"
        "gpus = [NvmlGpu(i, set_limit=limit_setter('command', %r), gpm=False) for i in (0, 1)]\n"
        "with CapGuard(gpus, 300, mode='command', command=%r, state_dir=%r, handle_signals=False) as g:\n"
        "    during = [x['limit_mw'] for x in fake_pynvml.state()['gpus']]\n"
        "print(json.dumps({'during': during, 'record': g.record()}))\n"
    ) % (str(FAKES), cap_command, cap_command, str(state / "caps"))
    try:
        r = python_as_nobody(code, {fake_pynvml.STATE_ENV: str(rig / "gpus.json")})
        assert r.returncode == 0, r.stderr[-2000:]
        out = json.loads(r.stdout.splitlines()[-1])
        assert out["during"][:2] == [300_000, 300_000]
        assert [g["limit_mw"] for g in fake_pynvml_state(rig)["gpus"]][:2] == [700_000, 700_000]
        assert set_calls(rig) == [
            ["-i", bus(0), "-pl", "300"],
            ["-i", bus(1), "-pl", "300"],
            ["-i", bus(0), "-pl", "700"],
            ["-i", bus(1), "-pl", "700"],
        ]
    finally:
        shutil.rmtree(state, ignore_errors=True)


def python_as_nobody(code: str, env: dict | None = None) -> subprocess.CompletedProcess:
    repo = FAKES.parents[1]
    return subprocess.run(
        [
            "setpriv",
            f"--reuid={NOBODY}",
            f"--regid={NOBODY}",
            "--clear-groups",
            sys.executable,
            "-c",
            code,
        ],
        capture_output=True,
        text=True,
        cwd="/",
        env={
            "PATH": "/usr/bin:/bin",
            "PYTHONPATH": f"{repo / 'workflow_scripts'}:{repo}",
            **(env or {}),
        },
    )


@needs_root_sudo
def test_doctor_asks_sudo_whether_the_job_user_may_run_the_cap_command(rig):
    """doctor's ``sudo -n -l`` check as uid 65534: the installed rule's wrapper is allowed, any
    other program is not (sudo lists it silently as not allowed); neither is run."""
    code = (
        "import json; from wattflex.diagnosis import sudo_refusal\n"
        f"print(json.dumps([sudo_refusal(['sudo', '-n', {str(rig / 'wattflex-setcap')!r}, '0', '300']), "
        f"sudo_refusal(['sudo', '-n', {str(rig / 'nvidia-smi')!r}, '-i', '0', '-pl', '300'])]))"
    )
    r = python_as_nobody(code)
    assert r.returncode == 0, r.stderr[-2000:]
    allowed, refused = json.loads(r.stdout.splitlines()[-1])
    assert allowed is None and refused == "no sudoers rule allows it (sudo -n -l exit 1)"
    assert not (rig / "nvidia-smi.calls").exists()
