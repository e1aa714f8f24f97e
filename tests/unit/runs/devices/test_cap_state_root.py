"""Root never trusts a cap state file or folder another user could write (that user would choose
what root runs, writes or sets), on FAKE NVML GPUs (tests/fakes/fake_pynvml.py).

Run as root, the files and folders are planted by another uid (``setpriv --reuid 65534``, a
real second user), in a world-writable sticky folder like ``/var/tmp``. Nothing from such a
file may run, be written through, or decide a limit."""

from __future__ import annotations

import json
import os
import shutil
import socket
import stat
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from tests.fakes.nvml_fixture import fake_nvml, limits_w  # noqa: F401 (fixture)
from wattflex.runs.devices import cap_state, caps, nvml
from wattflex.runs.devices.nvml import open_gpus

pytestmark = [
    pytest.mark.fake_gpu,
    pytest.mark.skipif(
        os.geteuid() != 0 or shutil.which("setpriv") is None,
        reason="root planting as another user needs root and setpriv",
    ),
]
NOBODY = 65534
HOST = socket.gethostname()
EPILOG = Path(__file__).resolve().parents[4] / "slurm" / "epilog.sh"


def folder_in_tmp(prefix: str, mode: int):
    """A fresh root-owned folder of ``mode`` in /tmp (pytest's tmp_path is root's 0700), removed after."""
    where = Path(tempfile.mkdtemp(prefix=prefix))
    where.chmod(mode)
    yield where
    shutil.rmtree(where, ignore_errors=True)


@pytest.fixture
def var_tmp():
    """A world-writable sticky folder, as /var/tmp is."""
    yield from folder_in_tmp("wattflex-vartmp-", 0o1777)


FAKES = Path(__file__).resolve().parents[3] / "fakes"


@pytest.fixture
def slurm_gres(monkeypatch):
    """``gres(minors)``: a FAKE ``slurmd -G`` (tests/fakes/fake_slurm_jobs.py) whose GPU k, in
    gres.conf order, is the device file ``nvidia<k>`` of NVIDIA minor ``minors[k]``; restore-caps
    runs it (``nvml.SLURMD``). Called at once with NVML's order ([0, 1]) for the tests that only
    need a job's GPUs to be known."""
    where = Path(tempfile.mkdtemp(prefix="wattflex-gres-"))
    where.chmod(0o755)
    shutil.copy(FAKES / "fake_slurm_jobs.py", where / "slurmd")
    (where / "slurmd").chmod(0o755)
    (where / "jobs.json").write_text("[]")
    monkeypatch.setattr(nvml, "SLURMD", str(where / "slurmd"))

    def gres(minors: list[int]) -> Path:
        (where / "gres.json").write_text(json.dumps({"gpus": len(minors)}))
        for k, minor in enumerate(minors):
            (where / f"nvidia{k}").unlink(missing_ok=True)
            os.mknod(
                where / f"nvidia{k}", 0o600 | stat.S_IFCHR, os.makedev(nvml.NVIDIA_MAJOR, minor)
            )
        return where

    gres([0, 1])
    yield gres
    shutil.rmtree(where, ignore_errors=True)


def as_nobody(*argv: str) -> None:
    subprocess.run(
        ["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups", *argv], check=True
    )


def plant(path: Path, doc: dict) -> None:
    """``doc`` written to ``path`` by uid 65534."""
    as_nobody("sh", "-c", 'printf "%s" "$1" > "$2"', "sh", json.dumps(doc), str(path))


def record(mode="nvml", limit_w=200.0, **extra) -> dict:
    return {
        "host": HOST,
        "pid": 2**22 + 12345,
        "mode": mode,
        "cap_w": 300.0,
        **extra,
        "gpus": [{"index": 0, "uuid": "GPU-fake-0000", "original_limit_w": limit_w}],
    }


def test_a_command_in_a_planted_record_is_never_run_by_root(fake_nvml, var_tmp, run_cli):
    """The issue's case: nobody creates the state folder and a command-mode record; root's
    restore-caps (the epilog) and control's stale restore run nothing and change nothing."""
    state, pwned = var_tmp / "wattflex", var_tmp / "pwned"
    as_nobody("mkdir", "-m", "0755", str(state))
    plant(
        state / f"caps-{HOST}-999999.json",
        record("command", command=f"touch {pwned} {{gpu}} {{watts}}"),
    )
    fake_nvml.update_gpu(0, limit_mw=400_000)
    proc = run_cli("restore-caps", "--state-dir", state, cwd=var_tmp)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "untrusted" in proc.stdout and "owned by uid 65534" in proc.stdout
    caps.restore_from_state_dir(state)  # what `wattflex control` calls at start
    assert not pwned.exists() and limits_w() == [400.0, 700.0]
    assert fake_nvml.state()["set_calls"] == []


