"""``run_real`` (backend: cuda) on CPU without torchrun: launch commands, rendezvous, telemetry
from steps, node alignment, NCCL settings (a FAKE torchrun), a refusal before any cap on FAKE
NVML GPUs (tests/fakes/fake_pynvml.py), and ``cuda_spec``, the spec the real-run tests share.
End to end, real torchrun training of a tiny model: tests/workflow/torchrun/test_real_run.py."""

import json
import socket
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml

from tests.fakes.nvml_fixture import fake_nvml  # noqa: F401 (fixture)
from wattflex.runs import real_run
from wattflex.runs.devices.base import EXTRA_COLUMNS, telemetry_frame
from wattflex.telemetry import TELEMETRY_COLUMNS, job_series

REPO = Path(__file__).resolve().parents[3]
CATALOG = yaml.safe_load((REPO / "config" / "models.yaml").read_text())["models"]


def cuda_spec(tmp_path, model="Qwen3-30B-A3B", task="lora", **cuda):
    spec = {
        "campaign": "smoke",
        "run_id": "g1-cap400",
        "cap_w": 400.0,
        "repeat": 0,
        "seed": 3,
        "backend": "cuda",
        "group": {
            "id": "g1",
            "model": model,
            "task": task,
            "gpus": 1,
            "seq_len": 32,
            "batch": 2,
            "ep": 1,
            "compile": False,
            "grad_checkpointing": False,
            "lora_rank": 4,
            "gpu": "H200",
        },
        "model_facts": CATALOG[model],
        "run": {
            "duration_s": 120,
            "sample_period_s": 0.2,
            "eval_at_s": 0.0,
            "checkpoint_at_s": 0.0,
            "gap_s": 60,
        },
        "cuda": {
            "device": "cpu",
            "cap_control": "observe",
            "cap_command": None,
            "model_path": None,
            "data_path": None,
            "tiny": True,
            "sampler": False,
            "sampler_period_s": 0.2,
            "state_dir": str(tmp_path / "state"),
            "nproc_per_node": 1,
            "max_steps": 12,
            "eval_batches": 1,
        },
    }
    spec["cuda"].update(cuda)
    return spec


def test_fake_nvml_missing_model_fails_before_any_cap(fake_nvml, tmp_path):
    spec = cuda_spec(tmp_path, cap_control="nvml", sampler=True, tiny=False)
    with pytest.raises(FileNotFoundError, match="no model weights"):
        real_run.run_real(spec, tmp_path / "run")
    assert fake_nvml.state()["set_calls"] == [] and not (tmp_path / "state").exists()


def _cmdline_has(proc_dir: Path, text: str) -> bool:
    try:
        return text in (proc_dir / "cmdline").read_bytes().decode(errors="replace")
    except OSError:
        return False


def test_telemetry_from_steps_marks_only_training_time_busy():
    steps = pd.DataFrame(
        {"step": [1, 2, 3], "t_end_s": [2.0, 2.5, 4.5], "step_time_s": [0.5, 0.5, 0.5]}
    )
    events = [{"event": "eval", "t_start_s": 2.6, "t_end_s": 4.0}]
    tel = real_run.telemetry_from_steps(steps, events, 0.5, 2, "n0", 5.0)
    assert list(tel.columns) == TELEMETRY_COLUMNS + EXTRA_COLUMNS and len(tel) == 10 * 2
    busy = sorted(tel.loc[tel.gpu_util == 100, "t_s"].unique())
    assert busy == [1.5, 2.0, 2.5, 4.5]
    assert tel["power_w"].isna().all()


def test_align_nodes_puts_two_nodes_samples_on_one_grid():
    """Two nodes' samplers 0.13 s apart: after alignment every slot holds both nodes' GPUs, so
    the job-level power is their sum; slots only one node sampled (start, end) are dropped."""
    rows = [
        {"t_s": round(k * 0.5 + off, 3), "node": node, "gpu": 0, "power_w": w}
        for node, off, w, ks in (("n0", 0.02, 100.0, range(0, 6)), ("n1", 0.15, 300.0, range(1, 7)))
        for k in ks
    ]
    tel = telemetry_frame(rows)
    aligned = real_run.align_nodes(tel, 0.5)
    series = job_series(aligned)
    assert list(series["t_s"]) == [0.5, 1.0, 1.5, 2.0, 2.5]
    assert (series["n_gpus"] == 2).all() and (series["power_w"] == 400.0).all()
    assert len(job_series(tel)) == 12 and set(job_series(tel)["n_gpus"]) == {
        1
    }  # unaligned: one node a time
    one = tel[tel.node == "n0"]
    pd.testing.assert_frame_equal(
        real_run.align_nodes(one, 0.5), one.sort_values(["t_s", "node", "gpu"])
    )


