"""``wattflex doctor``: what a machine offers, read without changing anything.

On FAKE NVML GPUs (tests/fakes/fake_pynvml.py, marker fake_gpu, "fake" in the test name),
and on this machine as it is: nvidia-ml-py installed but no NVIDIA driver, so nvmlInit
fails. Everything else is real: /proc, the SLURM profile, files, a local HTTP server.
"""

import json
import socket
import sys
from pathlib import Path

import pytest
import yaml

from tests.fakes import fake_pynvml
from tests.fakes.dcgm_fixture import serve_metrics
from tests.fakes.nvml_fixture import fake_nvml, limits_w  # noqa: F401 (fixture)
from wattflex import cli, diagnosis
from wattflex.errors import UserError

REPO = Path(__file__).resolve().parents[2]
EMULATED = REPO / "config" / "config.yaml"
CAP_EFF_ALL, CAP_EFF_NONE = "000001ffffffffff", "0000000000000000"
CAP_EFF_NO_SYS_ADMIN = f"{0x1FFFFFFFFFF & ~(1 << 21):016x}"


def fitting(groups: list[dict]) -> list[dict]:
    """The default config's groups but those whose loss logits (65536 tokens per GPU) cannot
    fit a GPU: the resource plan refuses them (test_doctor_refuses_a_group_that_cannot_fit)."""
    return [g for g in groups if g.get("seq_len", 4096) * g.get("batch", 2) < 65536]


def cuda_config(tmp_path, **cuda) -> Path:
    cfg = yaml.safe_load(EMULATED.read_text())
    cfg.update(backend="cuda", cuda={"cap_control": "nvml", **cuda}, groups=fitting(cfg["groups"]))
    cfg["repeats"] = [r for r in cfg["repeats"] if r["group"] in {g["id"] for g in cfg["groups"]}]
    path = tmp_path / "cuda.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


def status_file(tmp_path, cap_eff: str) -> Path:
    path = tmp_path / "status"
    path.write_text(
        f"Name:\tpython\nUid:\t0\t0\t0\t0\nCapInh:\t0000000000000000\nCapEff:\t{cap_eff}\n"
    )
    return path


@pytest.fixture
def root_with_caps(monkeypatch, tmp_path):
    monkeypatch.setattr(diagnosis.os, "geteuid", lambda: 0)
    monkeypatch.setattr(diagnosis, "PROC_STATUS", status_file(tmp_path, CAP_EFF_ALL))


@pytest.fixture
def no_setter_calls(monkeypatch):
    """Any call of NVML's limit setter is recorded (and fails)."""
    calls = []

    def setter(handle, limit_mw):
        calls.append((handle, limit_mw))
        raise AssertionError("doctor must not set a power limit")

    monkeypatch.setattr(fake_pynvml, "nvmlDeviceSetPowerManagementLimit", setter)
    return calls


# ---- FAKE NVML: 2 x H200 -------------------------------------------------------------------------
@pytest.mark.fake_gpu
def test_fake_nvml_doctor_reports_two_h200_in_words_and_changes_nothing(
    fake_nvml, root_with_caps, no_setter_calls, tmp_path, capsys
):
    assert (
        cli.main(["doctor", "--configfile", str(EMULATED), "--state-dir", str(tmp_path / "st")])
        == 0
    )
    out = capsys.readouterr().out
    assert "observe-only: nothing was changed" in out
    assert "driver 570.124.06, NVML 12.570.124.06, CUDA driver 12.8, 2 GPU(s)" in out
    assert "fake_pynvml.py" in out  # the report names the NVML it used
    for i in (0, 1):
        assert (
            f"GPU {i}     NVIDIA H200 (GPU-fake-000{i}, PCI 00000000:{0x18 + 0x10 * i:02X}:00.0), drawing 650 W"
            in out
        )
    assert out.count("power limit 700 W (default 700, range 200-700, enforced 700)") == 2
    assert out.count("clocks SM 1980 MHz (max 1980), memory 3201 MHz (max 3201)") == 2
    assert (
        out.count(
            "GPM readable (dram_active 0.45, sm_active 0.9, tensor_active 0.6); persistence mode on"
        )
        == 2
    )
    assert (
        "could likely set power limits (inferred from effective uid 0, CAP_SYS_ADMIN in CapEff; not tried)"
        in out
    )
    assert "(backend emulated): needs nothing GPU-related from this machine: OK" in out
    assert (
        no_setter_calls == []
        and fake_nvml.state()["set_calls"] == []
        and limits_w() == [700.0, 700.0]
    )