def test_a_planted_record_in_roots_own_folder_is_not_read(fake_nvml, var_tmp):
    """Root's folder, but the file is nobody's (a folder made writable by mistake is refused
    whole: the next test)."""
    state = var_tmp / "root-state"
    state.mkdir(mode=0o755)
    planted = state / f"caps-{HOST}-999999.json"
    planted.write_text(json.dumps(record()))
    os.chown(planted, NOBODY, NOBODY)
    (res,) = caps.restore_from_state_dir(state)
    assert res["action"] == "untrusted" and fake_nvml.state()["set_calls"] == []


def test_a_folder_others_can_write_or_a_link_is_refused_before_any_gpu_changes(fake_nvml, var_tmp):
    writable = var_tmp / "open"
    writable.mkdir()
    writable.chmod(0o777)
    link = var_tmp / "link"
    link.symlink_to(writable)
    theirs = var_tmp / "theirs"
    as_nobody("mkdir", "-m", "0700", str(theirs))
    for folder in (writable, link, theirs):
        with pytest.raises(caps.UnsafeStateDir, match="not used"):
            with caps.CapGuard(open_gpus(gpm=False), 300, "nvml", folder):
                pass
        assert fake_nvml.state()["set_calls"] == [] and limits_w() == [700.0, 700.0]
        (res,) = caps.restore_from_state_dir(folder)
        assert res["action"] == "untrusted"


