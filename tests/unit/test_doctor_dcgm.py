"""``wattflex doctor --configfile`` with ``cuda.telemetry: dcgm | auto``: whether DCGM answers
as the config would read it (FAKE ``dcgmi`` on PATH, tests/fakes/fake_dcgmi.py; a real HTTP
exporter endpoint on 127.0.0.1), on FAKE NVML GPUs."""

import pytest

from tests.fakes import fake_dcgmi
from tests.fakes.dcgm_fixture import exporter_url, fake_dcgmi_on_path  # noqa: F401 (fixtures)
from tests.fakes.nvml_fixture import fake_nvml  # noqa: F401 (fixture)
from tests.unit.test_doctor import cuda_config
from wattflex import diagnosis

NEED_DMON = "DCGM answering (dmon)"


def config_check(tmp_path, **cuda):
    return diagnosis.diagnose(
        cuda_config(tmp_path, cap_control="observe", **cuda), state_dir=tmp_path / "st"
    )["config"]


@pytest.mark.fake_gpu
def test_fake_nvml_dcgm_dmon_needs_the_host_engine_answering(
    fake_nvml, fake_dcgmi_on_path, tmp_path, monkeypatch
):
    c = config_check(tmp_path, telemetry="dcgm")
    assert NEED_DMON in c["needs"] and not [m for m in c["missing"] if m["need"] == NEED_DMON]
    assert c["telemetry"]["dcgm_answers"] and c["telemetry"]["dcgm"]["fields"] == [
        1005,
        1002,
        1004,
        203,
        204,
    ]
    monkeypatch.setenv(fake_dcgmi.DOWN_ENV, "1")
    c = config_check(tmp_path, telemetry="dcgm")
    (miss,) = [m for m in c["missing"] if m["need"] == NEED_DMON]
    assert (
        "dcgmi dmon -e 1005,1002,1004,203,204 -c 1 exited 255: Error: Unable to connect to host engine"
        in miss["detail"]
        and "nv-hostengine" in miss["detail"]
    )


@pytest.mark.fake_gpu
def test_fake_nvml_dcgm_exporter_mode_asks_the_configured_url(fake_nvml, exporter_url, tmp_path):
    c = config_check(tmp_path, telemetry="dcgm", dcgm={"mode": "exporter", "url": exporter_url})
    assert "DCGM answering (exporter)" in c["needs"] and c["telemetry"]["dcgm_answers"]
    c = config_check(
        tmp_path, telemetry="dcgm", dcgm={"mode": "exporter", "url": "http://127.0.0.1:9/metrics"}
    )
    (miss,) = [m for m in c["missing"] if m["need"] == "DCGM answering (exporter)"]
    assert "127.0.0.1:9" in miss["detail"]


@pytest.mark.fake_gpu
def test_fake_nvml_auto_warns_only_where_gpm_is_unreadable_and_dcgm_silent(
    fake_nvml, tmp_path, monkeypatch
):
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))  # no dcgmi anywhere
    assert "telemetry" not in config_check(
        tmp_path, telemetry="auto"
    )  # GPM readable: NVML, nothing to ask
    fake_nvml.reset(n_gpus=2, path=tmp_path / "gpus.json", gpm="no_permission")
    c = config_check(tmp_path, telemetry="auto")
    assert any(
        "GPM is unreadable on 2 GPU(s) and DCGM does not answer (dcgmi not found on PATH" in w
        for w in c["warnings"]
    )
    assert not [m for m in c["missing"] if "DCGM" in m["need"]]
