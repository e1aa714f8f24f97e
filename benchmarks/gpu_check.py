"""One GPU node, checked before the first measured campaign; observe-only (<= 10 min).

Usage: python benchmarks/gpu_check.py [--seconds 60] [--pairs 2] [--staircase-seconds 90] [--allreduce-mb 256]
                                      [--device cuda|cpu] [--model small|tiny] [--caps W ...] [--out DIR]
                                      [--model-path DIR [--real-steps 30]] [--nodes N]
                                      [--compile-families TYPE ...] [--compile-tasks pt lora] [--compile-budget-s 150]

Nothing here sets a power limit, clock or mode: training runs with ``cuda.cap_control:
observe``; the staircase drives a recording device whose ``set_cap`` records the cap and
sets nothing (the NVML GPUs it reads are opened with a setter that refuses); the
controller is ``wattflex control --dry-run``. The limits are read before and after and the
check fails if they differ. Steps, each recorded even if another fails:

a) ``wattflex doctor`` (``wattflex.diagnosis.diagnose``);
b) sampler overhead: a random-init model trained through the real harness
   (``wattflex.runs.real_run.run_real``: torchrun training, the NVML sampler in this
   process, as in a real run) for ``--seconds`` with the sampler at 10 Hz and without it,
   ``--pairs`` times in ABBA order; steady tokens/s (the first 20 % of each run's step
   time dropped) and the overhead 1 - on/off per pair, with its spread;
c) the telemetry columns the sampler-on runs got (min, max, NaN count per column);
d) the staircase (``wattflex.runs.sweep.algorithm.staircase``) on a live training run of
   the real device, through the recording device: the caps it WOULD set, lowest first,
   and the windows it measured (all at the current limit, since nothing is set); and
   ``wattflex control --dry-run`` at 80 % and 50 % of the GPUs' maximum limits, while
   that run trains;
e) an all-reduce across the node's GPUs (NCCL, ``--device cpu``: gloo on 2 CPU processes)
   through torchrun with the config's NCCL environment (``cuda.nccl``,
   ``wattflex.runs.real_run.nccl_env``): the sum checked, bus bandwidth as nccl-tests
   defines it. One node: NCCL between nodes (InfiniBand, ``ib_hca``, ``socket_ifname``) is
   not exercised; it is unproven until a multi-node run has trained;
g) the emulator's anchor, measured (``--device cuda`` only; ``wattflex calibrate --gpu-check``
   reads it): a random-input bf16 GEMM (``--anchor-seconds``) and an HBM triad on GPU 0 at the
   limit the GPU already has, the steady SM clock, power and rate of the second half of each
   (tensor activity = achieved / datasheet peak at that clock; HBM efficiency = triad bytes/s
   over the datasheet bandwidth). Unproven: no GPU has run it yet;
h) real weights (``--model-path``, e.g. a local gpt-oss MXFP4 checkpoint): loaded as the harness
   loads them (``models.load_pretrained``: MXFP4 dequantised to bf16 explicitly), LoRA-wrapped,
   one forward and backward on GPU 0; records whether the checkpoint was MXFP4, the experts'
   dtype, the load time, the loss and whether the adapters on the fused expert weights got
   gradients; then ``--real-steps`` LoRA steps on it through the real harness (``run_real``,
   torchrun, observe: at the current limit; seq 2048 x batch 1, checkpointing, on cuda), steady
   tokens/s as in b) (``real_weights_throughput``). Skipped without ``--model-path``. Unproven:
   no GPU has run it yet (on cpu a tiny ``save_pretrained`` checkpoint is tested);
i) the all-reduce of e) across ``--nodes`` nodes of the SLURM allocation: one srun task per node
   (``real_run.node_agent_command``/``node_main``), each a torchrun share with c10d at the first
   node's address and ``--local-addr`` its own (``real_run.torchrun_command``, ``rendezvous_endpoint``,
   ``node_address``), the config's ``cuda.nccl`` (``socket_ifname``, ``ib_hca``) with NCCL_DEBUG=INFO;
   records the transport NCCL used across nodes (``NET/IB`` or ``NET/Socket``, parsed from its
   INFO lines), GPUDirect RDMA, bus bandwidth; fails where ``ib_hca`` is set and NCCL used
   anything but IB. Skipped on cuda with ``--nodes 1``; ``--device cpu``: 2 local agents of one
   gloo process each on 127.0.0.1 (the same agents and c10d rendezvous; transport ``gloo``).
   Unproven: no GPU has run it yet;
j) torch.compile graph breaks per decoder layer: each catalogue family's tiny model built as the
   harness builds it (``--compile-tasks`` pt and lora), each layer's inputs caught in an eager
   forward, ``torch._dynamo.explain`` per layer (graphs, breaks, their reasons) and each distinct
   kind of layer compiled as ``training.trainer`` compiles it, a layer at a time (inductor on cuda,
   aot_eager on cpu), forward and backward, against eager; no new compile after
   ``--compile-budget-s``. Unproven: no GPU has run it yet;
k) the job's GPUs under every name (``wattflex.runs.devices.nvml.job_gpus``, ``identity_table``):
   NVML index, UUID and PCI bus id, the CUDA ordinal with the same UUID (torch's
   ``get_device_properties(i).uuid``, ``--device cuda``) and the index ``nvidia-smi`` gives it
   (``--query-gpu=index,uuid,pci.bus_id``: the number ``nvidia-smi -i`` and the sudo cap wrapper
   get), with CUDA_VISIBLE_DEVICES and SLURM's GPU variables; fails where a CUDA device is not
   one of the job's NVML GPUs. Run it inside a SLURM job on a node with ConstrainDevices to see
   how nvidia-smi numbers a confined job's GPUs. Unproven: no GPU has run it yet;
f) gpu_check_<gpu>.md and .json in benchmarks/results/ (``--out`` elsewhere); ``--device cpu``
   trains on the CPU (the NVML GPUs are still read) and adds ``_cpu-training`` to the name.

Defaults: a 190M-parameter Llama-style model (``--model small``, seq 2048 x batch 8) on
cuda, the catalogue's tiny model on cpu; about 4 x (60 s + start-up) + 90 s + start-up + 60 s
(g) + at most ~3 min (j, its budget and the compile under way), under 10 minutes on one GPU
(h with ``--model-path`` and i with ``--nodes`` add their load and launch times).
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import io
import json
import math
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import traceback
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "workflow_scripts"))

from wattflex import cli
from wattflex.config import load_catalog, load_config
from wattflex.diagnosis import diagnose, format_report, probe_nvml
from wattflex.provenance import read_json, read_parquet
from wattflex.runs.campaign_checks import check_inputs
from wattflex.runs.devices import nvml
from wattflex.runs.devices.base import EXTRA_COLUMNS, CapError, TelemetrySampler, check_cap
from wattflex.runs.real_run import (
    _node_hosts,
    nccl_env,
    node_address,
    node_agent_args,
    node_agent_command,
    node_main,
    rendezvous_endpoint,
    run_real,
    run_training,
    start_training,
    terminate,
    torchrun_command,
    training_command,
    training_error,
)
from wattflex.runs.sweep.algorithm import staircase
from wattflex.runs.sweep.real import PollingRun, read_live_steps
from wattflex.runs.sweep.steady import SteadyCriteria
from wattflex.runs.training.train_config import TrainConfig
from wattflex.telemetry import TELEMETRY_COLUMNS, SummaryProtocol, job_series

SAMPLER_PERIOD_S = 0.1  # 10 Hz: 50x the campaign's 5 s, so an overhead shows if there is one
OVERHEAD_GOAL_PCT = 0.5
WARMUP_FRACTION = 0.2  # of a run's step time, dropped before tokens/s
FIRST_STEP_TIMEOUT_S = 300.0
BUDGET_FRACTIONS = (0.8, 0.5)  # controller dry runs: budget = fraction x the GPUs' maximum limits
# A model that keeps an H200 busy (191M parameters, 126M without embeddings; Llama, the catalogue's dense family).
SMALL_MODEL = {
    "layers": 8,
    "hidden": 1024,
    "heads": 16,
    "kv_heads": 8,
    "head_dim": 64,
    "intermediate": 4096,
    "vocab": 32000,
}
SHAPE = {
    "small": (2048, 8),
    "tiny": (32, 4),
    "real": (2048, 1),
}  # (seq_len, micro-batch); real: --model-path on cuda
GPM_COLUMNS = {"dram_active", "sm_active", "tensor_active"}
ALLREDUCE_MB = 256  # per rank, fp32: large enough for bandwidth, not latency (nccl-tests' range)
ALLREDUCE_ITERS = (3, 10)  # warm-up, timed
HOST_COLUMNS = {"host_cpu_w", "host_dram_w"}
ANCHOR_GEMM_N = (
    8192  # bf16 8192^3 GEMMs: compute-bound, ~1.1 TFLOP each, the tensor pipes' steady state
)
TRIAD_MB = 2048  # per fp32 array of the HBM triad (3 arrays): far beyond the 50-60 MB L2
ANCHOR_SAMPLE_S = 0.2
UNPROVEN = "**Unproven on GPU**: no GPU has run this step yet (its CPU path is tested: tests/unit/test_gpu_check.py)."


# ---- e) all-reduce ------------------------------------------------------------------------------
def allreduce_worker(backend: str, out: Path, mb: float) -> None:
    """One torchrun worker: all-reduce ``mb`` MB per rank; rank 0 writes the timing and check."""
    import torch
    import torch.distributed as dist

    local = int(os.environ.get("LOCAL_RANK", "0"))
    device = torch.device("cuda", local) if backend == "nccl" else torch.device("cpu")
    if backend == "nccl":
        torch.cuda.set_device(device)
    dist.init_process_group(backend, **({"device_id": device} if backend == "nccl" else {}))
    rank, world = dist.get_rank(), dist.get_world_size()
    x = torch.full((int(mb * 2**20 / 4),), float(rank + 1), device=device)

    def sync() -> None:
        if backend == "nccl":
            torch.cuda.synchronize(device)
        dist.barrier()

    warm, timed = ALLREDUCE_ITERS
    for _ in range(warm):
        y = x.clone()
        dist.all_reduce(y)
    sync()
    t = time.perf_counter()
    for _ in range(timed):
        y = x.clone()
        dist.all_reduce(y)
    sync()
    seconds = (time.perf_counter() - t) / timed
    correct = bool(torch.all(y == world * (world + 1) / 2).item())
    if rank == 0:
        nbytes = x.numel() * 4
        algbw = nbytes / seconds / 1e9
        out.write_text(
            json.dumps(
                {
                    "backend": backend,
                    "world_size": world,
                    "mb_per_rank": mb,
                    "iters": timed,
                    "seconds_per_iter": seconds,
                    "algbw_gb_s": algbw,
                    "busbw_gb_s": algbw * 2 * (world - 1) / world,
                    "sum_correct": correct,
                    "nccl_version": ".".join(map(str, torch.cuda.nccl.version()))
                    if backend == "nccl"
                    else None,
                }
            )
        )
    dist.destroy_process_group()


def allreduce(args: argparse.Namespace, work: Path, n_gpus: int) -> dict[str, Any]:
    """e) the all-reduce through torchrun, with the config's NCCL environment."""
    cfg = load_config(Path(args.configfile or REPO / "config" / "config.yaml"), base=REPO)
    check_inputs(cfg)  # a cuda campaign's weights, data and plan, as snakemake checks them
    env = nccl_env((cfg.get("cuda") or {}).get("nccl"))
    backend, nproc = ("nccl", n_gpus) if args.device == "cuda" else ("gloo", 2)
    if nproc < 1:
        raise RuntimeError("no GPU to all-reduce across")
    out, log_path = work / "allreduce.json", work / "allreduce.log"
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        f"--nproc-per-node={nproc}",
        __file__,
        "--allreduce-worker",
        backend,
        "--allreduce-out",
        str(out),
        "--allreduce-mb",
        f"{args.allreduce_mb:g}",
    ]
    with open(log_path, "wb") as logf:
        rc = subprocess.run(
            cmd, env={**os.environ, **env}, stdout=logf, stderr=subprocess.STDOUT, timeout=600
        ).returncode
    text = log_path.read_text(errors="replace")
    if rc != 0 or not out.is_file():
        raise RuntimeError(
            f"all-reduce exited with status {rc}: " + "\n".join(text.splitlines()[-15:])
        )
    res = json.loads(out.read_text())
    res.update(
        nccl_env=env,
        command=" ".join(cmd[1:5]),
        warnings=[ln for ln in text.splitlines() if "NCCL WARN" in ln][:10],
    )
    if not res["sum_correct"]:
        return {**res, "ok": False, "error": "all-reduce sum is wrong"}
    return res


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument(
        "--seconds", type=float, default=60.0, help="training time of each sampler on/off run (s)"
    )
    p.add_argument(
        "--pairs", type=int, default=2, help="sampler off/on pairs, in ABBA order (default 2)"
    )
    p.add_argument(
        "--staircase-seconds",
        type=float,
        default=90.0,
        help="staircase dry run, all caps together (s)",
    )
    p.add_argument(
        "--device", choices=("cuda", "cpu"), default="cuda", help="where the model trains"
    )
    p.add_argument("--model", choices=("small", "tiny"), help="default: small on cuda, tiny on cpu")
    p.add_argument(
        "--caps",
        type=float,
        nargs="+",
        help="staircase caps in W (default: 6 across the GPU's range)",
    )
    p.add_argument(
        "--configfile", help="config for doctor's verdict (default: config/config.yaml here)"
    )
    p.add_argument(
        "--out", type=Path, default=REPO / "benchmarks" / "results", help="where the report goes"
    )
    p.add_argument(
        "--anchor-seconds",
        type=float,
        default=30.0,
        help="g) each of the anchor GEMM and the triad (s)",
    )
    p.add_argument(
        "--model-path", help="h) a local checkpoint (e.g. gpt-oss MXFP4) to load and step once"
    )
    p.add_argument(
        "--keep",
        action="store_true",
        help="keep the runs' directories (printed) instead of deleting them",
    )
    p.add_argument(
        "--allreduce-mb",
        type=float,
        default=ALLREDUCE_MB,
        help=f"e) MB per rank of each all-reduce (default {ALLREDUCE_MB}; less on cpu: a check, not a bandwidth)",
    )
    p.add_argument(
        "--nodes",
        type=int,
        default=1,
        help="i) all-reduce across this many nodes of the SLURM allocation (srun; default 1: skipped on cuda, "
        "2 local gloo agents on cpu)",
    )
    p.add_argument(
        "--compile-families",
        nargs="+",
        help="j) hf_model_types to compile (default: every catalogue family)",
    )
    p.add_argument(
        "--compile-tasks",
        nargs="+",
        choices=("pt", "lora"),
        default=["pt", "lora"],
        help="j) tasks (default both)",
    )
    p.add_argument(
        "--compile-budget-s",
        type=float,
        default=150.0,
        help="j) no new layer compiled after this many seconds (explain still runs; default 150)",
    )
    p.add_argument(
        "--real-steps",
        type=int,
        default=30,
        help="h) LoRA steps on --model-path through the harness (default 30)",
    )
    p.add_argument(
        "--allreduce-worker", choices=("nccl", "gloo"), help=argparse.SUPPRESS
    )  # torchrun's workers
    p.add_argument("--allreduce-out", type=Path, help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    if a.seconds <= 0 or a.staircase_seconds <= 0 or a.pairs < 1 or a.allreduce_mb <= 0:
        p.error("--seconds, --staircase-seconds and --allreduce-mb must be > 0 and --pairs >= 1")
    if a.nodes < 1 or a.real_steps < 3 or a.compile_budget_s < 0:
        p.error(
            "--nodes must be >= 1, --real-steps >= 3 (steady tokens/s drops the first steps), --compile-budget-s >= 0"
        )
    a.model = a.model or ("small" if a.device == "cuda" else "tiny")
    return a


# ---- h) real weights ---------------------------------------------------------------------------
def real_weights(args: argparse.Namespace) -> dict[str, Any]:
    """Load ``--model-path`` the harness's way, LoRA-wrap it, one forward/backward on the device."""
    if not args.model_path:
        return {"skipped": "no --model-path given"}
    import torch
    from transformers import AutoConfig

    from wattflex.runs.training import models

    hf_cfg = AutoConfig.from_pretrained(args.model_path, local_files_only=True)
    cfg = TrainConfig(
        model_facts={"hf_model_type": hf_cfg.model_type},
        task="lora",
        seq_len=512,
        batch=1,
        lora_rank=8,
        device=args.device,
        model_path=args.model_path,
        compile=False,
        grad_checkpointing=False,
        outdir=".",
    )
    t = time.monotonic()
    model = models.load_pretrained(cfg, torch.bfloat16)
    load_s = time.monotonic() - t
    experts = {str(p.dtype) for n, p in model.named_parameters() if ".experts." in n}
    model = models.apply_lora(model, cfg).to(args.device)
    x = torch.randint(0, hf_cfg.vocab_size, (1, 512), device=args.device)
    loss = model(input_ids=x, labels=x).loss
    loss.backward()
    grads = [
        float(p.grad.abs().sum())
        for n, p in model.named_parameters()
        if "lora_" in n and ".experts." in n and p.grad is not None
    ]
    out = {
        "mxfp4_checkpoint": bool(models.quantization_kwargs(hf_cfg)),
        "expert_dtypes": sorted(experts),
        "load_s": load_s,
        "loss": float(loss),
        "expert_lora_params_with_grad": sum(g > 0 for g in grads),
        "params": sum(p.numel() for p in model.parameters()),
    }
    if args.device == "cuda":
        out["peak_gpu_gib"] = torch.cuda.max_memory_allocated() / 2**30
    # a dense checkpoint has no expert adapters to check; an MoE one must train them
    ok = (
        math.isfinite(out["loss"])
        and experts <= {"torch.bfloat16"}
        and (not experts or out["expert_lora_params_with_grad"] > 0)
    )
    return {
        **out,
        **(
            {}
            if ok
            else {"ok": False, "error": "not trainable as loaded (see dtypes, loss, grads)"}
        ),
    }


def real_weight_throughput(
    args: argparse.Namespace, work: Path, cap_w: float, sampler: bool
) -> dict[str, Any]:
    """h) ``--real-steps`` LoRA steps on ``--model-path`` through the real harness (``run_real``,
    torchrun, cap_control observe: the GPU's current limit), steady tokens/s as in b); on cuda
    seq 2048 x batch 1 with checkpointing. ``sampler``: NVML is there (the run's mean power too)."""
    if not args.model_path:
        return {"skipped": "no --model-path given"}
    from transformers import AutoConfig

    mt = AutoConfig.from_pretrained(args.model_path, local_files_only=True).model_type
    r = training_run(
        args, work, "real-weights", sampler, cap_w, {"hf_model_type": mt, "steps": args.real_steps}
    )
    out = {
        **r,
        "hf_model_type": mt,
        "steps_asked": args.real_steps,
        "seq_len_batch": list(SHAPE["real" if args.device == "cuda" else args.model]),
        "cap_w": cap_w,
    }
    facts = read_json(Path(r["dir"]) / "run.json")
    out.update(
        params_total=facts["training"].get("params_total"),
        model_class=facts["training"].get("model_class"),
    )
    if sampler:
        tel = read_parquet(Path(r["dir"]) / "telemetry.parquet")
        out["power_w_mean"] = (
            float(tel.loc[tel["gpu_util"] > 0, "power_w"].mean()) if len(tel) else math.nan
        )
    if not (math.isfinite(out["tokens_per_s"]) and out["tokens_per_s"] > 0):
        return {
            **out,
            "ok": False,
            "error": f"no steady tokens/s from {r['steps']} steps; raise --real-steps",
        }
    return out


# ---- i) all-reduce across nodes -------------------------------------------------------------------
# NCCL_DEBUG=INFO lines, format from NVIDIA/nccl: src/init.cc INFO(NCCL_INIT, "Using network %s") and
# src/transport/net.cc (commit 022c022aadf39e370f14668935069c35863ff525) "Channel %02d/%d : %d[%d] ->
# %d[%d] [send] via NET/%s/%d%s%s%s" (NET/<plugin>/<dev>[/GDRDMA]); P2P and SHM print "... via P2P/..."
NCCL_NETWORK = re.compile(r"NCCL INFO Using network (\S+)")
NCCL_CHANNEL = re.compile(
    r"NCCL INFO Channel \d+/\d+ : \d+\[\d+\] -> \d+\[\d+\] (?:\[(?:send|receive)\] )?via (\S+)"
)


def nccl_transports(text: str) -> dict[str, Any]:
    """What NCCL says it used: the network plugin(s) (``IB``, ``Socket``), each channel's transport
    (``NET/IB``, ``NET/Socket``, ``P2P``, ``SHM``), GPUDirect RDMA on any network channel, and
    ``transport``: the network channels' kind (what crosses nodes), None if no channel used one."""
    via = NCCL_CHANNEL.findall(text)
    kinds = {"/".join(v.split("/")[:2]) if v.startswith("NET/") else v.split("/")[0] for v in via}
    net = sorted(k for k in kinds if k.startswith("NET/"))
    return {
        "networks": sorted(set(NCCL_NETWORK.findall(text))),
        "channel_transports": sorted(kinds),
        "channels": len(via),
        "gdrdma": any(v.startswith("NET/") and "/GDRDMA" in v for v in via),
        "transport": "+".join(net) or None,
    }


def allreduce_node(
    spec: dict[str, Any], outdir: Path, t0: float, node_rank: int, rdzv: str
) -> None:
    """One node agent of i) (``real_run.node_main``: an srun task, or a local process on cpu): this
    node's torchrun share, c10d at ``rdzv`` with this node's address, the config's NCCL environment."""
    c = spec["cuda"]
    cmd = torchrun_command(
        int(c["nproc_per_node"]),
        int(c["nnodes"]),
        node_rank,
        rdzv,
        spec["run_id"],
        c.get("local_addr") or node_address(),
    )
    cmd += [
        str(Path(__file__).resolve()),
        "--allreduce-worker",
        spec["backend"],
        "--allreduce-out",
        str(outdir / "allreduce.json"),
        "--allreduce-mb",
        f"{spec['allreduce_mb']:g}",
    ]
    run_training(cmd, outdir / f"allreduce.node{node_rank}.log", env=nccl_env(c.get("nccl")))


def config_nccl(args: argparse.Namespace) -> dict[str, Any]:
    cfg = load_config(Path(args.configfile or REPO / "config" / "config.yaml"), base=REPO)
    check_inputs(cfg)  # a cuda campaign's weights, data and plan, as snakemake checks them
    return dict((cfg.get("cuda") or {}).get("nccl") or {})


def allreduce_nodes(args: argparse.Namespace, work: Path, n_gpus: int) -> dict[str, Any]:
    """i) e)'s all-reduce across ``--nodes`` nodes: one srun task per node (``real_run``'s node
    agents), c10d rendezvous on the first node's address, NCCL_DEBUG=INFO so the log says which
    transport crossed the nodes. ``--device cpu`` without SLURM: 2 local agents of one gloo
    process each on 127.0.0.1 (the same rendezvous and agents; transport ``gloo``)."""
    cuda = args.device == "cuda"
    if cuda and args.nodes < 2:
        return {
            "skipped": "one node (--nodes 1): run with --nodes N inside a SLURM allocation of N nodes"
        }
    nccl = {**config_nccl(args), "debug": "INFO"}  # INFO: NCCL's transport lines
    backend, nproc = ("nccl", n_gpus) if cuda else ("gloo", 1)
    if nproc < 1:
        raise RuntimeError("no GPU to all-reduce across")
    srun = args.nodes > 1
    nnodes = args.nodes if srun else 2
    # srun: the node agents write beside the report (a shared file system), not in this node's /tmp
    d = (
        (args.out.resolve() / f".gpu_check_nodes_{uuid.uuid4().hex[:8]}")
        if srun
        else work / "allreduce_nodes"
    )
    d.mkdir(parents=True)
    spec = {
        "run_id": f"gpu-check-{uuid.uuid4().hex[:8]}",
        "backend": backend,
        "allreduce_mb": args.allreduce_mb,
        "cuda": {
            "nproc_per_node": nproc,
            "nnodes": nnodes,
            "nccl": nccl,
            **({} if srun else {"local_addr": "127.0.0.1"}),
        },
    }
    spec_path = d / "spec.json"
    spec_path.write_text(json.dumps(spec))
    t0 = time.time()
    try:
        if srun:
            rdzv = rendezvous_endpoint(_node_hosts()[0])
            run_training(
                node_agent_command(
                    spec_path,
                    d,
                    t0,
                    nnodes,
                    rdzv,
                    nproc if cuda else None,
                    program=[sys.executable, str(Path(__file__).resolve())],
                ),
                d / "nodes.log",
            )
        else:
            with socket.socket() as sock:
                sock.bind(("127.0.0.1", 0))
                rdzv = f"127.0.0.1:{sock.getsockname()[1]}"
            agent = [
                sys.executable,
                str(Path(__file__).resolve()),
                *node_agent_args(spec_path, d, t0, rdzv),
            ]
            procs = [
                start_training(
                    agent, d / f"agent{r}.log", env={"SLURM_NODEID": str(r)}
                )  # srun's node id
                for r in range(nnodes)
            ]
            try:
                for r, proc in enumerate(procs):
                    if (rc := proc.wait(FIRST_STEP_TIMEOUT_S)) != 0:
                        raise training_error(rc, d / f"agent{r}.log")
            finally:
                for proc in procs:
                    terminate(proc)
        text = "\n".join(
            p.read_text(errors="replace") for p in sorted(d.glob("allreduce.node*.log"))
        )
        res = json.loads((d / "allreduce.json").read_text())
    finally:
        if srun and not args.keep:
            shutil.rmtree(d, ignore_errors=True)
    res.update(
        nnodes=nnodes,
        nproc_per_node=nproc,
        rdzv=rdzv,
        launcher="srun" if srun else "local agents",
        nccl_env=nccl_env(nccl),
        warnings=[ln for ln in text.splitlines() if "NCCL WARN" in ln][:10],
    )
    res.update(nccl_transports(text) if cuda else {"transport": "gloo"})
    if not res["sum_correct"]:
        return {**res, "ok": False, "error": "all-reduce sum is wrong"}
    if cuda and res["transport"] is None:
        return {
            **res,
            "ok": False,
            "error": "no NCCL channel over a network in the INFO log (one node?)",
        }
    if cuda and nccl.get("ib_hca") and res["transport"] != "NET/IB":
        return {
            **res,
            "ok": False,
            "error": f"cuda.nccl.ib_hca is set but NCCL used {res['transport']}",
        }
    return res


# ---- j) compile graph breaks per layer --------------------------------------------------------------
def catalogue_families(only: list[str] | None) -> dict[str, tuple[str, dict[str, Any]]]:
    """hf_model_type -> (the first catalogue model of that family, its facts)."""
    fams: dict[str, tuple[str, dict[str, Any]]] = {}
    for name, facts in load_catalog(REPO / "config" / "models.yaml").items():
        fams.setdefault(str(facts["hf_model_type"]), (name, dict(facts)))
    unknown = sorted(set(only or []) - set(fams))
    if unknown:
        raise ValueError(f"--compile-families {unknown}: the catalogue's are {sorted(fams)}")
    return {k: v for k, v in fams.items() if not only or k in only}


def _first_tensor(out: Any) -> Any:
    return out[0] if isinstance(out, (tuple, list)) else out


def layer_graph_breaks(
    mt: str,
    model_name: str,
    facts: dict[str, Any],
    task: str,
    device: str,
    backend: str,
    deadline: float,
) -> dict[str, Any]:
    """One family's tiny model built as the harness builds it (``models.build_model``, LoRA by
    ``trainer._adapt``; without activation checkpointing, under which ``explain`` sees no graph of
    the layer, and without the harness's own compile), each decoder layer's inputs caught in
    one eager forward;
    per layer ``torch._dynamo.explain`` (graphs, breaks and their reasons), and each distinct
    kind of layer (class, layer type) compiled with ``backend`` (forward and backward, the output
    against eager) as ``trainer`` compiles it, a layer at a time, until ``deadline``."""
    import torch

    from wattflex.runs.training import models
    from wattflex.runs.training.trainer import _adapt, decoder_layers

    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    cfg = TrainConfig(
        model_facts=facts,
        tiny=True,
        device=device,
        task=task,
        lora_rank=8,
        seq_len=32,
        batch=2,
        compile=False,
        grad_checkpointing=False,  # the layers as dynamo sees them; loop compiles each layer itself
        outdir=".",
    )
    torch.manual_seed(0)
    model = _adapt(models.build_model(cfg, dtype), cfg).to(device)
    layers, caught = decoder_layers(model), {}
    hooks = [
        layer.register_forward_pre_hook(
            lambda m, a, kw, i=i: caught.setdefault(i, (a, kw)), with_kwargs=True
        )
        for i, layer in enumerate(layers)
    ]
    with torch.no_grad():
        model(
            input_ids=torch.randint(
                0, int(models.model_config(cfg).vocab_size), (2, 32), device=device
            )
        )
    for h in hooks:
        h.remove()
    layer_types = getattr(models.model_config(cfg), "layer_types", None) or [None] * len(layers)
    rows, compiled = [], {}
    for i, layer in enumerate(layers):
        a, kw = caught[i]
        torch._dynamo.reset()
        e = torch._dynamo.explain(layer)(*a, **kw)
        row = {
            "index": i,
            "class": type(layer).__name__,
            "layer_type": layer_types[i],
            "graphs": int(e.graph_count),
            "graph_breaks": int(e.graph_break_count),
            "break_reasons": [str(r.reason) for r in e.break_reasons],
            "ops_per_graph": [len(o) for o in e.ops_per_graph or []],
        }
        kind = (row["class"], row["layer_type"])
        if kind in compiled:
            row["compiled"] = {"same_kind_as_layer": compiled[kind]}
        elif time.monotonic() > deadline:
            row["compiled"] = {"skipped": "--compile-budget-s spent"}
        else:
            compiled[kind] = i
            row["compiled"] = compile_layer(layer, a, kw, backend)
        rows.append(row)
    torch._dynamo.reset()
    return {"family": mt, "model": model_name, "task": task, "layers": rows}


def compile_layer(layer: Any, a: tuple, kw: dict[str, Any], backend: str) -> dict[str, Any]:
    """``layer`` through ``torch.compile(backend)``: forward and backward once, timed, the
    output's largest difference from the eager layer's; a compile error is the finding."""
    import torch

    def fresh() -> list[Any]:  # the hidden states as a leaf with a gradient, the rest as caught
        return [
            x.detach().clone().requires_grad_(x.is_floating_point())
            if isinstance(x, torch.Tensor)
            else x
            for x in a
        ]

    t = time.monotonic()
    try:
        torch._dynamo.reset()
        out = _first_tensor(torch.compile(layer, backend=backend)(*fresh(), **kw))
        out.float().sum().backward()
        seconds = time.monotonic() - t
        with torch.no_grad():
            ref = _first_tensor(layer(*a, **kw))
        return {
            "ok": True,
            "seconds": round(seconds, 2),
            "max_abs_diff": float((out.detach() - ref).abs().max()),
        }
    except Exception as exc:  # a layer the backend cannot compile is what this step looks for
        return {
            "ok": False,
            "seconds": round(time.monotonic() - t, 2),
            "error": f"{type(exc).__name__}: {exc}"[:500],
        }
    finally:
        torch._dynamo.reset()


def compile_breaks(args: argparse.Namespace) -> dict[str, Any]:
    """j) Graph breaks per decoder layer for each catalogue family and ``--compile-tasks``
    (inductor on cuda; aot_eager on cpu, where inductor's C++ compile is minutes)."""
    backend = "inductor" if args.device == "cuda" else "aot_eager"
    deadline = time.monotonic() + args.compile_budget_s
    fams = [
        layer_graph_breaks(mt, name, facts, task, args.device, backend, deadline)
        for mt, (name, facts) in catalogue_families(args.compile_families).items()
        for task in args.compile_tasks
    ]
    failed = [
        f"{f['family']}/{f['task']} layer {r['index']}"
        for f in fams
        for r in f["layers"]
        if r["compiled"].get("ok") is False
    ]
    out = {
        "backend": backend,
        "families": fams,
        "layers_with_breaks": sum(r["graph_breaks"] > 0 for f in fams for r in f["layers"]),
    }
    return {**out, "ok": False, "error": "compile failed: " + ", ".join(failed)} if failed else out


# ---- the steps --------------------------------------------------------------------------------
def record_step(
    result: dict[str, Any], name: str, fn: Callable[[], dict[str, Any]]
) -> dict[str, Any]:
    """Run one step; its result or its error goes into ``result["steps"][name]`` (a step that
    measured something and still failed returns ``ok: False`` and ``error`` itself)."""
    t = time.monotonic()
    print(f"[gpu_check] {name} ...", file=sys.stderr, flush=True)
    try:
        out = {"ok": True, **fn()}
    except Exception as exc:  # a failed step is a finding; the next steps still run
        out = {
            "ok": False,
            "error": f"{type(exc).__name__}: {exc}",
            "traceback": traceback.format_exc().splitlines()[-12:],
        }
    out["seconds"] = round(time.monotonic() - t, 1)
    result["steps"][name] = out
    print(
        f"[gpu_check] {name}: {'ok' if out['ok'] else out.get('error')} ({out['seconds']} s)",
        file=sys.stderr,
        flush=True,
    )
    return out


def model_facts(size: str) -> dict[str, Any]:
    facts = dict(load_catalog(REPO / "config" / "models.yaml")["Llama-3.1-70B"])
    if size == "small":
        facts.update(SMALL_MODEL, source="gpu_check: small random-init Llama-style model")
    return facts


def run_spec(
    args: argparse.Namespace,
    name: str,
    sampler: bool,
    duration_s: float,
    state_dir: Path,
    cap_w: float,
    real_weights: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """A ``run_real`` spec that changes nothing: cap_control observe, and a state directory of
    its own (empty), so the stale-cap restore ``run_real`` does first finds nothing to restore.
    ``real_weights`` (``hf_model_type``, ``steps``): LoRA on ``--model-path`` for that many steps."""
    seq_len, batch = SHAPE["real" if real_weights and args.device == "cuda" else args.model]
    spec = {
        "campaign": "gpu-check",
        "run_id": name,
        "cap_w": cap_w,
        "repeat": 0,
        "seed": 0,
        "backend": "cuda",
        "group": {
            "id": "gpu-check",
            "model": f"gpu-check-{args.model}",
            "task": "pt",
            "gpus": 1,
            "seq_len": seq_len,
            "batch": batch,
            "ep": 1,
            "compile": False,
            "grad_checkpointing": False,
            "lora_rank": 8,
        },
        "model_facts": model_facts(args.model),
        "run": {
            "duration_s": duration_s,
            "sample_period_s": SAMPLER_PERIOD_S,
        },  # no eval, no checkpoint
        "cuda": {
            "device": args.device,
            "cap_control": "observe",
            "tiny": args.model == "tiny",
            "random_init": args.model == "small",
            "sampler": sampler,
            "sampler_period_s": SAMPLER_PERIOD_S,
            "gpm": True,
            "host_power": True,
            "state_dir": str(state_dir),
            "nproc_per_node": 1,
            "nnodes": 1,
        },
    }
    if real_weights:  # the checkpoint's own family and geometry (models.model_config reads it)
        spec["group"].update(
            model=f"gpu-check-{Path(args.model_path).name}",
            task="lora",
            grad_checkpointing=args.device == "cuda",
        )
        spec["model_facts"] = {
            "hf_model_type": real_weights["hf_model_type"],
            "source": f"--model-path {args.model_path}",
        }
        spec["cuda"].update(
            tiny=False,
            random_init=False,
            model_path=str(args.model_path),
            max_steps=int(real_weights["steps"]),
        )
    return spec


def steady_tokens_per_s(steps: pd.DataFrame) -> tuple[float, int]:
    """Tokens/s over the steps after the first ``WARMUP_FRACTION`` of the run's step time."""
    t, tok = steps["t_end_s"].to_numpy(float), steps["tokens"].to_numpy(float)
    if t.size < 3:
        return math.nan, 0
    k = int(np.searchsorted(t, t[0] + WARMUP_FRACTION * (t[-1] - t[0])))
    k = min(max(k, 1), t.size - 2)
    return float(tok[k + 1 :].sum() / (t[-1] - t[k])), int(t.size - k - 1)


def sampler_rate_hz(tel: pd.DataFrame) -> float:
    """Achieved samples per second of one GPU's rows."""
    t = np.sort(tel.loc[tel["gpu"] == tel["gpu"].min(), "t_s"].to_numpy(float))
    return float((t.size - 1) / (t[-1] - t[0])) if t.size > 1 and t[-1] > t[0] else math.nan


def training_run(
    args: argparse.Namespace,
    work: Path,
    name: str,
    sampler: bool,
    cap_w: float,
    real_weights: dict[str, Any] | None = None,
) -> dict[str, Any]:
    outdir = work / name
    t = time.monotonic()
    run_real(
        run_spec(args, name, sampler, args.seconds, work / "state", cap_w, real_weights), outdir
    )
    steps = read_parquet(outdir / "steps.parquet")
    tel = read_parquet(outdir / "telemetry.parquet")
    facts = read_json(outdir / "run.json")
    tps, n = steady_tokens_per_s(steps)
    return {
        "name": name,
        "sampler": sampler,
        "tokens_per_s": tps,
        "steps": int(len(steps)),
        "steps_used": n,
        "step_s_median": float(steps["step_time_s"].median()),
        "wall_s": round(time.monotonic() - t, 1),
        "telemetry_source": facts["telemetry"]["source"],
        "gpm": facts["telemetry"]["gpm"],
        "host_power": facts["telemetry"]["host_power"],
        "sampler_hz": sampler_rate_hz(tel) if sampler else None,
        "dir": str(outdir),
    }


def sampler_overhead(args: argparse.Namespace, work: Path, cap_w: float) -> dict[str, Any]:
    """Pairs of runs without / with the sampler, ABBA (off-on, on-off, ...) so a drift cancels."""
    runs, errors = [], []
    for pair in range(args.pairs):
        for sampler in (False, True) if pair % 2 == 0 else (True, False):
            name = f"pair{pair}-sampler-{'on' if sampler else 'off'}"
            try:
                runs.append({"pair": pair, **training_run(args, work, name, sampler, cap_w)})
            except Exception as exc:  # the other runs still say something
                errors.append(f"{name}: {type(exc).__name__}: {exc}")
                runs.append(
                    {
                        "pair": pair,
                        "name": name,
                        "sampler": sampler,
                        "error": f"{type(exc).__name__}: {exc}",
                    }
                )
    per_pair = []
    for pair in range(args.pairs):
        on = [
            r["tokens_per_s"]
            for r in runs
            if r["pair"] == pair and r["sampler"] and "error" not in r
        ]
        off = [
            r["tokens_per_s"]
            for r in runs
            if r["pair"] == pair and not r["sampler"] and "error" not in r
        ]
        if on and off:
            per_pair.append(100.0 * (1.0 - on[0] / off[0]))
    out: dict[str, Any] = {
        "runs": runs,
        "overhead_pct_per_pair": per_pair,
        "goal_pct": OVERHEAD_GOAL_PCT,
        "sampler_period_s": SAMPLER_PERIOD_S,
    }
    if per_pair:
        off_all = [r["tokens_per_s"] for r in runs if not r["sampler"] and "error" not in r]
        out.update(
            overhead_pct=float(np.mean(per_pair)),
            overhead_pct_min=float(min(per_pair)),
            overhead_pct_max=float(max(per_pair)),
            off_run_cv_pct=float(100 * np.std(off_all, ddof=1) / np.mean(off_all))
            if len(off_all) > 1
            else None,
        )
    if errors:  # the step failed, but what the other runs measured stays
        out.update(ok=False, error="; ".join(errors))
    return out


def telemetry_columns(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Per telemetry column of the sampler-on runs: where it comes from, min, max, NaNs."""
    frames = [
        read_parquet(Path(r["dir"]) / "telemetry.parquet")
        for r in runs
        if r.get("sampler") and "error" not in r
    ]
    if not frames:
        raise RuntimeError("no sampler-on run succeeded: no NVML telemetry to show")
    tel = pd.concat(frames, ignore_index=True)
    cols = []
    for c in TELEMETRY_COLUMNS + EXTRA_COLUMNS:
        if c in ("t_s", "node", "gpu"):
            continue
        v = tel[c].to_numpy(float)
        fin = v[np.isfinite(v)]
        cols.append(
            {
                "column": c,
                "source": "GPM" if c in GPM_COLUMNS else "RAPL" if c in HOST_COLUMNS else "NVML",
                "min": float(fin.min()) if fin.size else None,
                "max": float(fin.max()) if fin.size else None,
                "nan": int(v.size - fin.size),
                "n": int(v.size),
            }
        )
    return {
        "rows": int(len(tel)),
        "gpus": sorted(int(g) for g in tel["gpu"].unique()),
        "columns": cols,
    }


class RecordingDevice:
    """The job's GPUs as the staircase's device, observe-only: ``set_cap`` checks the cap
    against each GPU's range (a read), records it and returns the limit enforced now;
    ``restore`` records the call. Neither reaches NVML's setter."""

    def __init__(self, gpus: list[Any], t0: float) -> None:
        self.gpus, self.t0 = gpus, t0
        self.asked: list[dict[str, Any]] = []
        self.restores = 0

    def set_cap(self, cap_w: float) -> float:
        for g in self.gpus:
            check_cap(g, cap_w)
        enforced = min(g.enforced_limit_w() for g in self.gpus)
        self.asked.append(
            {
                "t_s": round(time.time() - self.t0, 2),
                "would_set_w": float(cap_w),
                "enforced_limit_w_now": enforced,
            }
        )
        return enforced

    def restore(self) -> None:
        self.restores += 1


def refuse_to_set(index: int, watts: float) -> None:
    raise CapError(f"gpu_check is observe-only: refused to set GPU {index} to {watts:g} W")


def default_caps(gpu: Any, n: int = 6) -> list[float]:
    lo, hi = gpu.constraints()
    return sorted({float(round(c / 10.0) * 10.0) for c in np.linspace(lo, hi, n)})


def control_dry_runs(gpus: list[Any], device: str) -> list[dict[str, Any]]:
    """``wattflex control --dry-run`` at ``BUDGET_FRACTIONS`` of the GPUs' maximum limits."""
    nominal = sum(g.constraints()[1] for g in gpus)
    jobs = ["--job", ",".join(str(g.index) for g in gpus)] if device == "cuda" else []
    out = []
    for f in BUDGET_FRACTIONS:
        budget = round(f * nominal)
        argv = ["control", "--dry-run", "--budget-w", str(budget), *jobs]
        so, se = io.StringIO(), io.StringIO()
        with contextlib.redirect_stdout(so), contextlib.redirect_stderr(se):
            rc = cli.main(argv)
        rows = [
            line.split() for line in so.getvalue().splitlines() if re.match(r"^gpu[\d+]+\s", line)
        ]
        out.append(
            {
                "budget_w": budget,
                "fraction": f,
                "command": "wattflex " + " ".join(argv),
                "exit": rc,
                "would_set_w": {int(r[1]): float(r[4]) for r in rows},
                "stdout": so.getvalue(),
                "stderr": se.getvalue(),
            }
        )
    return out


def dry_runs(args: argparse.Namespace, work: Path) -> dict[str, Any]:
    """The staircase and the controller on a live training run of the real device, observe-only."""
    outdir = work / "staircase"
    outdir.mkdir(parents=True)
    # Lazy: training.trainer imports torch; only its file names are needed here.
    from wattflex.runs.training.train_config import LIVE_STEPS_FILE, STOP_FILE

    gpus = nvml.open_gpus(1 if args.device == "cuda" else None, set_limit=refuse_to_set, gpm=True)
    caps = sorted(args.caps) if args.caps else default_caps(gpus[0])
    dwell = args.staircase_seconds / len(caps)
    spec = run_spec(
        args,
        "staircase",
        True,
        FIRST_STEP_TIMEOUT_S + 2 * args.staircase_seconds,
        work / "state",
        gpus[0].power_limit_w(),
    )
    cfg = TrainConfig.from_spec(spec, outdir)
    cfg.validate()
    cfg.to_json(outdir / "train_config.json")
    t0 = time.time()
    device = RecordingDevice(gpus, t0)
    log_path = outdir / "train.log"
    sampler = TelemetrySampler(gpus, SAMPLER_PERIOD_S, t0).start()
    proc = start_training(training_command(outdir / "train_config.json", t0, 1), log_path)
    try:
        deadline = time.monotonic() + FIRST_STEP_TIMEOUT_S
        while read_live_steps(outdir / LIVE_STEPS_FILE).empty:
            if proc.poll() is not None:
                raise training_error(proc.returncode, log_path)
            if time.monotonic() > deadline:
                raise RuntimeError(
                    f"no training step within {FIRST_STEP_TIMEOUT_S:g} s (see {log_path})"
                )
            time.sleep(0.2)
        time.sleep(min(5.0, dwell))  # a few seconds of training before the controller reads power
        control = control_dry_runs(gpus, args.device)

        def series() -> pd.DataFrame:
            s = job_series(sampler.frame())
            return s[s["n_gpus"] == len(gpus)].reset_index(drop=True)

        run = PollingRun(
            device,
            series,
            lambda: read_live_steps(outdir / LIVE_STEPS_FILE),
            lambda: (outdir / STOP_FILE).touch(),
            max_duration_s=time.time() - t0 + args.staircase_seconds,
            poll_s=max(0.5, 5 * SAMPLER_PERIOD_S),
            t0=t0,
            clock=time.time,
            ended=lambda: proc.poll() is not None,
        )
        criteria = SteadyCriteria(min_settle_s=min(10.0, dwell / 3))
        result = staircase(run, caps, criteria, SummaryProtocol(), max_dwell_s=dwell)
        with contextlib.suppress(Exception):
            proc.wait(60)  # the stop file ends training after its current step
    finally:
        terminate(proc)
        sampler.stop()
    if proc.returncode not in (0, None) and not result.visits:
        raise training_error(proc.returncode, log_path)
    visits = [
        {
            **a,
            **{
                k: v.record()[k]
                for k in ("settled", "reason", "n_samples", "n_steps", "power_w", "tokens_per_s")
            },
        }
        for a, v in zip(device.asked, result.visits)
    ]
    return {
        "caps": caps,
        "dwell_s": dwell,
        "gpus": [g.index for g in gpus],
        "visits": visits,
        "stop_reason": result.stop_reason,
        "restore_calls": device.restores,
        "set_calls_to_nvml": 0,
        "control": control,
        "note": "The staircase's device records set_cap and sets nothing: every window was measured at the "
        "GPUs' current limit, so its power (job total) and tokens/s are the same job at one limit",
    }


# ---- g) the anchor, measured -----------------------------------------------------------------------
def kernel_timeline(
    kind: str,
    device: str,
    seconds: float,
    sample: Callable[[float], dict[str, Any]],
    n: int = ANCHOR_GEMM_N,
    triad_mb: float = TRIAD_MB,
) -> dict[str, Any]:
    """Run a bf16 GEMM (``kind`` gemm) or an fp32 triad ``a = b + 3 c`` (``kind`` triad) back to
    back for ``seconds`` while a thread reads ``sample(t)`` (an NVML row) every 0.2 s; the work
    done (FLOP or bytes) against time, and the samples. Sets nothing."""
    import threading

    import torch

    if kind == "gemm":
        a, b = (torch.randn(n, n, device=device, dtype=torch.bfloat16) for _ in range(2))
        out = torch.empty_like(a)
        step, work = (lambda: torch.matmul(a, b, out=out)), 2.0 * n**3
    else:
        elems = int(triad_mb * 2**20 // 4)
        a, b, c = (torch.rand(elems, device=device) for _ in range(3))
        step, work = (
            (lambda: torch.add(b, c, alpha=3.0, out=a)),
            3.0 * 4 * elems,
        )  # STREAM counts 3 arrays
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    step()
    sync()
    samples: list[dict[str, Any]] = []
    stop = threading.Event()
    t0 = time.monotonic()

    def read() -> None:
        while not stop.is_set():
            samples.append({"t_s": time.monotonic() - t0, **sample(time.monotonic() - t0)})
            stop.wait(ANCHOR_SAMPLE_S)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    done, timeline = 0, [(0.0, 0.0)]
    while time.monotonic() - t0 < seconds:
        for _ in range(4):
            step()
        sync()
        done += 4
        timeline.append((time.monotonic() - t0, done * work))
    stop.set()
    reader.join()
    return {"timeline": timeline, "samples": samples, "seconds": seconds}


def steady_reading(kind: str, run: dict[str, Any], gpu_model: str | None) -> dict[str, Any]:
    """The second half of a :func:`kernel_timeline`: rate, median SM clock, mean power, the limit;
    for the GEMM its tensor activity (achieved over the datasheet peak at that clock), for the
    triad its HBM efficiency; ``gpu_model`` the catalogue's name (H100, H200) if known."""
    from wattflex.gpus import GPUS

    half = run["seconds"] / 2
    t = np.array([p[0] for p in run["timeline"]])
    w = np.array([p[1] for p in run["timeline"]])
    late = t >= half
    if late.sum() < 2:
        raise RuntimeError(
            f"{kind}: fewer than 2 timed batches in the second half; raise --anchor-seconds"
        )
    rate = (w[late][-1] - w[late][0]) / (t[late][-1] - t[late][0])
    s = pd.DataFrame(run["samples"])
    s = s[s["t_s"] >= half] if len(s) else s
    if s.empty:
        raise RuntimeError(f"{kind}: no NVML sample in the second half")
    out = {
        "sm_clock_mhz": float(s["sm_clock_mhz"].median()),
        "mem_clock_mhz": float(s["mem_clock_mhz"].median()),
        "power_w": float(s["power_w"].mean()),
        "power_limit_w": float(s["power_limit_w"].median()),
        "enforced_limit_w": float(s["enforced_limit_w"].median()),
        "n_samples": int(len(s)),
        "gpu_model": gpu_model,
    }
    spec = GPUS.get(gpu_model or "")
    if kind == "gemm":
        out["tflops"] = rate / 1e12
        out["tensor_activity"] = (
            rate / (spec.tensor_flops_per_s(out["sm_clock_mhz"] / spec.sm_clock_max_mhz))
            if spec
            else math.nan
        )
    else:
        out["bandwidth_gb_s"] = rate / 1e9
        out["hbm_efficiency"] = rate / (spec.hbm_tb_s * 1e12) if spec else math.nan
    return out


def catalogue_model(nvml_name: str | None) -> str | None:
    """The catalogue's name of an NVML device name ("NVIDIA H200" -> "H200"), None if it has none."""
    from wattflex.gpus import GPUS

    return next((k for k in GPUS if nvml_name and k in nvml_name), None)


def anchor_kernels(args: argparse.Namespace, nvml_name: str | None) -> dict[str, Any]:
    """g) The anchor GEMM and the HBM triad on GPU 0 (observe-only)."""
    if args.device != "cuda":
        return {
            "skipped": "needs --device cuda: a CPU GEMM says nothing about the GPU's clock under its limit"
        }
    gpu = nvml.open_gpus(1, gpm=False, set_limit=refuse_to_set)[0]  # the job's first: cuda:0
    model = catalogue_model(nvml_name)
    out: dict[str, Any] = {}
    for kind in ("gemm", "triad"):
        out["anchor_gemm" if kind == "gemm" else "hbm_triad"] = steady_reading(
            kind, kernel_timeline(kind, "cuda", args.anchor_seconds, gpu.sample), model
        )
    out["limit_binds"] = out["anchor_gemm"]["power_w"] >= 0.97 * out["anchor_gemm"]["power_limit_w"]
    return out


SMI_QUERY = ["--query-gpu=index,uuid,pci.bus_id", "--format=csv,noheader"]
IDENTITY_ENV = ("CUDA_VISIBLE_DEVICES", "CUDA_DEVICE_ORDER", "SLURM_JOB_GPUS", "SLURM_STEP_GPUS")


def gpu_identity(args: argparse.Namespace) -> dict[str, Any]:
    """k) The job's GPUs as CUDA, NVML and nvidia-smi number them, matched by UUID."""
    try:
        nvml.nvml()
    except RuntimeError as exc:  # no driver here: nothing to name (doctor says so)
        return {"skipped": str(exc)}
    cuda = None
    if args.device == "cuda":
        import torch

        cuda = [
            str(torch.cuda.get_device_properties(i).uuid) for i in range(torch.cuda.device_count())
        ]
    smi_path = shutil.which("nvidia-smi")
    smi = (
        subprocess.run(
            [smi_path, *SMI_QUERY], capture_output=True, text=True, timeout=60, check=True
        ).stdout
        if smi_path
        else None
    )
    rows = nvml.identity_table(nvml.job_gpus(), cuda, smi)
    out: dict[str, Any] = {
        "rows": rows,
        "env": {k: os.environ.get(k) for k in IDENTITY_ENV},
        "nvidia_smi": smi_path,
        "cuda_devices": None if cuda is None else len(cuda),
    }
    mapped = {r["cuda_ordinal"] for r in rows} - {None}
    if cuda is not None and mapped != set(range(len(cuda))):
        out["ok"] = False
        out["error"] = (
            f"CUDA sees {len(cuda)} device(s), {len(mapped)} of them among the job's NVML GPUs"
        )
    return out


# ---- the report ---------------------------------------------------------------------------------
def gpu_slug(model: str | None) -> str:
    return (
        re.sub(r"[^a-z0-9]+", "-", (model or "no-gpu").lower().replace("nvidia", "")).strip("-")
        or "gpu"
    )


def limits(report: dict[str, Any]) -> dict[int, float | None]:
    return {g["index"]: g["power_limit_w"] for g in report.get("gpus", [])}


def _f(v: Any, fmt: str = ".4g") -> str:
    return "-" if v is None or (isinstance(v, float) and not math.isfinite(v)) else format(v, fmt)


def _skipped_or_failed(step: dict[str, Any]) -> list[str]:
    """The lines of a step that was skipped or that failed (none for one that ran fine)."""
    lines = [f"skipped: {step['skipped']}", ""] if step.get("skipped") else []
    return lines + (
        [f"failed: {step.get('error', '')[:1500]}", ""] if not step.get("ok", True) else []
    )


def _unproven_tail(step: dict[str, Any]) -> list[str]:
    """A GPU-only step's closing lines: why it was skipped or failed, and that it is unproven."""
    return [*_skipped_or_failed(step), UNPROVEN, ""]


def _allreduce_text(e: dict[str, Any], ranks: str) -> str:
    return (
        f"{e['backend']} ({e.get('nccl_version') or 'no NCCL'}), {ranks}, {e['mb_per_rank']:g} MB per rank, "
        f"{e['iters']} timed all-reduces: {e['seconds_per_iter'] * 1e3:.2f} ms each, algorithm bandwidth "
        f"{e['algbw_gb_s']:.2f} GB/s, bus bandwidth **{e['busbw_gb_s']:.2f} GB/s**; sum "
        f"{'correct' if e['sum_correct'] else 'WRONG'}."
    )


def markdown(res: dict[str, Any]) -> str:
    s = res["steps"]
    lines = [
        f"# GPU check: {res['gpu_model'] or 'no GPU'} on {res['host']} ({res['started_utc']})",
        "",
    ]
    if res["fake_nvml"]:
        lines += [
            "**FAKE NVML** (tests/fakes/fake_pynvml.py): a dry run of this script, not a measurement.",
            "",
        ]
    if res["device"] == "cpu":
        lines += [
            "**Training on the CPU** (`--device cpu`): tokens/s and the overhead say nothing about a GPU.",
            "",
        ]
    lines += [
        f"Observe-only: no power limit, clock or mode was set. Power limits before {res['limits_before']}, "
        f"after {res['limits_after']}: **{'unchanged' if res['limits_unchanged'] else 'CHANGED'}**.",
        f"Command: `{res['command']}`; {res['total_s']:.0f} s in all.",
        "",
    ]
    lines += ["## a) wattflex doctor", ""]
    a = s.get("doctor", {})
    lines += (
        ["```", a["text"].rstrip(), "```"] if a.get("ok") else [f"failed: {a.get('error')}"]
    ) + [""]

    lines += ["## b) Sampler overhead", ""]
    b = s.get("sampler_overhead", {})
    if b.get("runs"):
        lines += [
            f"Model `{res['model']}` trained through the harness (`run_real`, torchrun) for {res['seconds']:g} s "
            f"per run; steady tokens/s after the first {WARMUP_FRACTION:.0%} of the step time. Sampler at "
            f"{1 / SAMPLER_PERIOD_S:g} Hz in the orchestrating process, as in real runs.",
            "",
            "| pair | run | sampler | tokens/s | steps used | median step s | sampler Hz |",
            "| --- | --- | --- | --- | --- | --- | --- |",
        ]
        for r in b["runs"]:
            head = f"| {r['pair']} | {r['name']} | {'on' if r['sampler'] else 'off'} |"
            if "error" in r:
                lines.append(f"{head} failed: {r['error'][:120]} | | | |")
            else:
                lines.append(
                    f"{head} {_f(r['tokens_per_s'], '.1f')} | {r['steps_used']} | "
                    f"{_f(r['step_s_median'], '.4f')} | {_f(r['sampler_hz'], '.2f')} |"
                )
        lines.append("")
    if b.get("overhead_pct_per_pair"):
        per_pair = ", ".join(f"{v:+.2f} %" for v in b["overhead_pct_per_pair"])
        lines.append(
            f"Overhead 1 - on/off per pair: {per_pair}; mean **{b['overhead_pct']:+.2f} %** (spread "
            f"{b['overhead_pct_min']:+.2f} to {b['overhead_pct_max']:+.2f} %; run-to-run CV without the "
            f"sampler {_f(b.get('off_run_cv_pct'), '.2f')} %). Goal <= {OVERHEAD_GOAL_PCT} %: "
            f"{'met' if b['overhead_pct'] <= OVERHEAD_GOAL_PCT else 'NOT met'}."
        )
    if not b.get("ok"):
        lines.append(f"failed: {b.get('error', '')[:1500]}")
    lines.append("")

    lines += ["## c) Telemetry columns (sampler-on runs)", ""]
    c = s.get("telemetry", {})
    if c.get("ok"):
        lines += [
            f"{c['rows']} rows, GPUs {c['gpus']}.",
            "",
            "| column | source | min | max | NaN | rows |",
            "| --- | --- | --- | --- | --- | --- |",
        ]
        lines += [
            f"| {x['column']} | {x['source']} | {_f(x['min'])} | {_f(x['max'])} | {x['nan']} | {x['n']} |"
            for x in c["columns"]
        ]
    else:
        lines.append(f"failed: {c.get('error')}")
    lines.append("")

    lines += ["## d) Staircase and controller dry runs (what they WOULD set)", ""]
    d = s.get("dry_runs", {})
    if d.get("ok"):
        lines += [
            f"Staircase on a live training run of GPU(s) {d['gpus']}, caps {d['caps']} W, at most "
            f"{d['dwell_s']:.0f} s each; stop reason `{d['stop_reason']}`. {d['note']}; NVML setter calls: "
            f"{d['set_calls_to_nvml']}, restore calls recorded: {d['restore_calls']}.",
            "",
            "| t s | would set W | enforced now W | settled | reason | samples | steps | job power W "
            "| tokens/s |",
            "| --- | --- | --- | --- | --- | --- | --- | --- | --- |",
        ]
        lines += [
            f"| {v['t_s']} | {v['would_set_w']:g} | {_f(v['enforced_limit_w_now'], 'g')} | {v['settled']} | "
            f"{v['reason']} | {v['n_samples']} | {v['n_steps']} | {_f(v['power_w'], '.1f')} | "
            f"{_f(v['tokens_per_s'], '.1f')} |"
            for v in d["visits"]
        ]
        lines.append("")
        for ctl in d["control"]:
            lines += [
                f"`{ctl['command']}` (exit {ctl['exit']}):",
                "",
                "```",
                ctl["stdout"].rstrip(),
                *([ctl["stderr"].rstrip()] if ctl["stderr"].strip() else []),
                "```",
                "",
            ]
    else:
        lines.append(f"failed: {d.get('error')}")
    lines.append("")
    lines += ["## e) All-reduce across this node's GPUs", ""]
    e = s.get("allreduce", {})
    if "busbw_gb_s" in e:
        lines += [
            _allreduce_text(e, f"{e['world_size']} ranks")
            + f" Environment from `cuda.nccl`: `{e['nccl_env']}`. "
            f"NCCL warnings: {e['warnings'] or 'none'}. One node only: NCCL across nodes is i)'s.",
            "",
        ]
    if not e.get("ok"):
        lines += [f"failed: {e.get('error', '')[:1500]}", ""]
    lines += [
        "## g) The emulator's anchor, measured (bf16 GEMM and HBM triad at the current limit)",
        "",
    ]
    g = s.get("anchor", {})
    if "anchor_gemm" in g:
        m, h = g["anchor_gemm"], g["hbm_triad"]
        lines += [
            f"bf16 GEMM {ANCHOR_GEMM_N}^3: **{m['sm_clock_mhz']:.0f} MHz** at {m['power_w']:.0f} W of a "
            f"{m['power_limit_w']:g} W limit ({'binds' if g['limit_binds'] else 'does NOT bind: no anchor'}), "
            f"{m['tflops']:.0f} TFLOPS, tensor activity {_f(m['tensor_activity'], '.3f')}. HBM triad: "
            f"{h['bandwidth_gb_s']:.0f} GB/s (efficiency {_f(h['hbm_efficiency'], '.3f')}) at "
            f"{h['sm_clock_mhz']:.0f} MHz, {h['power_w']:.0f} W. `wattflex calibrate --gpu-check <this .json>` "
            "turns the GEMM into a calibration file.",
            "",
        ]
    lines += _skipped_or_failed(g)
    lines += ["## h) Real weights, loaded as the harness loads them", ""]
    h = s.get("real_weights", {})
    if "loss" in h:
        lines += [
            f"`{res['model_path']}`: MXFP4 checkpoint {h['mxfp4_checkpoint']}, experts loaded as "
            f"{', '.join(h['expert_dtypes']) or 'no experts'}, {h['params'] / 1e9:.2f}B parameters with LoRA, "
            f"loaded in {h['load_s']:.0f} s; one LoRA step: loss {h['loss']:.3f}, "
            f"{h['expert_lora_params_with_grad']} expert adapters with gradients"
            + (f", peak GPU memory {h['peak_gpu_gib']:.1f} GiB." if "peak_gpu_gib" in h else "."),
            "",
        ]
    lines += _skipped_or_failed(h)
    ht = s.get("real_weights_throughput", {})
    if "tokens_per_s" in ht:
        seq, batch = ht["seq_len_batch"]
        lines += [
            f"Through the harness (`run_real`, torchrun, LoRA, seq {seq} x batch {batch}) at the current limit "
            f"({_f(ht['cap_w'], 'g')} W): {ht['steps']} of {ht['steps_asked']} steps, steady **"
            f"{_f(ht['tokens_per_s'], '.1f')} tokens/s** over {ht['steps_used']} (median step "
            f"{_f(ht['step_s_median'], '.3f')} s)"
            + (
                f", mean power {_f(ht.get('power_w_mean'), '.0f')} W"
                if "power_w_mean" in ht
                else ""
            )
            + ".",
            "",
        ]
    lines += _skipped_or_failed(ht)
    lines += [UNPROVEN, ""]

    lines += ["## i) All-reduce across nodes", ""]
    i = s.get("allreduce_nodes", {})
    if "busbw_gb_s" in i:
        ranks = f"{i['nnodes']} nodes x {i['nproc_per_node']} rank(s) ({i['launcher']}, c10d at `{i['rdzv']}`)"
        lines += [
            _allreduce_text(i, ranks)
            + f" Transport across nodes **{i['transport'] or 'none over a network'}**"
            + (
                f" (networks {i['networks']}, channels {i['channel_transports']}, GPUDirect RDMA {i['gdrdma']})"
                if "networks" in i
                else ""
            )
            + f". Environment: `{i['nccl_env']}`.",
            "",
        ]
    lines += _skipped_or_failed(i)
    lines += [UNPROVEN, ""]

    lines += [
        "## j) torch.compile graph breaks per decoder layer (tiny models of the catalogue's families)",
        "",
    ]
    j = s.get("compile_breaks", {})
    if j.get("families"):
        lines += [
            f"Backend `{j['backend']}`; {j['layers_with_breaks']} layer(s) with graph breaks.",
            "",
            "| family | task | layer | class | type | graphs | breaks | compiled | reasons |",
            "| --- | --- | --- | --- | --- | --- | --- | --- | --- |",
        ]
        for f in j["families"]:
            for r in f["layers"]:
                c = r["compiled"]
                comp = (
                    f"ok {c['seconds']} s, diff {c['max_abs_diff']:.2g}"
                    if c.get("ok")
                    else f"FAILED: {c['error'][:100]}"
                    if "error" in c
                    else f"as layer {c['same_kind_as_layer']}"
                    if "same_kind_as_layer" in c
                    else c.get("skipped", "")
                )
                reasons = (
                    "; ".join(
                        (x.splitlines() or [""])[0].replace("|", "/")[:120]
                        for x in r["break_reasons"]
                    )
                    or "-"
                )
                lines.append(
                    f"| {f['family']} | {f['task']} | {r['index']} | {r['class']} | {r['layer_type'] or '-'} | "
                    f"{r['graphs']} | {r['graph_breaks']} | {comp} | {reasons} |"
                )
        lines.append("")
    lines += _skipped_or_failed(j)
    lines += [UNPROVEN, ""]
    ident = s.get("gpu_identity", {})
    lines += ["## k) The job's GPUs: CUDA, NVML and nvidia-smi, matched by UUID", ""]
    if ident.get("rows"):
        lines += [
            "Environment: " + ", ".join(f"`{n}={v}`" for n, v in ident["env"].items() if v) + ".",
            "",
            "| NVML index | UUID | PCI bus id | CUDA ordinal | nvidia-smi index |",
            "| --- | --- | --- | --- | --- |",
        ]
        for r in ident["rows"]:
            lines.append(
                f"| {r['nvml_index']} | {r['uuid']} | {r['pci_bus_id']} | "
                f"{_f(r['cuda_ordinal'], 'd')} | {_f(r['nvidia_smi_index'], 'd')} |"
            )
        lines.append("")
    lines += _unproven_tail(ident)
    failed = [k for k, v in s.items() if not v.get("ok")]
    lines += ["## Verdict", "", f"Steps failed: {', '.join(failed) if failed else 'none'}."]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["node"]:  # i)'s node agents (an srun task, or a local one on cpu)
        return node_main(argv, run=allreduce_node, prog="benchmarks/gpu_check.py")
    args = parse_args(argv)
    if args.allreduce_worker:
        allreduce_worker(args.allreduce_worker, args.allreduce_out, args.allreduce_mb)
        return 0
    started = time.monotonic()
    work = Path(tempfile.mkdtemp(prefix="wattflex-gpu-check-"))
    (work / "state").mkdir()
    res: dict[str, Any] = {
        "host": socket.gethostname(),
        "device": args.device,
        "model": args.model,
        "model_path": args.model_path,
        "seconds": args.seconds,
        "command": "python benchmarks/gpu_check.py " + " ".join(argv),
        "started_utc": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "steps": {},
    }
    doctor = record_step(res, "doctor", lambda: {"report": diagnose(args.configfile)})
    report = doctor.get("report", {})
    if doctor["ok"]:
        doctor["text"] = format_report(report)
    nv = report.get("nvml", {})
    res["nvml_module"] = nv.get("module")
    res["fake_nvml"] = "fake" in str(nv.get("module") or "")
    res["gpu_model"] = nv["gpus"][0]["name"] if nv.get("gpus") else None
    res["limits_before"] = limits(nv)
    first_limit = next(iter(res["limits_before"].values()), None) or 0.0

    ov = record_step(res, "sampler_overhead", lambda: sampler_overhead(args, work, first_limit))
    record_step(res, "telemetry", lambda: telemetry_columns(ov.get("runs", [])))
    record_step(res, "dry_runs", lambda: dry_runs(args, work))
    record_step(res, "allreduce", lambda: allreduce(args, work, len(nv.get("gpus") or [])))
    anchor = record_step(res, "anchor", lambda: anchor_kernels(args, res["gpu_model"]))
    if "anchor_gemm" in anchor:  # where wattflex calibrate --gpu-check reads it
        res["steps"]["anchor_gemm"] = {"ok": anchor["ok"], **anchor["anchor_gemm"]}
    record_step(res, "real_weights", lambda: real_weights(args))
    record_step(
        res,
        "real_weights_throughput",
        lambda: real_weight_throughput(args, work, first_limit, bool(nv.get("available"))),
    )
    record_step(
        res, "allreduce_nodes", lambda: allreduce_nodes(args, work, len(nv.get("gpus") or []))
    )
    record_step(res, "compile_breaks", lambda: compile_breaks(args))
    record_step(res, "gpu_identity", lambda: gpu_identity(args))

    res["limits_after"] = limits(probe_nvml())
    res["limits_unchanged"] = res["limits_after"] == res["limits_before"]
    res["total_s"] = time.monotonic() - started
    name = f"gpu_check_{gpu_slug(res['gpu_model'])}" + (
        "_cpu-training" if args.device == "cpu" else ""
    )
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"{name}.md").write_text(markdown(res))
    (args.out / f"{name}.json").write_text(json.dumps(res, indent=2, default=str) + "\n")
    if args.keep:
        print(f"runs kept in {work}", file=sys.stderr)
    else:
        shutil.rmtree(work, ignore_errors=True)
    print(f"wrote {args.out / name}.md and .json")
    ok = all(v.get("ok") for v in res["steps"].values()) and res["limits_unchanged"]
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