@pytest.mark.fake_gpu
def test_fake_nvml_doctor_json_is_one_document_and_a_cuda_config_has_all_it_needs(
    fake_nvml, root_with_caps, no_setter_calls, tmp_path, capsys
):
    cfg = cuda_config(tmp_path)
    rc = cli.main(
        ["doctor", "--json", "--configfile", str(cfg), "--state-dir", str(tmp_path / "st")]
    )
    doc = json.loads(capsys.readouterr().out)
    nv = doc["nvml"]
    assert nv["available"] and nv["driver_version"] == "570.124.06" and len(nv["gpus"]) == 2
    g = nv["gpus"][1]
    assert (
        g["min_limit_w"],
        g["max_limit_w"],
        g["default_limit_w"],
        g["power_limit_w"],
        g["enforced_limit_w"],
    ) == (200.0, 700.0, 700.0, 700.0, 700.0)
    assert (
        g["gpm_readable"]
        and g["gpm_values"]["dram_active"] == 0.45
        and g["persistence_mode"] is True
    )
    assert doc["cap_permission"]["likely"] and doc["cap_permission"]["inferred"]
    # NVML and the permission are here; torch on this machine is a CPU build: that one is missing
    assert doc["config"]["needs"] == [
        "NVML",
        "at least one GPU",
        "torch with CUDA",
        "permission to set power limits",
        diagnosis.PLAN_NEED,
    ]
    assert all(p["fits"] for p in doc["config"]["plan"]) and len(doc["config"]["plan"]) == 31
    missing = [m["need"] for m in doc["config"]["missing"]]
    import torch

    assert missing == ([] if torch.cuda.is_available() else ["torch with CUDA"])
    assert rc == (0 if not missing else 1) and doc["ok"] == (not missing)
    assert (
        no_setter_calls == []
        and fake_nvml.state()["set_calls"] == []
        and limits_w() == [700.0, 700.0]
    )


@pytest.mark.fake_gpu
def test_fake_nvml_doctor_names_each_gpu_problem_and_what_it_costs(
    fake_nvml, root_with_caps, tmp_path, capsys
):
    fake_nvml.reset(n_gpus=2, path=tmp_path / "gpus.json", gpm="no_permission")
    fake_nvml.update_gpu(0, persistence=False)
    fake_nvml.update_gpu(
        1, limit_mw=400_000, extra_limit_w=300
    )  # capped before any run, and a policy below
    assert (
        cli.main(["doctor", "--configfile", str(EMULATED), "--state-dir", str(tmp_path / "st")])
        == 0
    )
    out = capsys.readouterr().out
    assert "GPU 0 (NVIDIA H200): GPM metrics unreadable (disabled: no permission to profile" in out
    assert (
        "no DRAM copy product, so no PFI prediction" in out
        and "NVreg_RestrictProfilingToAdminUsers=0" in out
    )
    assert "GPU 0 (NVIDIA H200): persistence mode is off" in out
    assert (
        "GPU 1 (NVIDIA H200): already capped at 400 W (default 700 W)" in out
        and "wattflex restore-caps" in out
    )
    assert "GPU 1 (NVIDIA H200): 300 W enforced below its 400 W limit" in out
    assert [g["limit_mw"] for g in fake_nvml.state()["gpus"]] == [
        700_000,
        400_000,
    ]  # read, not restored


@pytest.mark.fake_gpu
def test_fake_nvml_non_root_is_told_to_use_the_cap_command_and_a_cuda_config_fails(
    fake_nvml, monkeypatch, tmp_path, capsys
):
    monkeypatch.setattr(diagnosis.os, "geteuid", lambda: 1000)
    monkeypatch.setattr(diagnosis, "PROC_STATUS", status_file(tmp_path, CAP_EFF_NONE))
    assert (
        cli.main(
            [
                "doctor",
                "--configfile",
                str(cuda_config(tmp_path)),
                "--state-dir",
                str(tmp_path / "st"),
            ]
        )
        == 1
    )
    out = capsys.readouterr().out
    assert (
        "no permission to set power limits (inferred: effective uid 1000, CAP_SYS_ADMIN not in CapEff)"
        in out
    )
    assert "runs with cuda.cap_control: nvml fail at the first cap" in out
    assert "cuda.cap_control: command with cuda.cap_command" in out and "or run as root" in out
    assert (
        "- permission to set power limits: cuda.cap_control: nvml needs root (inferred: effective uid 1000"
        in out
    )
    assert "exit status 1" in out
    # the same config with an admin-approved command (its program exists) needs no permission
    cfg = cuda_config(
        tmp_path, cap_control="command", cap_command=f"{sys.executable} {{gpu}} {{watts}}"
    )
    report = diagnosis.diagnose(cfg, state_dir=tmp_path / "st")
    assert "permission to set power limits" not in report["config"]["needs"]
    assert "the cap command's program" in report["config"]["needs"]
    assert fake_nvml.state()["set_calls"] == []


