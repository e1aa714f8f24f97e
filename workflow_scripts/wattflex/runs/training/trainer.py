"""The training loop: one process per GPU under torchrun (or one in-process for tests).

Rank 0 decides when to stop and when the eval and checkpoint events happen (the paper's
protocol: eval at 10 min, one distributed checkpoint at 20 min, 30-minute runs) and
shares the decision with the per-step loss all-reduce, so every rank leaves the loop at
the same step. Step end times are ``time.time() - t0`` with ``t0`` handed down by the
orchestrator, the clock its telemetry sampler uses.
"""

from __future__ import annotations

import contextlib
import datetime
import logging
import math
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd
import torch
from torch import nn

from wattflex import provenance as prov
from wattflex.gpus import peak_bf16_flops
from wattflex.runs.training import checkpoint as ckpt
from wattflex.runs.training import data, hostmem, models, sharded
from wattflex.runs.training import parallel as par
from wattflex.runs.training.loss import causal_lm_loss, chunked_applies
from wattflex.runs.training.train_config import (
    LIVE_STEPS_FILE,
    RESULT_FILE,
    STEPS_FILE,
    STOP_FILE,
    TrainConfig,
)

log = logging.getLogger("wattflex.runs.training")
HF_CONFIG_KEYS = (
    "model_type",
    "vocab_size",
    "hidden_size",
    "intermediate_size",
    "moe_intermediate_size",
    "num_hidden_layers",
    "num_attention_heads",
    "num_key_value_heads",
    "head_dim",
    "num_experts",
    "num_local_experts",
    "n_routed_experts",
    "num_experts_per_tok",
    "top_k_experts",
    "layer_types",
    "max_position_embeddings",
)


@dataclass
class Dist:
    """This rank's place in the job: rank, world size, local rank and its torch device."""

    rank: int = 0
    world: int = 1
    local_rank: int = 0
    device: torch.device = torch.device("cpu")

    @property
    def active(self) -> bool:
        """Whether the job runs more than one rank (a process group is up)."""
        return self.world > 1


def init_distributed(cfg: TrainConfig) -> Dist:
    """Process group from torchrun's environment (NCCL on GPU, gloo on CPU). ``device_id`` makes
    NCCL connect eagerly at init (torch docs); the timeout is ``cuda.dist_timeout_s``: a large
    model's load can outlast the 10-minute default."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    rank, local = int(os.environ.get("RANK", "0")), int(os.environ.get("LOCAL_RANK", "0"))
    if cfg.device == "cuda":
        if not torch.cuda.is_available():
            raise RuntimeError(
                "cuda.device is 'cuda' but torch sees no GPU (CPU-only torch build, or "
                "CUDA_VISIBLE_DEVICES empty); use cuda.device: cpu for a smoke run"
            )
        torch.cuda.set_device(local)
        device = torch.device("cuda", local)
    else:
        device = torch.device("cpu")
    if world > 1 and not torch.distributed.is_initialized():
        cuda = cfg.device == "cuda"
        torch.distributed.init_process_group(
            "nccl" if cuda else "gloo",
            device_id=device if cuda else None,
            timeout=datetime.timedelta(seconds=cfg.dist_timeout_s),
        )
    return Dist(rank, world, local, device)


def decoder_layers(model: nn.Module) -> list[nn.Module]:
    """The transformer blocks (the ``layers`` ModuleList), units of FSDP sharding and compile."""
    for name, mod in model.named_modules():
        if name.endswith("layers") and isinstance(mod, nn.ModuleList):
            return list(mod)
    return []


class StartupClock:
    """When each start-up stage ended, in seconds since the run's t0 (``timings`` in run.json)."""

    def __init__(self, t0: float):
        self.t0, self.marks = t0, {}

    def mark(self, stage: str) -> None:
        """Note that ``stage`` ended now (s since t0, as ``<stage>_s``)."""
        self.marks[f"{stage}_s"] = time.time() - self.t0


def _adapt(model: nn.Module, cfg: TrainConfig) -> nn.Module:
    """Gradient checkpointing and LoRA: on a whole model or on the meta device alike."""
    if cfg.grad_checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    return models.apply_lora(model, cfg) if cfg.task == "lora" else model


