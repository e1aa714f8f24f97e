"""The job's GPUs by UUID and PCI bus id (``devices.nvml.job_gpus``) on a FAKE driver-like
NVML (tests/fakes/fake_pynvml.py): a node of 8 GPUs whose device cgroup grants this process
some of them, in both ways a driver counts (every GPU with NO_PERMISSION for the others, as
``nvmlDeviceGetCount_v2``; only the granted ones, as ``_v1``), with the environment SLURM
sets (``gres_common.c``: job-local ``CUDA_VISIBLE_DEVICES`` under ConstrainDevices, global
``SLURM_JOB_GPUS``; a gres.conf ``UniqueId`` puts UUIDs in ``CUDA_VISIBLE_DEVICES``)."""

import json
import logging

import pytest

from tests.fakes import fake_pynvml
from tests.fakes.nvml_fixture import fake_nvml  # noqa: F401 (fixture)
from wattflex.runs.devices import caps, nvml

pytestmark = pytest.mark.fake_gpu

UUIDS_4_7 = [f"GPU-fake-{i:04d}" for i in (4, 5, 6, 7)]
SLURM_CONFINED = {"CUDA_VISIBLE_DEVICES": "0,1,2,3", "SLURM_JOB_GPUS": "4,5,6,7"}


@pytest.fixture(params=["all", "accessible"])
def node_4_7(request, fake_nvml, monkeypatch):
    """8 GPUs; this process's cgroup grants 4-7; the driver counts ``request.param``."""
    fake_nvml.reset(n_gpus=8, path=fake_pynvml._state_path())
    monkeypatch.setenv(fake_pynvml.DEVICES_ENV, "4,5,6,7")
    monkeypatch.setenv(fake_pynvml.COUNT_ENV, request.param)
    for var in ("SLURM_JOB_GPUS", "SLURM_STEP_GPUS", "CUDA_VISIBLE_DEVICES"):
        monkeypatch.delenv(var, raising=False)
    return request.param


def _uuids(gpus):
    return [g.uuid for g in gpus]


def test_a_confined_job_on_gpus_4_to_7_opens_those_four(node_4_7, monkeypatch):
    for var, value in SLURM_CONFINED.items():
        monkeypatch.setenv(var, value)
    assert _uuids(nvml.job_gpus()) == UUIDS_4_7
    opened = nvml.open_gpus(gpm=False)
    assert [g.uuid for g in opened] == UUIDS_4_7
    assert [g.pci_bus_id for g in opened] == [
        f"00000000:{0x18 + 0x10 * i:02X}:00.0" for i in (4, 5, 6, 7)
    ]
    assert all(g.sample(0.0)["power_w"] > 0 for g in opened)
    assert _uuids(nvml.job_gpus(2)) == UUIDS_4_7[:2]


@pytest.mark.parametrize(
    "env",
    [
        {"SLURM_JOB_GPUS": "4,5,6,7"},  # the epilog, a step without CUDA_VISIBLE_DEVICES
        {"SLURM_STEP_GPUS": "4,5,6,7", "SLURM_JOB_GPUS": "0,1,2,3,4,5,6,7"},  # the step's first
        {"CUDA_VISIBLE_DEVICES": ",".join(UUIDS_4_7)},  # gres.conf UniqueId
        {"CUDA_VISIBLE_DEVICES": "GPU-fake-0005,GPU-fake-0004"},  # CUDA's order is the list's
    ],
)
def test_the_job_is_found_from_what_slurm_or_cuda_name(node_4_7, monkeypatch, env):
    for var, value in env.items():
        monkeypatch.setenv(var, value)
    want = env.get("CUDA_VISIBLE_DEVICES", ",".join(UUIDS_4_7)).split(",")
    assert _uuids(nvml.job_gpus()) == want


def test_a_gpu_slurm_gives_the_job_but_nvml_refuses_is_one_clear_line(node_4_7, monkeypatch):
    monkeypatch.setenv(fake_pynvml.DEVICES_ENV, "4,5,6")
    monkeypatch.setenv("SLURM_JOB_GPUS", "4,5,6,7")
    with pytest.raises(nvml.GpuIdentityError) as err:
        nvml.job_gpus()
    assert "\n" not in str(err.value)
    if node_4_7 == "all":
        assert "GPU 7 is this job's (SLURM_JOB_GPUS) but NVML refuses" in str(err.value)
    else:
        assert "names 4 GPU(s) but NVML lets this process open 3" in str(err.value)


def test_without_slurm_the_gpus_nvml_opens_are_the_jobs(node_4_7):
    assert _uuids(nvml.job_gpus()) == UUIDS_4_7
    with pytest.raises(nvml.GpuIdentityError, match="wants 5 GPUs on this node but it may open 4"):
        nvml.job_gpus(5)