def test_a_non_root_user_is_told_caps_need_root_and_pointed_to_the_documented_path(
    monkeypatch, tmp_path, default_config
):
    """Capping without root: the fix names the wrapper and sudoers rule (`wattflex setcap-rule`), the
    docs section and the exact cap_command; the config check says nvml needs root."""
    monkeypatch.setattr(diagnosis.os, "geteuid", lambda: 1000)
    monkeypatch.setattr(diagnosis, "PROC_STATUS", status_file(tmp_path, CAP_EFF_NONE))
    (p,) = diagnosis.probe_cap_permission()["problems"]
    assert p["what"].endswith("CAP_SYS_ADMIN not in CapEff): setting one needs root")
    cfg = {**default_config, "backend": "cuda", "groups": fitting(default_config["groups"])}
    (m,) = diagnosis.check_config(cfg, found(permission=False))["missing"]
    for fix in (p["fix"], m["detail"]):
        assert "capping without root (docs/slurm.md, 'Capping without root')" in fix
        assert (
            "the admin installs the wrapper /usr/local/sbin/wattflex-setcap and its sudoers rule, both printed "
            "by `wattflex setcap-rule`" in fix
        )
        assert (
            "cuda.cap_control: command with cuda.cap_command: "
            "'sudo -n /usr/local/sbin/wattflex-setcap {gpu} {watts}'" in fix
        )
    assert m["detail"].startswith("cuda.cap_control: nvml needs root (inferred: test)")
    installed = tmp_path / "sbin" / "wattflex-setcap"
    installed.parent.mkdir()
    installed.write_text("#!/usr/bin/python3 -I\n")
    assert (
        f"the wrapper is installed here ({installed}); then use cuda.cap_control: command with "
        f"cuda.cap_command: 'sudo -n {installed} {{gpu}} {{watts}}'"
        in diagnosis.without_root_fix(installed)
    )


@pytest.mark.skipif(
    diagnosis.shutil.which("sudo") is None or diagnosis.os.geteuid() != 0,
    reason="needs sudo, as root",
)
def test_a_sudo_cap_command_is_checked_with_sudo_l_and_never_run(default_config, tmp_path):
    """Root may run anything without a password, so root's check passes; the refusal of a
    non-root user is seen through real sudo in tests/unit/commands/test_setcap_rule.py."""
    ran = tmp_path / "ran"
    cfg = {
        **default_config,
        "backend": "cuda",
        "groups": fitting(default_config["groups"]),
        "cuda": {
            **default_config["cuda"],
            "cap_control": "command",
            "cap_command": f"sudo -n /usr/bin/touch {ran} {{gpu}} {{watts}}",
        },
    }
    c = diagnosis.check_config(cfg, found())
    assert "sudo allowing the cap command without a password" in c["needs"] and c["missing"] == []
    assert not ran.exists()


# ---- permission inference ------------------------------------------------------------------------
@pytest.mark.parametrize(
    "euid, cap_eff, likely, basis",
    [
        (0, CAP_EFF_ALL, True, "effective uid 0, CAP_SYS_ADMIN in CapEff"),
        (0, CAP_EFF_NO_SYS_ADMIN, False, "root without it: a container?"),
        (1000, CAP_EFF_NONE, False, "effective uid 1000, CAP_SYS_ADMIN not in CapEff"),
        (
            1000,
            f"{1 << 21:016x}",
            True,
            "effective uid 1000, CAP_SYS_ADMIN in CapEff",
        ),  # a granted capability
    ],
)
def test_permission_is_inferred_from_cap_sys_admin_as_the_driver_checks_it(
    euid, cap_eff, likely, basis, monkeypatch, tmp_path
):
    monkeypatch.setattr(diagnosis.os, "geteuid", lambda: euid)
    monkeypatch.setattr(diagnosis, "PROC_STATUS", status_file(tmp_path, cap_eff))
    p = diagnosis.probe_cap_permission()
    assert p["likely"] is likely and basis in p["basis"] and p["inferred"] is True
    assert bool(p["problems"]) is (not likely)