def _mp_policy(policy: str):
    from torch.distributed.fsdp import MixedPrecisionPolicy

    return (
        MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
        if policy == "bf16-mixed"
        else MixedPrecisionPolicy()
    )


def _materialize(
    model: nn.Module, cfg: TrainConfig, dist: Dist, dtype: torch.dtype, clock: StartupClock
) -> None:
    """Each rank allocates and fills its shard of the sharded meta ``model``: real weights read
    whole by rank 0 alone and broadcast slice by slice, or the model's own random init."""
    if cfg.model_path and not cfg.tiny:
        full = (
            _adapt(models.load_pretrained(cfg, dtype), cfg).state_dict() if dist.rank == 0 else None
        )
        sharded.load_from_rank0(model, full, dist.device)
        del full
        clock.mark("load")
    else:
        sharded.init_random(model, dist.device, cfg.seed, dist.rank)
        clock.mark("materialize")


def _build_fsdp(cfg: TrainConfig, dist: Dist, dtype: torch.dtype, clock: StartupClock) -> nn.Module:
    """Meta build, LoRA/checkpointing/compile, FSDP2 (training.sharded), then materialise."""
    model = _adapt(sharded.on_meta(lambda: models.from_config(cfg, dtype)), cfg)
    if cfg.compile:
        for layer in decoder_layers(model):
            layer.compile()
    sharded.apply_fsdp(model, decoder_layers(model), _mp_policy(cfg.dtype_policy))
    clock.mark("build")
    _materialize(model, cfg, dist, dtype, clock)
    return model


def _build_expert_parallel(
    cfg: TrainConfig, dist: Dist, dtype: torch.dtype, ep: int, clock: StartupClock
) -> nn.Module:
    """Meta build laid out by transformers' expert-parallel plan (training.parallel), then
    materialised like the FSDP path. Not ``from_pretrained(distributed_config=...)``: with
    transformers 5.24 on CPU its FSDP shards are views into whole-tensor storages (seen on rank
    1), which holds the whole model and which DCP's asynchronous staging cannot copy."""
    model = _adapt(sharded.on_meta(lambda: models.from_config(cfg, dtype, ep)), cfg)
    model = par.shard(model, par.distributed_config(cfg, dist.world, ep), cfg.device)
    clock.mark("build")
    _materialize(model, cfg, dist, dtype, clock)
    if cfg.compile:
        for layer in decoder_layers(model):
            layer.compile()
    return model


def _build_whole(
    cfg: TrainConfig, dist: Dist, dtype: torch.dtype, ddp: bool, clock: StartupClock
) -> nn.Module:
    """One process, or DDP: every rank holds all weights anyway, so it builds or loads them whole
    (the same seed on every rank; DDP also broadcasts rank 0's weights at wrap)."""
    torch.manual_seed(cfg.seed)
    model = _adapt(models.build_model(cfg, dtype), cfg)
    clock.mark("load" if cfg.model_path and not cfg.tiny else "build")
    model.to(dist.device)
    if cfg.compile:
        for layer in decoder_layers(model):
            layer.compile()
    if ddp:
        model = nn.parallel.DistributedDataParallel(
            model,
            device_ids=[dist.local_rank] if cfg.device == "cuda" else None,
            find_unused_parameters=cfg.architecture == "moe",
        )  # unrouted experts' LoRA get no grad
    return model