def test_run_options_from_spec(tmp_path):
    spec = cuda_spec(tmp_path, device="cuda", nproc_per_node=8)
    spec["group"]["gpus"] = 16
    opts = real_run.RunOptions.from_spec(spec)
    assert (opts.nproc_per_node, opts.nnodes, opts.sampler_period_s, opts.uses_nvml) == (
        8,
        2,
        0.2,
        False,
    )
    assert (
        real_run.RunOptions.from_spec(cuda_spec(tmp_path, device="cuda", sampler=True)).nnodes == 1
    )
    with pytest.raises(ValueError, match="cap_control 'sudo'"):
        real_run.RunOptions.from_spec(cuda_spec(tmp_path, cap_control="sudo"))
    with pytest.raises(ValueError, match="needs cap_command"):
        real_run.RunOptions.from_spec(cuda_spec(tmp_path, cap_control="command"))


def test_launch_commands_single_and_multi_node(tmp_path):
    single = real_run.training_command(tmp_path / "c.json", 12.5, 8)
    assert single[1:5] == ["-m", "torch.distributed.run", "--nproc-per-node=8", "--standalone"]
    assert single[-6:] == [
        "-m",
        "wattflex.runs.training",
        "--config",
        str(tmp_path / "c.json"),
        "--t0",
        "12.5",
    ]
    multi = real_run.training_command(
        tmp_path / "c.json", 1.0, 8, nnodes=2, node_rank=1, rdzv="n1:29400", run_id="r"
    )
    assert {
        "--nnodes=2",
        "--rdzv-backend=c10d",
        "--rdzv-endpoint=n1:29400",
        "--rdzv-conf=is_host=0",
    } <= set(multi)
    assert "--standalone" not in multi and not any(
        a.startswith("--node-rank") for a in multi
    )  # c10d ignores it
    first = real_run.training_command(
        tmp_path / "c.json", 1.0, 8, nnodes=2, node_rank=0, rdzv="n1:29400"
    )
    assert "--rdzv-conf=is_host=1" in first  # the first node hosts the c10d store
    assert not any(a.startswith("--local-addr") for a in first)
    named = real_run.training_command(
        tmp_path / "c.json", 1.0, 8, nnodes=2, rdzv="10.1.0.1:29400", local_addr="10.1.0.1"
    )
    assert "--local-addr=10.1.0.1" in named  # not getfqdn(): the address SLURM reaches the node at
    agent = real_run.node_agent_command(
        tmp_path / "s.json", tmp_path, 1.0, 2, "n1:29400", gpus_per_node=8
    )
    assert agent[:5] == [
        "srun",
        "--nodes=2",
        "--ntasks-per-node=1",
        "--kill-on-bad-exit=1",
        "--gpus-per-node=8",
    ]
    assert agent[6:9] == ["-m", "wattflex.runs.real_run", "node"]
    assert np.isfinite(float(agent[agent.index("--t0") + 1]))
    assert not any(
        a.startswith("--gpus")
        for a in real_run.node_agent_command(tmp_path, tmp_path, 1.0, 2, "n:1")
    )


def test_rendezvous_on_the_first_nodes_address_and_a_free_port(monkeypatch):
    """On the first node (where the batch script runs) the port is one free there; elsewhere
    it is derived from the job id, below Linux's ephemeral range. SLURM's NodeAddr is asked
    of scontrol (stood in for here: the 2-node SLURM test runs the real one)."""
    monkeypatch.setattr(
        real_run, "_scontrol_field", lambda kind, name, key: {"gpu-a01": "10.1.0.1"}.get(name, "")
    )
    monkeypatch.setenv("SLURMD_NODENAME", "gpu-a01")
    host, port = real_run.rendezvous_endpoint("gpu-a01").rsplit(":", 1)
    assert host == "10.1.0.1"
    with socket.socket() as sock:
        sock.bind(("", int(port)))  # free: c10d's store can bind it
    monkeypatch.setenv("SLURMD_NODENAME", "gpu-a02")
    monkeypatch.setenv("SLURM_JOB_ID", "123456")
    assert (
        real_run.rendezvous_endpoint("gpu-b07") == f"gpu-b07:{29400 + 123456 % 3000}"
    )  # no NodeAddr: the name