@pytest.mark.parametrize("euid, likely", [(0, True), (1000, False)])
def test_permission_falls_back_to_the_effective_uid_without_capeff(
    euid, likely, monkeypatch, tmp_path
):
    monkeypatch.setattr(diagnosis.os, "geteuid", lambda: euid)
    monkeypatch.setattr(diagnosis, "PROC_STATUS", tmp_path / "absent")
    p = diagnosis.probe_cap_permission()
    assert (
        p["likely"] is likely and p["cap_sys_admin"] is None and "CapEff unreadable" in p["basis"]
    )


# ---- this machine: no NVIDIA driver ----------------------------------------------------------------
@pytest.fixture
def real_pynvml(monkeypatch):
    monkeypatch.delitem(sys.modules, "pynvml", raising=False)
    import pynvml

    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError:
        return pynvml
    pynvml.nvmlShutdown()
    pytest.skip("this machine has an NVIDIA driver: the no-NVML case cannot be seen here")


def test_without_nvml_doctor_says_what_is_lost_and_exits_0_for_the_emulated_config(
    real_pynvml, tmp_path, capsys
):
    assert (
        cli.main(["doctor", "--configfile", str(EMULATED), "--state-dir", str(tmp_path / "st")])
        == 0
    )
    out = capsys.readouterr().out
    assert "NVML        unavailable: nvmlInit failed:" in out
    assert (
        "no power caps and no NVML telemetry: backend cuda runs need NVML unless cuda.sampler: false"
        in out
    )
    assert "The emulated backend needs none of it" in out
    assert "(backend emulated): needs nothing GPU-related from this machine: OK" in out


def test_without_nvml_a_cuda_config_exits_1_with_what_is_missing(real_pynvml, tmp_path, capsys):
    cfg = cuda_config(tmp_path)
    assert cli.main(["doctor", "--configfile", str(cfg), "--state-dir", str(tmp_path / "st")]) == 1
    out = capsys.readouterr().out
    assert "(backend cuda, cuda.device cuda, cap_control nvml, sampler on) is missing" in out
    assert "  - NVML: nvmlInit failed:" in out and "  - at least one GPU:" in out
    assert (
        cli.main(
            ["doctor", "--json", "--configfile", str(cfg), "--state-dir", str(tmp_path / "st")]
        )
        == 1
    )
    doc = json.loads(capsys.readouterr().out)
    assert doc["ok"] is False and doc["nvml"]["available"] is False
    assert {"NVML", "at least one GPU"} <= {m["need"] for m in doc["config"]["missing"]}


def test_a_cpu_smoke_config_needs_nothing_of_a_gpu(real_pynvml, tmp_path, capsys):
    cfg = cuda_config(tmp_path, device="cpu", cap_control="observe", sampler=False)
    assert cli.main(["doctor", "--configfile", str(cfg), "--state-dir", str(tmp_path / "st")]) == 0
    assert (
        "(backend cuda, cuda.device cpu, cap_control observe, sampler off): needs nothing"
        in capsys.readouterr().out
    )


# ---- what a config needs, on given findings --------------------------------------------------------
def found(nvml=True, gpus=1, torch_cuda=True, permission=True):
    return {
        "nvml": {
            "available": nvml,
            "error": None if nvml else "nvmlInit failed",
            "gpus": [{"name": "NVIDIA H200"}] * gpus if nvml else [],
        },
        "torch": {
            "version": "2.x",
            "built_with_cuda": "12.8",
            "cuda_available": torch_cuda,
            "device_count": gpus if torch_cuda else 0,
            "devices": [],
        },
        "cap_permission": {"likely": permission, "basis": "test"},
    }