def prepare_model(
    cfg: TrainConfig, dist: Dist, clock: StartupClock | None = None
) -> tuple[nn.Module, dict[str, Any]]:
    """Build or load, LoRA-wrap, checkpoint, compile and parallelise the model; FSDP and EP
    never build it whole on any rank (training.sharded)."""
    clock = clock or StartupClock(time.time())
    policy = cfg.dtype_policy
    # bf16-mixed keeps fp32 master weights for pretraining; LoRA's frozen base is bf16 there.
    load_dtype = (
        torch.bfloat16
        if policy == "bf16" or (policy == "bf16-mixed" and cfg.task == "lora")
        else torch.float32
    )
    # Impossible expert layouts fail here, before anything is built.
    experts = models.routing(models.model_config(cfg, cfg.ep))[0] if cfg.ep > 1 else None
    layout = par.expert_layout(cfg, dist.world, experts)
    parallel = (
        cfg.parallel
        if cfg.parallel != "auto"
        else ("fsdp" if cfg.device == "cuda" or layout.ep > 1 else "ddp")
    )
    if layout.ep > 1:
        model = _build_expert_parallel(cfg, dist, load_dtype, layout.ep, clock)
    elif dist.active and parallel == "fsdp":
        model = _build_fsdp(cfg, dist, load_dtype, clock)
    else:
        model = _build_whole(cfg, dist, load_dtype, dist.active, clock)
    inner = model.module if isinstance(model, nn.parallel.DistributedDataParallel) else model
    hf_cfg = sharded.hf_model(inner).config
    counts = models.parameter_counts(inner, *models.routing(hf_cfg))
    info = {
        **counts,
        "flops_per_token": models.flops_per_token(
            counts["params_active"], cfg.model_facts, hf_cfg, cfg.seq_len, cfg.task
        ),
        "model_bytes": sharded.model_bytes(inner),
        "model_class": sharded.model_class(inner),
        "load_dtype": str(load_dtype).replace("torch.", ""),
        "attn_implementation": getattr(hf_cfg, "_attn_implementation", None),
        "hf_config": models.per_layer_record(hf_cfg, HF_CONFIG_KEYS),
    }
    if cfg.task == "lora":  # the adapters trained, beside params_trainable
        info["lora"] = models.lora_record(inner)
    info["parallel"] = parallel if dist.active else "none"
    info["sharded_build"] = layout.ep > 1 or info["parallel"] == "fsdp"
    info["ep_requested"] = cfg.ep
    info["ep_used"] = par.ep_in_effect(model)  # read off the sharded weights, not the request
    if layout.note:
        info["ep_note"] = layout.note
        log.warning("%s (ep_used=1 in run.json)", layout.note)
    return model, info


def _autocast(cfg: TrainConfig, info: dict[str, Any]):
    if cfg.device == "cuda" and cfg.dtype_policy == "bf16-mixed" and info["parallel"] != "fsdp":
        return torch.autocast("cuda", dtype=torch.bfloat16)
    return contextlib.nullcontext()


def _evaluate(
    model: nn.Module, batches, n: int, dev: torch.device, amp, chunk_tokens: int, chunked: bool
) -> float:
    model.eval()
    total = 0.0
    with torch.no_grad():
        for _ in range(n):
            x = next(batches).to(dev, non_blocking=True)
            with amp:
                total += float(causal_lm_loss(model, x, chunk_tokens, chunked))
    model.train()
    return total / max(n, 1)