def test_node_address_is_slurms_node_addr_or_none(monkeypatch):
    monkeypatch.setattr(
        real_run, "_scontrol_field", lambda kind, name, key: {"gpu-a01": "10.1.0.1"}.get(name, "")
    )
    monkeypatch.setenv("SLURMD_NODENAME", "gpu-a01")
    assert real_run.node_address() == "10.1.0.1"
    monkeypatch.setenv("SLURMD_NODENAME", "gpu-a09")
    assert real_run.node_address() is None


def test_gpus_per_node_from_the_group(tmp_path):
    spec = cuda_spec(tmp_path)
    spec["group"]["gpus"] = 16
    assert real_run.gpus_per_node(spec, 2) == 8
    assert real_run.gpus_per_node(spec, 3) is None  # uneven: the step takes the job's GPUs


def test_nccl_env_defaults_and_keys():
    assert real_run.nccl_env(None) == {"NCCL_DEBUG": "WARN"}
    env = real_run.nccl_env(
        {
            "debug": "INFO",
            "socket_ifname": "ib0",
            "ib_hca": "mlx5_0,mlx5_1",
            "env": {"NCCL_NET_GDR_LEVEL": "PHB", "NCCL_IB_TIMEOUT": 22},
        }
    )
    assert env == {
        "NCCL_DEBUG": "INFO",
        "NCCL_SOCKET_IFNAME": "ib0",
        "GLOO_SOCKET_IFNAME": "ib0",
        "NCCL_IB_HCA": "mlx5_0,mlx5_1",
        "NCCL_NET_GDR_LEVEL": "PHB",
        "NCCL_IB_TIMEOUT": "22",
    }


@pytest.mark.parametrize(
    "ifname, gloo", [("ib0,ib1", "ib0,ib1"), ("=eth1", "eth1"), ("^lo,docker", None)]
)
def test_one_key_names_the_interface_for_nccl_and_gloo(ifname, gloo):
    """The checkpoint's gloo group binds where NCCL does (one key, cuda.nccl.socket_ifname);
    NCCL's exclusion form has no gloo equivalent and leaves gloo to its default."""
    env = real_run.nccl_env({"socket_ifname": ifname})
    assert env["NCCL_SOCKET_IFNAME"] == ifname and env.get("GLOO_SOCKET_IFNAME") == gloo


def test_nccl_settings_reach_torchrun_and_run_json(tmp_path, monkeypatch):
    """``cuda.nccl`` goes into the environment of the node's torchrun (a FAKE torchrun that
    records its environment stands in for torch.distributed.run) and into the node's facts."""
    spec = cuda_spec(tmp_path, nccl={"socket_ifname": "eth7", "env": {"NCCL_ALGO": "Ring"}})
    seen = tmp_path / "env.json"
    monkeypatch.setattr(
        real_run,
        "training_command",
        lambda *a, **k: [
            sys.executable,
            "-c",
            f"import json, os; json.dump(dict(os.environ), open({str(seen)!r}, 'w'))",
        ],
    )
    monkeypatch.setenv("SLURMD_NODENAME", "gpu-node-7")
    out = tmp_path / "run"
    out.mkdir()
    facts = real_run.run_node(spec, out, time.time())
    env = json.loads(seen.read_text())
    assert (
        env["NCCL_DEBUG"],
        env["NCCL_SOCKET_IFNAME"],
        env["GLOO_SOCKET_IFNAME"],
        env["NCCL_ALGO"],
    ) == ("WARN", "eth7", "eth7", "Ring")
    assert facts["nccl_env"] == {
        "NCCL_DEBUG": "WARN",
        "NCCL_SOCKET_IFNAME": "eth7",
        "GLOO_SOCKET_IFNAME": "eth7",
        "NCCL_ALGO": "Ring",
    }
    assert facts["host"] == "gpu-node-7" and facts["launch"]["cpus_usable"] >= 1