def test_the_job_users_record_restores_the_cards_default_not_its_number(
    fake_nvml, var_tmp, run_cli, slurm_gres
):
    """The issue's second case: a record the job's user owns (the epilog trusts it, --job-uid)
    may say 200 W; root puts back the card's default limit, which that user cannot choose."""
    state = var_tmp / f"wattflex-{NOBODY}"
    as_nobody("mkdir", "-m", "0700", str(state))
    plant(state / f"caps-{HOST}-999999.json", record("command", limit_w=200.0, command="id -u"))
    fake_nvml.update_gpu(0, limit_mw=300_000)
    proc = run_cli(
        "restore-caps", "--state-dir", state, "--job-uid", NOBODY, "--job-gpus", "0", cwd=var_tmp
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "restored (GPU 0 -> 700 W)" in proc.stdout
    assert limits_w() == [700.0, 700.0] and fake_nvml.state()["set_calls"] == [[0, 700_000]]
    assert not list(state.glob("caps-*.json"))


def clock_record(**extra) -> dict:
    return {
        "host": HOST,
        "pid": 2**22 + 12345,
        "mode": "nvml",
        "clock_mhz": 345,
        **extra,
        "gpus": [{"index": 0, "uuid": "GPU-fake-0000"}],
    }


def test_a_planted_clock_record_is_refused_and_the_job_users_only_resets_to_the_default(
    fake_nvml, var_tmp, run_cli, slurm_gres
):
    """Clock records (``knob: clock``) go through the same reader as cap records: one that nobody
    planted in a folder of theirs is reported untrusted and no clock changes; the job user's own
    (the epilog trusts it, --job-uid) resets the lock to the driver's default, whatever clock or
    command it names: no record can set a clock."""
    state, pwned = var_tmp / "wattflex", var_tmp / "pwned"
    as_nobody("mkdir", "-m", "0755", str(state))
    plant(state / f"clocks-{HOST}-999999.json", clock_record(command=f"touch {pwned}"))
    proc = run_cli("restore-caps", "--state-dir", state, cwd=var_tmp)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "untrusted" in proc.stdout and "owned by uid 65534" in proc.stdout
    assert fake_nvml.state()["clock_calls"] == [] and not pwned.exists()

    mine = var_tmp / f"wattflex-{NOBODY}"
    as_nobody("mkdir", "-m", "0700", str(mine))
    plant(
        mine / f"clocks-{HOST}-999999.json", clock_record(clock_mhz=1980, command=f"touch {pwned}")
    )
    proc = run_cli(
        "restore-caps", "--state-dir", mine, "--job-uid", NOBODY, "--job-gpus", "0", cwd=var_tmp
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "GPU 0 clock lock reset" in proc.stdout
    assert fake_nvml.state()["clock_calls"] == [[0, "reset"]] and not pwned.exists()
    assert fake_nvml.state()["set_calls"] == [] and limits_w() == [700.0, 700.0]


def test_roots_own_record_is_clamped_to_the_cards_range(fake_nvml, tmp_path):
    state = tmp_path / "state"
    cap_state.write_record(state, f"caps-{HOST}-999999.json", record(limit_w=5000.0))
    fake_nvml.update_gpu(0, limit_mw=300_000)
    (res,) = caps.restore_from_state_dir(state)
    assert res["action"] == "restored" and res["gpus"][0]["restored_w"] == 700.0
    assert "clamped" in res["gpus"][0]["restored_from"] and limits_w() == [700.0, 700.0]


def test_the_record_is_never_written_through_a_planted_link(fake_nvml, var_tmp):
    """The issue's third case: links planted at the record's name and at the old predictable
    temporary name (``caps-<host>-<pid>.tmp``) in the folder; root's guard writes neither target."""
    state = var_tmp / "shared"
    state.mkdir(mode=0o755)
    target = var_tmp / "precious"
    target.write_text("root's file\n")
    name = f"caps-{HOST}-{os.getpid()}"
    for suffix in (".json", ".tmp"):
        (state / f"{name}{suffix}").symlink_to(target)
    with caps.CapGuard(open_gpus(gpm=False), 300, "nvml", state) as guard:
        assert (
            not guard.state_path.is_symlink()
            and json.loads(guard.state_path.read_text())["cap_w"] == 300.0
        )
        assert limits_w() == [300.0, 300.0]
    assert target.read_text() == "root's file\n" and limits_w() == [700.0, 700.0]
    assert "command" not in json.dumps(guard.record())


def test_a_record_names_no_command_and_restore_uses_the_installed_one(fake_nvml, tmp_path):
    """The restore command comes from the caller (restore-caps --cap-command, the run's own
    cap_command), never from the record: a record with a command restores through NVML."""
    fakes = Path(__file__).resolve().parents[3] / "fakes"
    template = f"{sys.executable} {fakes / 'fake_setcap.py'} {{gpu}} {{watts}}"
    with caps.CapGuard(
        open_gpus(set_limit=caps.limit_setter("command", template), gpm=False),
        350,
        "command",
        tmp_path / "st",
        template,
        handle_signals=False,
    ) as guard:
        assert "command" not in json.loads(guard.state_path.read_text())
        guard.applied = False  # leave the record, as SIGKILL would
    doc = json.loads(guard.state_path.read_text())
    doc["pid"] = 2**22 + 1
    doc["command"] = f"touch {tmp_path / 'pwned'} {{gpu}} {{watts}}"
    cap_state.write_record(tmp_path / "st", guard.state_path.name, doc)
    assert [r["action"] for r in caps.restore_from_state_dir(tmp_path / "st")] == ["restored"]
    assert not (tmp_path / "pwned").exists() and limits_w() == [700.0, 700.0]


def test_the_epilog_never_appends_through_a_planted_log_link(var_tmp, tmp_path):
    """The epilog's own log: a link in a folder another user can write is not followed
    (the message goes to syslog instead)."""
    state = tmp_path / "state"
    state.mkdir()
    (state / "caps-x-1.json").write_text("{}")
    target = tmp_path / "precious"
    target.write_text("root's file\n")
    (var_tmp / "epilog.log").symlink_to(target)
    stub = tmp_path / "wattflex"
    stub.write_text("#!/bin/bash\necho ran\n")
    stub.chmod(0o755)
    env = {
        **os.environ,
        "WATTFLEX": str(stub),
        "WATTFLEX_STATE_DIR": str(state),
        "WATTFLEX_EPILOG_LOG": str(var_tmp / "epilog.log"),
        "SLURM_JOB_ID": "7",
    }
    subprocess.run(
        ["bash", str(EPILOG)], env=env, capture_output=True, text=True, timeout=60, check=True
    )
    assert target.read_text() == "root's file\n"


def test_the_epilog_does_not_run_a_wattflex_another_user_can_write(tmp_path):
    state = tmp_path / "state"
    state.mkdir()
    (state / "caps-x-1.json").write_text("{}")
    stub = tmp_path / "wattflex"
    stub.write_text(f"#!/bin/bash\ntouch {tmp_path / 'ran'}\n")
    stub.chmod(0o777)
    env = {
        **os.environ,
        "WATTFLEX": str(stub),
        "WATTFLEX_STATE_DIR": str(state),
        "WATTFLEX_EPILOG_LOG": str(tmp_path / "epilog.log"),
        "SLURM_JOB_ID": "8",
    }
    proc = subprocess.run(
        ["bash", str(EPILOG)], env=env, capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 1 and not (tmp_path / "ran").exists()
    assert "is writable by group or others (mode 777)" in (tmp_path / "epilog.log").read_text()


def test_a_user_default_folder_is_their_own(monkeypatch):
    monkeypatch.delenv(cap_state.STATE_DIR_ENV, raising=False)
    assert cap_state.default_state_dir(0) == Path("/var/tmp/wattflex")
    assert cap_state.default_state_dir(1000) == Path("/var/tmp/wattflex-1000")


@pytest.mark.parametrize(
    "argv, said",
    [
        (
            ["--job-uid", "alice"],
            "argument --job-uid: 'alice': must be a whole number >= 0 and <= 4294967295",
        ),
        (["--job-uid", "-1"], "argument --job-uid: '-1': must be a whole number >= 0"),
        (
            ["--job-gpus", "0,gpu1"],
            "argument --job-gpus: '0,gpu1': expected GPU indices as SLURM lists them, e.g. 0,1",
        ),
        (
            ["--cap-command", "setcap {node} {watts}"],
            "--cap-command 'setcap {node} {watts}': has placeholder(s) {node}",
        ),
    ],
)
def test_restore_caps_refuses_a_bad_job_uid_or_cap_command_in_one_line(
    tmp_path, run_cli, argv, said
):
    proc = run_cli("restore-caps", "--state-dir", tmp_path, *argv, cwd=tmp_path)
    assert proc.returncode == 2 and said in proc.stderr and proc.stderr.count("\n") == 1, (
        proc.stderr
    )


# ---- issue 47: a user's record reaches only the GPUs SLURM gave that user's job -------------------
BOTH = [
    {"index": 0, "uuid": "GPU-fake-0000", "original_limit_w": 700.0},
    {"index": 1, "uuid": "GPU-fake-0001", "original_limit_w": 700.0},
]


def restore_as_epilog(run_cli, monkeypatch, state: Path, where: Path, job_gpus: str = "0"):
    """``restore-caps`` as root's epilog runs it for nobody's job on SLURM's GPUs ``job_gpus``."""
    monkeypatch.setenv("SLURM_JOB_UID", str(NOBODY))
    monkeypatch.setenv("SLURM_JOB_GPUS", job_gpus)
    return run_cli("restore-caps", "--state-dir", state, cwd=where)


def test_a_job_users_record_naming_another_jobs_gpu_lifts_no_cap_and_no_clock_lock(
    fake_nvml, var_tmp, run_cli, monkeypatch, slurm_gres
):
    """The issue's case: nobody's job ran on GPU 0; another job holds GPU 1 at a 300 W
    curtailment cap and a clock lock. nobody plants records naming GPU 1 (and GPU 0 too);
    root's epilog call (SLURM_JOB_UID, SLURM_JOB_GPUS as slurmd sets them) puts back GPU 0
    alone, leaves GPU 1 capped and locked, keeps the records and exits 1 (the node drains)."""
    state = var_tmp / f"wattflex-{NOBODY}"
    as_nobody("mkdir", "-m", "0700", str(state))
    plant(state / f"caps-{HOST}-999998.json", {**record(), "gpus": BOTH[1:]})
    plant(state / f"caps-{HOST}-999999.json", {**record(), "gpus": BOTH})
    plant(state / f"clocks-{HOST}-999999.json", {**clock_record(), "gpus": BOTH[1:]})
    fake_nvml.update_gpu(0, limit_mw=250_000)
    fake_nvml.update_gpu(1, limit_mw=300_000)
    proc = restore_as_epilog(run_cli, monkeypatch, state, var_tmp)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert limits_w() == [700.0, 300.0] and fake_nvml.state()["set_calls"] == [[0, 700_000]]
    assert fake_nvml.state()["clock_calls"] == []
    assert "GPU(s) 1 of this record of uid 65534 are not its job's (SLURM: 0)" in proc.stdout
    assert len(list(state.glob("*.json"))) == 3


# ---- issue 51: SLURM's GPU index is gres.conf order; a record's GPU is matched by UUID ----------
def test_a_job_users_record_reaches_its_jobs_gpu_where_gres_conf_order_is_not_nvmls(
    fake_nvml, var_tmp, run_cli, monkeypatch, slurm_gres
):
    """gres.conf lists /dev/nvidia1 first: SLURM's GPU 0 is NVML's GPU 1 (minor 1). nobody's job
    had SLURM's GPU 0; another job holds NVML's GPU 0 (SLURM's 1) at a 300 W cap. nobody's
    record names both NVML GPUs. Index digits would lift the other job's cap (NVML 0 "is" SLURM
    0); by device file, minor and UUID the epilog puts back NVML GPU 1 alone, keeps the record
    and exits 1."""
    slurm_gres([1, 0])
    state = var_tmp / f"wattflex-{NOBODY}"
    as_nobody("mkdir", "-m", "0700", str(state))
    plant(state / f"caps-{HOST}-999999.json", {**record(), "gpus": BOTH})
    fake_nvml.update_gpu(0, limit_mw=300_000)
    fake_nvml.update_gpu(1, limit_mw=250_000)
    proc = restore_as_epilog(run_cli, monkeypatch, state, var_tmp)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert limits_w() == [300.0, 700.0] and fake_nvml.state()["set_calls"] == [[1, 700_000]]
    assert "GPU(s) 0 of this record of uid 65534 are not its job's (SLURM: 0)" in proc.stdout
    assert len(list(state.glob("*.json"))) == 1


@pytest.mark.parametrize(
    "broken, said",
    [
        ("no slurmd", "slurmd -G could not run"),
        ("not nvidia", "(SLURM's GPU 0) is not an NVIDIA GPU device"),
        ("no such minor", "NVML has no GPU of minor 7"),
    ],
)
def test_where_slurms_gpus_cannot_be_mapped_nothing_of_the_users_record_is_restored(
    fake_nvml, var_tmp, run_cli, monkeypatch, slurm_gres, broken, said
):
    """No guess from index digits: one line saying why, the record kept, no limit changed, exit 1."""
    where = slurm_gres([0, 1])
    if broken == "no slurmd":
        monkeypatch.setattr(nvml, "SLURMD", str(where / "no-slurmd"))
    else:
        (where / "nvidia0").unlink()
        dev = os.makedev(1, 3) if broken == "not nvidia" else os.makedev(nvml.NVIDIA_MAJOR, 7)
        os.mknod(where / "nvidia0", 0o600 | stat.S_IFCHR, dev)
    state = var_tmp / f"wattflex-{NOBODY}"
    as_nobody("mkdir", "-m", "0700", str(state))
    plant(state / f"caps-{HOST}-999999.json", record())
    fake_nvml.update_gpu(0, limit_mw=300_000)
    proc = run_cli(
        "restore-caps", "--state-dir", state, "--job-uid", NOBODY, "--job-gpus", "0", cwd=var_tmp
    )
    assert proc.returncode == 1, proc.stdout + proc.stderr
    (line,) = [ln for ln in proc.stdout.splitlines() if "caps-" in ln]
    assert ": refused: " in line and said in line and "record kept" in line, line
    assert limits_w() == [300.0, 700.0] and fake_nvml.state()["set_calls"] == []
    assert len(list(state.glob("*.json"))) == 1


def test_without_the_jobs_gpus_a_job_users_record_changes_nothing(fake_nvml, var_tmp, run_cli):
    state = var_tmp / f"wattflex-{NOBODY}"
    as_nobody("mkdir", "-m", "0700", str(state))
    plant(state / f"caps-{HOST}-999999.json", record())
    fake_nvml.update_gpu(0, limit_mw=300_000)
    proc = run_cli("restore-caps", "--state-dir", state, "--job-uid", NOBODY, cwd=var_tmp)
    assert proc.returncode == 1 and "none were given (--job-gpus" in proc.stdout, proc.stdout
    assert limits_w() == [300.0, 700.0] and fake_nvml.state()["set_calls"] == []


# ---- issue 47: root runs a cap command only when root owns it end to end ---------------------------
def test_restore_caps_as_root_refuses_a_cap_command_another_user_can_change(
    fake_nvml, var_tmp, run_cli
):
    """The issue's case (a 0777 cap command ran as root), and its relatives: a command in a
    folder nobody owns, a root-owned script whose #! interpreter nobody owns, a relative program
    name (looked up in PATH). Each is refused before any record is read; none runs."""
    state = var_tmp / "root-state"
    state.mkdir(mode=0o755)
    cap_state.write_record(state, f"caps-{HOST}-999999.json", record())
    fake_nvml.update_gpu(0, limit_mw=300_000)
    ran = var_tmp / "ran"
    body = f"#!/bin/sh\ntouch {ran}\n"
    safe = Path(tempfile.mkdtemp(prefix="wattflex-bin-"))
    try:
        safe.chmod(0o755)
        open_cmd = safe / "open-setcap"
        open_cmd.write_text(body)
        open_cmd.chmod(0o777)
        theirs = var_tmp / "theirs"
        as_nobody("mkdir", "-m", "0755", str(theirs))
        as_nobody("sh", "-c", f"printf '%s' '{body}' > {theirs}/setcap; chmod 0755 {theirs}/setcap")
        shell = var_tmp / "their-shell"
        as_nobody("sh", "-c", f"printf '%s' '{body}' > {shell}; chmod 0755 {shell}")
        via_theirs = safe / "via-their-shell"
        via_theirs.write_text(f"#!{shell}\n")
        via_theirs.chmod(0o755)
        cases = {
            f"{open_cmd} {{gpu}} {{watts}}": f"{open_cmd} is writable by group or others (mode 0777)",
            f"{theirs}/setcap {{gpu}} {{watts}}": f"{theirs} is owned by uid {NOBODY}",
            f"{via_theirs} {{gpu}} {{watts}}": f"{shell} is owned by uid {NOBODY}",
            "setcap {gpu} {watts}": "its program 'setcap' is not an absolute path",
        }
        for command, said in cases.items():
            proc = run_cli(
                "restore-caps", "--state-dir", state, "--cap-command", command, cwd=var_tmp
            )
            assert proc.returncode == 2 and "not run as root" in proc.stderr, proc.stderr
            assert said in proc.stderr, proc.stderr
        assert not ran.exists() and limits_w() == [300.0, 700.0]
        assert list(state.glob("caps-*.json"))
    finally:
        shutil.rmtree(safe, ignore_errors=True)


def test_root_runs_a_cap_command_root_owns_end_to_end(fake_nvml, var_tmp, run_cli):
    """The same record restores through a root-owned command in a root-owned folder (inside a
    sticky world-writable one, as /tmp is), through its root-owned #! interpreter."""
    state = var_tmp / "root-state"
    state.mkdir(mode=0o755)
    cap_state.write_record(state, f"caps-{HOST}-999999.json", record())
    fake_nvml.update_gpu(0, limit_mw=300_000)
    safe = var_tmp / "bin"
    safe.mkdir(mode=0o755)
    fakes = Path(__file__).resolve().parents[3] / "fakes"
    setcap = safe / "setcap"
    setcap.write_text((fakes / "fake_setcap.py").read_text())
    setcap.chmod(0o755)
    shutil.copy(fakes / "fake_pynvml.py", safe / "fake_pynvml.py")
    command = f"{os.path.realpath(sys.executable)} {setcap} {{gpu}} {{watts}}"
    assert cap_state.command_problem(command.split()) is None
    proc = run_cli("restore-caps", "--state-dir", state, "--cap-command", command, cwd=var_tmp)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert limits_w() == [200.0, 700.0] and not list(state.glob("caps-*.json"))


# ---- issue 47: every open, rename and unlink through the folder descriptor held since the check ---
SWAPPER = """
import ctypes, os, sys, time
u, link, name, doc, stop = sys.argv[1:6]
libc = ctypes.CDLL(None, use_errno=True)
AT_FDCWD, RENAME_EXCHANGE = -100, 2  # renameat2(2): swap the two names atomically
dfd = os.open(u, os.O_RDONLY | os.O_DIRECTORY)
end = time.monotonic() + 120
while not os.path.exists(stop) and time.monotonic() < end:
    if name not in os.listdir(dfd):  # plant the record again in the real folder, whole
        fd = os.open(".tmp", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644, dir_fd=dfd)
        os.write(fd, doc.encode())
        os.close(fd)
        os.rename(".tmp", name, src_dir_fd=dfd, dst_dir_fd=dfd)
    if libc.renameat2(AT_FDCWD, u.encode(), AT_FDCWD, link.encode(), RENAME_EXCHANGE) != 0:
        sys.exit(f"renameat2: {os.strerror(ctypes.get_errno())}")
"""


def test_a_users_folder_swapped_for_a_link_to_roots_never_costs_root_its_record(
    fake_nvml, var_tmp, monkeypatch
):
    """The issue's race: while root restores the job user's record, that user swaps their folder
    for a link to root's folder (renameat2 RENAME_EXCHANGE, over and over). The old code removed
    the record by path again and so deleted root's live record of the same name. Bounded: 1000
    restores against one swapping process; root's record survives every one, and the user's own
    record is still restored (and removed) whenever its folder was the real one."""
    # the job's GPUs as slurmd's device files give them (other tests): here GPU 0, 1000 times over
    monkeypatch.setattr(caps, "slurm_job_gpu_uuids", lambda idx: frozenset({"GPU-fake-0000"}))
    mine, link = var_tmp / f"wattflex-{NOBODY}", var_tmp / "swap"
    as_nobody("mkdir", "-m", "0700", str(mine))
    roots = var_tmp / "root-state"
    roots.mkdir(mode=0o755)
    name = f"caps-{HOST}-999999.json"
    cap_state.write_record(roots, name, record())
    precious = (roots / name).read_text()
    as_nobody("ln", "-s", str(roots), str(link))
    stop = var_tmp / "stop"
    doc = json.dumps({**record(), "gpus": [{**record()["gpus"][0], "original_limit_w": 700.0}]})
    swapper = subprocess.Popen(
        ["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups", sys.executable]
        + ["-c", SWAPPER, str(mine), str(link), name, doc, str(stop)],
        stderr=subprocess.PIPE,
        text=True,
    )
    actions = []
    try:
        for _ in range(1000):  # the swapper has started: its first record is there
            if any(not d.is_symlink() and (d / name).exists() for d in (mine, link)):
                break
            time.sleep(0.01)
        for _ in range(1000):
            for res in caps.restore_from_state_dir(mine, job_uid=NOBODY, job_gpus={0}):
                actions.append(res["action"])
            kept = (roots / name).exists() and (roots / name).read_text() == precious
            assert kept, f"root's record lost after {len(actions)} restores"
            assert swapper.poll() is None, swapper.stderr.read()
    finally:
        stop.touch()
        swapper.wait(timeout=30)
    assert "restored" in actions and "untrusted" in actions, sorted(set(actions))


# ---- issue 47: the epilog runs only what root owns end to end ---------------------------------------
@pytest.fixture
def root_bin():
    """A root-owned 0755 folder (inside /tmp, which is sticky and world-writable)."""
    yield from folder_in_tmp("wattflex-rootbin-", 0o755)


def run_epilog(wattflex: Path, where: Path) -> tuple[subprocess.CompletedProcess, str]:
    """The shipped epilog, as slurmd runs it (root, a clean environment), with one record to restore."""
    state = where / "state"
    state.mkdir(exist_ok=True)
    (state / f"caps-{HOST}-999999.json").write_text("{}")
    env = {
        "PATH": "/usr/sbin:/usr/bin:/sbin:/bin",
        "WATTFLEX": str(wattflex),
        "WATTFLEX_STATE_DIR": str(state),
        "WATTFLEX_EPILOG_LOG": str(where / "epilog.log"),
        "SLURM_JOB_ID": "9",
    }
    proc = subprocess.run(
        ["bash", str(EPILOG)], env=env, capture_output=True, text=True, timeout=120
    )
    log = (where / "epilog.log").read_text() if (where / "epilog.log").exists() else ""
    return proc, log


def script(path: Path, text: str, mode: int = 0o755) -> Path:
    path.write_text(text)
    path.chmod(mode)
    return path


def test_the_epilog_does_not_run_a_root_script_whose_interpreter_another_user_owns(
    root_bin, var_tmp
):
    """The issue's case: a root-owned 0755 wattflex in a root folder whose #! interpreter is
    nobody's (a script of theirs, as the kernel allows): root would run their code."""
    ran = var_tmp / "ran"
    interp = var_tmp / "their-interpreter"
    as_nobody("sh", "-c", f"printf '#!/bin/sh\\ntouch {ran}\\n' > {interp}; chmod 0755 {interp}")
    wattflex = script(root_bin / "wattflex", f"#!{interp}\n")
    proc, log = run_epilog(wattflex, root_bin)
    assert proc.returncode == 1 and not ran.exists(), log
    assert f"{interp} is owned by uid {NOBODY}, not by root: not run as root; draining" in log


def test_the_epilog_does_not_run_a_root_wattflex_inside_a_folder_another_user_owns(var_tmp):
    """Root's 0755 wattflex, but in nobody's folder: they could swap it after any check."""
    theirs = var_tmp / "theirs"
    as_nobody("mkdir", "-m", "0755", str(theirs))
    wattflex = theirs / "wattflex"
    subprocess.run(["install", "-m", "0755", "/dev/null", str(wattflex)], check=True)
    script(wattflex, f"#!/bin/sh\ntouch {var_tmp / 'ran'}\n")
    where = var_tmp / "root-side"
    where.mkdir(mode=0o755)
    proc, log = run_epilog(wattflex, where)
    assert proc.returncode == 1 and not (var_tmp / "ran").exists(), log
    assert f"{theirs} is owned by uid {NOBODY}, not by root" in log


def test_the_epilog_does_not_run_an_interpreter_looked_up_in_path(root_bin, var_tmp):
    wattflex = script(root_bin / "wattflex", f"#!/usr/bin/env sh\ntouch {var_tmp / 'ran'}\n")
    proc, log = run_epilog(wattflex, root_bin)
    assert proc.returncode == 1 and not (var_tmp / "ran").exists(), log
    assert "names its interpreter through /usr/bin/env, which searches PATH" in log


def venv_with_wattflex(root_bin: Path, checkout: Path, ran: Path) -> tuple[Path, Path, str]:
    """A real venv (``python -m venv``) whose wattflex is an editable install of ``checkout``:
    a .pth file naming the checkout's folder, as pip's editable installs of a flat layout write,
    and the console script pip writes (``#!<venv>/bin/python``, ``from wattflex.cli import main``).
    The package's ``cli.main`` touches ``ran``: that it ran as root is what the test looks for."""
    venv = root_bin / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    (site,) = venv.glob("lib/python*/site-packages")
    (site / "__editable__.wattflex-0.1.0.pth").write_text(f"{checkout}\n")
    pkg = checkout / "wattflex"
    code = f"import pathlib\ndef main():\n    pathlib.Path({str(ran)!r}).touch()\n    return 0\n"
    return (
        script(
            venv / "bin" / "wattflex",
            f"#!{venv}/bin/python\nimport sys\nfrom wattflex.cli import main\nsys.exit(main())\n",
        ),
        pkg,
        code,
    )


def test_the_epilog_does_not_run_an_editable_install_from_a_checkout_another_user_can_write(
    root_bin, var_tmp
):
    """The issue's case: root's venv and console script, but the package is an editable install
    of a checkout nobody owns. Root would import their code; the same venv with the checkout
    root's runs (the positive control: the check refuses what it must, not everything)."""
    ran = var_tmp / "ran"
    checkout = var_tmp / "their-checkout"
    as_nobody("mkdir", "-p", "-m", "0755", str(checkout / "wattflex"))
    wattflex, pkg, code = venv_with_wattflex(root_bin, checkout, ran)
    (var_tmp / "cli.py").write_text(code)
    as_nobody("sh", "-c", f"touch {pkg}/__init__.py; cp {var_tmp / 'cli.py'} {pkg}/cli.py")
    proc, log = run_epilog(wattflex, root_bin)
    assert proc.returncode == 1 and not ran.exists(), log
    assert f"{checkout} is owned by uid {NOBODY}, not by root" in log

    shutil.rmtree(checkout)
    (checkout / "wattflex").mkdir(parents=True, mode=0o755)
    checkout.chmod(0o755)
    (pkg / "__init__.py").write_text("")
    (pkg / "cli.py").write_text(code)
    proc, log = run_epilog(wattflex, root_bin)
    assert proc.returncode == 0 and ran.exists(), log

    ran.unlink()
    (pkg / "cli.py").chmod(0o666)  # root's file, but anyone may rewrite it
    proc, log = run_epilog(wattflex, root_bin)
    assert proc.returncode == 1 and not ran.exists(), log
    assert f"{pkg / 'cli.py'} in the wattflex package is not root's, or others can write it" in log