def train(cfg: TrainConfig, t0: float | None = None) -> pd.DataFrame:
    """Train until ``duration_s`` (or ``max_steps``); rank 0 writes ``steps.parquet`` and
    ``.training.json`` to ``cfg.outdir`` and gets the step log back."""
    cfg.validate()
    t0 = time.time() if t0 is None else t0
    malloc_fixed = (
        hostmem.fixed_mmap_threshold()
    )  # freed tensors back to the kernel (training.hostmem)
    clock = StartupClock(t0)
    dist = init_distributed(cfg)
    clock.mark("init_process_group")
    models.import_libraries(cfg)  # the baseline includes the libraries, not the model
    rss_before_build = peak_rss_bytes()
    model, info = prepare_model(cfg, dist, clock)
    rss_after_build = peak_rss_bytes()
    step_peak_measured = hostmem.reset_peak_rss()  # VmHWM from here on: the steps' own peak
    info["loss_chunk_tokens"] = cfg.loss_chunk_tokens
    info["loss_unchunked_because"] = chunked_applies(model, cfg.loss_chunk_tokens)  # None: chunked
    chunked = info["loss_unchunked_because"] is None  # decided once, not per step
    vocab = int(info["hf_config"]["vocab_size"])
    trainable = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(
        trainable,
        lr=cfg.learning_rate,
        betas=(0.9, 0.95),
        weight_decay=0.1 if cfg.task == "pt" else 0.0,
    )
    stream = data.batches(
        cfg.data_path, vocab, cfg.seq_len, cfg.batch, cfg.seed, dist.rank, dist.world
    )
    amp = _autocast(cfg, info)
    dev = dist.device
    peak = peak_bf16_flops(torch.cuda.get_device_name(dev)) if cfg.device == "cuda" else None
    tokens_per_gpu = cfg.batch * cfg.seq_len
    eval_pending = cfg.eval_at_s is not None and cfg.eval_batches > 0
    ckpt_pending = cfg.checkpoint_at_s is not None
    # DCP's collectives (and the size sum) on CPU tensors, apart from the loop's all-reduces
    ckpt_group = (
        torch.distributed.new_group(backend="gloo") if ckpt_pending and dist.active else None
    )
    saves: list[ckpt.Save] = []
    rows: list[dict[str, Any]] = []
    events: list[dict[str, Any]] = []
    live = open(Path(cfg.outdir) / LIVE_STEPS_FILE, "w", buffering=1) if dist.rank == 0 else None
    if live:
        live.write("step,t_end_s,tokens,loss\n")
    stop_path = Path(cfg.outdir) / STOP_FILE
    step = 0
    found = (
        ckpt.latest(ckpt.checkpoint_root(cfg.checkpoint_dir, cfg.outdir)) if cfg.resume else None
    )
    if found is not None:  # a requeued job: on from its newest checkpoint
        ckpt.load(model, optimizer, found[1])
        step = found[0]
        events.append(
            {"event": "resume", "from_step": step, "path": str(found[1]), "t_s": time.time() - t0}
        )
        if dist.rank == 0:
            log.info("resumed from step %d (%s)", step, found[1])
    model.train()
    t_loop = time.time()
    prev_end = t_loop - t0
    while True:
        x = next(stream).to(dev, non_blocking=True)
        with amp:
            loss = causal_lm_loss(model, x, cfg.loss_chunk_tokens, chunked)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        step += 1
        elapsed = time.time() - t_loop
        stop = (
            elapsed >= cfg.duration_s
            or (cfg.max_steps is not None and step >= cfg.max_steps)
            or (dist.rank == 0 and stop_path.exists())
        )
        do_eval = eval_pending and elapsed >= cfg.eval_at_s
        do_ckpt = ckpt_pending and elapsed >= cfg.checkpoint_at_s
        ctl = torch.tensor([float(loss.detach()), 0.0, 0.0, 0.0], device=dev)
        if dist.rank == 0:
            ctl[1:] = torch.tensor([stop, do_eval, do_ckpt], dtype=ctl.dtype, device=dev)
        if dist.active:
            torch.distributed.all_reduce(ctl)
        ctl = ctl.tolist()  # synchronises with the device
        t_end = time.time() - t0
        step_s = t_end - prev_end
        tflops = (
            info["flops_per_token"] * tokens_per_gpu / step_s / 1e12 if step_s > 0 else math.nan
        )
        rows.append(
            {
                "step": step,
                "t_end_s": t_end,
                "tokens": tokens_per_gpu * dist.world,
                "loss": ctl[0] / dist.world,
                "step_time_s": step_s,
                "tflops": tflops,
                "mfu": tflops * 1e12 / peak if peak else math.nan,
            }
        )
        prev_end = t_end
        if step == 1:
            clock.mark("first_step")
        if live:  # line-buffered: each step is on disk as soon as it ends
            live.write(f"{step},{t_end!r},{rows[-1]['tokens']},{rows[-1]['loss']!r}\n")
        if dist.rank == 0 and (step <= 3 or step % 50 == 0):
            log.info("step %d t=%.1fs loss=%.4f %.3fs/step", step, t_end, rows[-1]["loss"], step_s)
        if ctl[2] > 0:
            eval_pending = False
            t_a = time.time() - t0
            eval_stream = data.batches(
                cfg.data_path, vocab, cfg.seq_len, cfg.batch, cfg.seed + 1, dist.rank, dist.world
            )
            eval_loss = _evaluate(
                model, eval_stream, cfg.eval_batches, dev, amp, cfg.loss_chunk_tokens, chunked
            )
            prev_end = time.time() - t0
            events.append(
                {
                    "event": "eval",
                    "after_step": step,
                    "t_start_s": t_a,
                    "t_end_s": prev_end,
                    "loss": eval_loss,
                    "batches": cfg.eval_batches,
                }
            )
        if ctl[3] > 0:
            ckpt_pending = False
            t_a = time.time() - t0
            path = ckpt.checkpoint_root(cfg.checkpoint_dir, cfg.outdir) / f"step{step}"
            event = {
                "event": "checkpoint",
                "after_step": step,
                "t_start_s": t_a,
                "path": str(path),
                "kept": cfg.keep_checkpoint,
            }
            saves.append(
                ckpt.start(model, optimizer, path, event, t0, ckpt_group, cfg.checkpoint_async)
            )
            prev_end = time.time() - t0
            event["t_end_s"] = prev_end  # training resumes (the write may go on behind it)
            events.append(event)
        if ctl[1] > 0:
            break
    if live:
        live.close()
    rss_steps = hostmem.hwm_bytes() if step_peak_measured else None
    for save in saves:
        ckpt.finish(save, dist.rank, dist.world, cfg.keep_checkpoint, ckpt_group)
    info["timings"] = {**clock.marks, "loop_start_s": t_loop - t0}
    # "steps": the peak from the end of the build to the end of the loop (None where the kernel's
    # mark cannot be reset); "run": the whole run's (the mark reset: the larger of it and the build's)
    info["peak_rss_bytes_per_rank"] = [
        {"rank": r, "before_build": v[0], "after_build": v[1], "steps": v[2], "run": v[3]}
        for r, v in enumerate(
            _every_rank(
                [
                    rss_before_build,
                    rss_after_build,
                    rss_steps,
                    max(rss_after_build, peak_rss_bytes()),
                ],
                dist,
            )
        )
    ]
    info["malloc_mmap_threshold_fixed"] = malloc_fixed
    info["cpu_binding"] = cfg.cpu_binding
    info["cpus_per_rank"] = [
        {"rank": r, "local_rank": v[0], "cpus": v[1]}
        for r, v in enumerate(_every_rank([dist.local_rank, sorted(os.sched_getaffinity(0))], dist))
    ]
    steps = pd.DataFrame(rows)
    if dist.rank == 0:
        _write_outputs(cfg, steps, events, info, dist, t0, t_loop)
    if dist.active:
        torch.distributed.barrier()
        torch.distributed.destroy_process_group()
    return steps