def test_check_config_lists_only_what_the_cuda_section_uses(default_config):
    cfg = {**default_config, "backend": "cuda", "groups": fitting(default_config["groups"])}
    assert (
        diagnosis.check_config({**cfg, "backend": "emulated"}, found(False, 0, False, False))[
            "needs"
        ]
        == []
    )
    full = diagnosis.check_config(cfg, found())
    assert full["missing"] == [] and len(full["needs"]) == 5
    c = diagnosis.check_config(
        {**cfg, "cuda": {**cfg["cuda"], "cap_control": "observe"}}, found(permission=False)
    )
    assert c["missing"] == [] and "permission to set power limits" not in c["needs"]
    command = {"cap_control": "command", "cap_command": "/nonexistent/setcap {gpu} {watts}"}
    c = diagnosis.check_config({**cfg, "cuda": {**cfg["cuda"], **command}}, found())
    assert [m["need"] for m in c["missing"]] == ["the cap command's program"]
    c = diagnosis.check_config(
        {**cfg, "sweep": "staircase", "cuda": {**cfg["cuda"], "cap_control": "observe"}}, found()
    )
    assert [m["need"] for m in c["missing"]] == [
        "sweep: staircase on cuda: settable caps and the sampler"
    ]
    c = diagnosis.check_config(
        {**cfg, "cuda": {**cfg["cuda"], "cap_control": "sudo-please"}}, found()
    )
    assert (
        c["missing"][0]["need"] == "a valid cuda: section"
        and "cap_control" in c["missing"][0]["detail"]
    )
    h100 = found()
    h100["nvml"]["gpus"] = [{"name": "NVIDIA H100 80GB HBM3"}]
    assert (
        diagnosis.check_config(cfg, h100)["warnings"] == []
    )  # the paper's campaign has H100 groups too
    h200_only = {**cfg, "groups": [g for g in cfg["groups"] if g.get("gpu", "H200") == "H200"]}
    assert diagnosis.check_config(h200_only, h100)["warnings"] == [
        "the config's groups are for H200; this machine has NVIDIA H100 80GB HBM3"
    ]


def test_doctor_refuses_a_group_that_cannot_fit_naming_it_and_the_numbers(
    real_pynvml, tmp_path, capsys
):
    cfg = yaml.safe_load(EMULATED.read_text())
    cfg.update(
        backend="cuda",
        cuda={"random_init": True, "cap_control": "observe", "sampler": False},
        repeats=[],
        groups=[
            {"id": "dense-pt-llama70b-x1", "model": "Llama-3.1-70B", "task": "pt", "gpus": 1},
            {
                "id": "dense-pt-llama70b-x8",
                "model": "Llama-3.1-70B",
                "task": "pt",
                "gpus": 8,
                "seq_len": 2048,
                "precision": "bf16",
            },
        ],
    )
    path = tmp_path / "cuda.yaml"
    path.write_text(yaml.safe_dump(cfg))
    assert (
        cli.main(
            ["doctor", "--json", "--configfile", str(path), "--state-dir", str(tmp_path / "st")]
        )
        == 1
    )
    doc = json.loads(capsys.readouterr().out)
    short = [m for m in doc["config"]["missing"] if m["need"].startswith(diagnosis.PLAN_NEED)]
    assert [m["need"] for m in short] == [f"{diagnosis.PLAN_NEED}: group dense-pt-llama70b-x1"]
    assert (
        short[0]["detail"].startswith("GPU memory: needs ")
        and "GiB per H200, 133.9 GiB usable" in short[0]["detail"]
    )
    assert [p["fits"] for p in doc["config"]["plan"]] == [False, True]
    assert cli.main(["doctor", "--configfile", str(path), "--state-dir", str(tmp_path / "st")]) == 1
    assert (
        f"  - {diagnosis.PLAN_NEED}: group dense-pt-llama70b-x1: GPU memory: needs"
        in capsys.readouterr().out
    )


# ---- DCGM exporter, RAPL, SLURM profile, cap state --------------------------------------------------
SCRAPE = """# HELP DCGM_FI_DEV_POWER_USAGE Power draw (in W).
# TYPE DCGM_FI_DEV_POWER_USAGE gauge
DCGM_FI_DEV_POWER_USAGE{gpu="0",UUID="GPU-1"} 312.5
DCGM_FI_DEV_SM_CLOCK{gpu="0",UUID="GPU-1"} 1980
DCGM_FI_PROF_DRAM_ACTIVE{gpu="0",UUID="GPU-1"} 0.41
"""


@pytest.fixture
def exporter():
    with serve_metrics([SCRAPE]) as url:
        yield url