def test_a_record_of_another_jobs_gpu_is_refused_by_uuid_not_opened_by_index(node_4_7):
    assert nvml.NvmlGpu(0, uuid="GPU-fake-0006", gpm=False).uuid == "GPU-fake-0006"
    with pytest.raises(nvml.GpuIdentityError, match="GPU GPU-fake-0001: NVML cannot open it"):
        nvml.NvmlGpu(1, uuid="GPU-fake-0001", gpm=False)


def test_an_unconfined_slurm_job_uses_the_nodes_indices(fake_nvml, monkeypatch):
    """task/none: CUDA_VISIBLE_DEVICES carries the node's indices, every GPU opens."""
    fake_nvml.reset(n_gpus=8, path=fake_pynvml._state_path())
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "4,5,6,7")
    monkeypatch.setenv("SLURM_JOB_GPUS", "4,5,6,7")
    assert _uuids(nvml.job_gpus()) == UUIDS_4_7


@pytest.mark.parametrize("missing", ["new_calls", "old_calls"])
def test_temperature_and_clock_reasons_from_either_nvml_call(fake_nvml, caplog, missing):
    """The successors of the deprecated calls where the driver has them, the old calls where it
    answers FUNCTION_NOT_FOUND; either way the row has the values and no warning."""
    fake_nvml.reset(n_gpus=1, path=fake_pynvml._state_path(), **{missing: False})
    fake_nvml.update_gpu(0, limit_mw=300_000)
    gpu = nvml.NvmlGpu(0, gpm=False)
    with caplog.at_level(logging.WARNING):
        rows = [gpu.sample(0.0), gpu.sample(1.0)]
    assert [r["temp_c"] for r in rows] == [55.0, 55.0]
    assert [r["clock_event_reasons"] for r in rows] == [4.0, 4.0]  # SW power cap
    assert "cannot read" not in caplog.text


def test_restore_inside_a_confined_job_goes_by_uuid(node_4_7, tmp_path):
    """Records left on the node: one of another job's GPU 1 (refused here: a one-line failure,
    the epilog restores it), one of this job's GPU 5 written where NVML numbered it 1."""
    state = tmp_path / "caps"
    state.mkdir(mode=0o700)
    for n, (index, uuid) in enumerate([(1, "GPU-fake-0001"), (1, "GPU-fake-0005")]):
        fake_pynvml.update_gpu(int(uuid[-1]), limit_mw=300_000)
        doc = {
            "host": caps.socket.gethostname(),
            "pid": 2**22 + n,
            "mode": "nvml",
            "cap_w": 300.0,
            "gpus": [{"index": index, "uuid": uuid, "original_limit_w": 700.0}],
        }
        (state / f"caps-{doc['host']}-{doc['pid']}.json").write_text(json.dumps(doc))
    done = {r["gpus"][0]["uuid"]: r for r in caps.restore_from_state_dir(state)}
    assert done["GPU-fake-0001"]["action"] == "failed"
    assert done["GPU-fake-0001"]["error"] == (
        "GPU GPU-fake-0001: NVML cannot open it (no permission: not this job's GPU)"
    )
    assert done["GPU-fake-0005"]["action"] == "restored"
    limits = [g["limit_mw"] for g in fake_pynvml.state()["gpus"]]
    assert limits[1] == 300_000 and limits[5] == 700_000


def test_the_identity_table_joins_cuda_nvml_and_nvidia_smi_by_uuid(node_4_7, monkeypatch):
    """What benchmarks/gpu_check.py's identity step prints: CUDA's UUIDs (torch's form, no GPU-
    prefix) and nvidia-smi's CSV rows (its own job-local numbering here) matched by UUID."""
    for var, value in SLURM_CONFINED.items():
        monkeypatch.setenv(var, value)
    cuda = [u.removeprefix("GPU-") for u in UUIDS_4_7[::-1]]  # CUDA_DEVICE_ORDER may differ
    smi = "\n".join(
        f"{k}, {u}, 00000000:{0x18 + 0x10 * (k + 4):02X}:00.0" for k, u in enumerate(UUIDS_4_7)
    )
    rows = nvml.identity_table(nvml.job_gpus(), cuda, smi)
    assert [r["uuid"] for r in rows] == UUIDS_4_7
    assert [r["cuda_ordinal"] for r in rows] == [3, 2, 1, 0]
    assert [r["nvidia_smi_index"] for r in rows] == [0, 1, 2, 3]
    assert [r["nvml_index"] for r in rows] == ([4, 5, 6, 7] if node_4_7 == "all" else [0, 1, 2, 3])
    assert all(r["cuda_ordinal"] is None for r in nvml.identity_table(nvml.job_gpus(), None, None))