peak_rss_bytes = hostmem.peak_rss_bytes


def _every_rank(value: Any, dist: Dist) -> list[Any]:
    """Every rank's ``value``, in rank order (peak RSS: before the model build, after it, whole
    run; the CPUs a rank runs on)."""
    per_rank = [value]
    if dist.active:
        per_rank = [None] * dist.world
        torch.distributed.all_gather_object(per_rank, value)
    return per_rank


def _write_outputs(
    cfg: TrainConfig,
    steps: pd.DataFrame,
    events: list,
    info: dict,
    dist: Dist,
    t0: float,
    t_loop: float,
) -> None:
    device_name = torch.cuda.get_device_name(dist.device) if cfg.device == "cuda" else "cpu"
    record = prov.provenance(
        params={
            "task": cfg.task,
            "model": cfg.model_facts,
            "seq_len": cfg.seq_len,
            "batch": cfg.batch,
            "seed": cfg.seed,
        },
        backend="cuda",
        device_model=device_name,
    )
    out = Path(cfg.outdir)
    prov.write_parquet(
        steps,
        out / STEPS_FILE,
        record,
        tokens="job tokens per step (all data-parallel ranks)",
        loss="mean over ranks",
        t_end_s="seconds since the run's t0 (telemetry clock)",
    )
    prov.write_json(
        {
            "training": {
                **info,
                "world_size": dist.world,
                "device_name": device_name,
                "task": cfg.task,
                "hf_model_type": cfg.hf_model_type,
                "tiny": cfg.tiny,
                "seq_len": cfg.seq_len,
                "batch_per_gpu": cfg.batch,
                "tokens_per_step": cfg.batch * cfg.seq_len * dist.world,
                "precision": cfg.dtype_policy,
                "compile": cfg.compile,
                "grad_checkpointing": cfg.grad_checkpointing,
                "lr": cfg.learning_rate,
                "data": cfg.data_path or "synthetic",
                "loop_start_s": t_loop - t0,
                "steps": int(len(steps)),
                "events": events,
            }
        },
        out / RESULT_FILE,
        record,
    )