def test_dcgm_exporter_metrics_are_mapped_to_telemetry_columns(exporter):
    d = diagnosis.probe_dcgm(exporter)
    assert d["exporter"] == {
        "reachable": True,
        "metrics": 3,
        "telemetry_columns": ["dram_active", "power_w", "sm_clock_mhz"],
    }
    lacking = [p for p in d["problems"] if "dcgm-exporter" in p["what"]]
    assert (
        len(lacking) == 1 and "tensor_active" in lacking[0]["what"] and "NaN" in lacking[0]["loses"]
    )


def test_dcgm_exporter_unreachable_or_not_a_url():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # bound, not listening: refused at once
        d = diagnosis.probe_dcgm(f"http://127.0.0.1:{port}/metrics")
    assert d["exporter"]["reachable"] is False and any(
        "unreachable" in p["what"] for p in d["problems"]
    )
    with pytest.raises(UserError, match="expected an http"):
        diagnosis.probe_dcgm("localhost:9400")
    assert cli.main(["doctor", "--dcgm-exporter", "localhost:9400"]) == 2


def test_host_power_readable_rapl_zones(tmp_path):
    zone = tmp_path / "intel-rapl:0"
    zone.mkdir()
    (zone / "name").write_text("package-0\n")
    (zone / "energy_uj").write_text("12345\n")
    h = diagnosis.probe_host_power(tmp_path)
    assert h["available"] and h["zones"]["host_cpu_w"] == [str(zone)] and not h["problems"]
    absent = diagnosis.probe_host_power(tmp_path / "none")
    assert (
        not absent["available"]
        and "host_cpu_w / host_dram_w are NaN" in absent["problems"][0]["loses"]
    )


def test_slurm_profile_as_shipped_is_flagged_and_an_adapted_one_is_not(tmp_path):
    s = diagnosis.probe_slurm()
    assert (s["partition"], s["account"], s["gpus_per_node"], s["gpu_model"]) == (
        "gpu",
        "my_account",
        8,
        "gpu_model",
    )
    assert s["requests"] == {"H200": "--gpus=h200:<n>", "H100": "--gpus=h100:<n>"}
    assert s["check"] == "sinfo -p gpu -o '%P %G %f %D'"
    assert any(
        "still has the shipped slurm_partition 'gpu' and slurm_account 'my_account'" in p["what"]
        for p in s["problems"]
    )
    prof = yaml.safe_load(diagnosis.SLURM_PROFILE.read_text())
    prof["default-resources"].update(slurm_partition="'hopper'", slurm_account="'proj42'")
    prof["config"].update(slurm_gpu_model="constraint", slurm_gpu_names={"H200": "h200x"})
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(prof))
    s = diagnosis.probe_slurm(path)
    assert s["partition"] == "hopper" and s["requests"] == {"H200": "--gpus=<n> -C h200x"}
    assert not any("shipped" in p["what"] for p in s["problems"])


def test_cap_state_files_of_killed_runs_are_listed_not_restored(tmp_path):
    state = tmp_path / "st"
    state.mkdir()
    dead = state / f"caps-{socket.gethostname()}-999999999.json"
    dead.write_text(
        json.dumps(
            {"pid": 999999999, "mode": "nvml", "gpus": [{"index": 0, "original_limit_w": 700.0}]}
        )
    )
    c = diagnosis.probe_cap_state(state)
    assert c["stale"] == 1 and c["files"][0]["action"] == "would restore" and dead.is_file()
    assert "wattflex restore-caps" in c["problems"][0]["fix"]


def test_clock_lock_files_of_killed_runs_are_listed_not_reset(tmp_path):
    state = tmp_path / "st"
    state.mkdir()
    dead = state / f"clocks-{socket.gethostname()}-999999999.json"
    dead.write_text(
        json.dumps({"pid": 999999999, "mode": "nvml", "clock_mhz": 1200, "gpus": [{"index": 0}]})
    )
    c = diagnosis.probe_cap_state(state)
    assert c["stale"] == 0 and c["stale_clocks"] == 1 and dead.is_file()
    assert [f["action"] for f in c["files"]] == ["would restore"]
    assert (
        "clock-lock state file(s)" in c["problems"][0]["what"]
        and "restore-caps" in c["problems"][0]["fix"]
    )


def test_a_missing_configfile_is_a_user_error(tmp_path, capsys):
    assert cli.main(["doctor", "--configfile", str(tmp_path / "nope.yaml")]) == 2
    assert "no such file" in capsys.readouterr().err
