"""One rank's memory through a training step, phase by phase: RSS, the bytes glibc's malloc has
handed out and holds free (mallinfo2), the peak since the last phase (VmHWM), and how many FSDP2
units are gathered. Run under torchrun by ``benchmarks/step_memory.py --probe`` (the mechanism
behind benchmarks/results/step_memory.md: allocated bytes flat step to step, RSS rising with
malloc's free bytes under glibc's rising mmap threshold).

Usage: torchrun --nproc-per-node 4 benchmarks/step_memory_probe.py CFG.json  (writes probe<rank>.json
to the config's outdir; WATTFLEX_GLIBC_DYNAMIC_MMAP=1 leaves glibc's threshold as it is)

   or: torchrun --nproc-per-node 4 benchmarks/step_memory_probe.py --cases CASES.json  (CASES.json:
a list of config paths; one job builds and steps each case in turn, every rank writing its RSS
after the build and the steps' peak to cases<rank>.json beside CASES.json: ``benchmarks/step_memory.py
--families``)
"""

from __future__ import annotations

import ctypes
import gc
import json
import os
import sys
from pathlib import Path

import torch
from torch.distributed.fsdp import FSDPModule

from wattflex.runs.training import hostmem, models, trainer
from wattflex.runs.training.loss import causal_lm_loss, chunked_applies
from wattflex.runs.training.train_config import TrainConfig


class MallInfo2(ctypes.Structure):  # glibc >= 2.33, malloc.h
    _fields_ = [
        (n, ctypes.c_size_t)
        for n in "arena ordblks smblks hblks hblkhd usmblks fsmblks uordblks fordblks keepcost".split()
    ]


LIBC = ctypes.CDLL("libc.so.6")
LIBC.mallinfo2.restype = MallInfo2


def rss() -> int:
    return int(open("/proc/self/statm").read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def snapshot(tag: str, model=None) -> dict:
    m = LIBC.mallinfo2()
    out = {
        "tag": tag,
        "rss": rss(),
        "peak_since_last": hostmem.hwm_bytes(),
        "allocated": m.uordblks + m.hblkhd,
        "mapped": m.hblkhd,
        "arenas": m.arena,
        "arenas_free": m.fordblks,
    }
    if model is not None:
        out["gathered_units"] = sum(
            1
            for mod in model.modules()
            if isinstance(mod, FSDPModule)
            and (g := mod._get_fsdp_state()._fsdp_param_group) is not None
            and g.is_unsharded
        )
    hostmem.reset_peak_rss()
    return out


def train_steps(
    model, info: dict, cfg: TrainConfig, rank: int, after_phase=lambda tag: None
) -> None:
    """``cfg.max_steps`` steps of the harness's (training.trainer.train): its loss, backward, AdamW,
    gradients set to None; ``after_phase(tag)`` after each phase."""
    chunked = chunked_applies(model, cfg.loss_chunk_tokens) is None
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-4)
    vocab = int(info["hf_config"]["vocab_size"])
    gen = torch.Generator().manual_seed(rank)
    model.train()
    for step in range(1, (cfg.max_steps or 3) + 1):
        x = torch.randint(0, vocab, (cfg.batch, cfg.seq_len), generator=gen)
        loss = causal_lm_loss(model, x, cfg.loss_chunk_tokens, chunked)
        after_phase(f"step {step} forward")
        loss.backward()
        after_phase(f"step {step} backward")
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        after_phase(f"step {step} optimizer")


def cases_main(cases_path: str) -> None:
    """Each case of ``cases_path`` in turn: RSS after the harness's sharded build, then VmHWM
    (reset after the build) over its steps; the model and optimizer freed before the next."""
    fixed = hostmem.fixed_mmap_threshold()
    torch.set_num_threads(1)
    paths = json.loads(Path(cases_path).read_text())
    dist = trainer.init_distributed(TrainConfig.from_json(paths[0]))
    out = []
    for path in paths:
        cfg = TrainConfig.from_json(path)
        models.import_libraries(cfg)
        gc.collect()
        LIBC.malloc_trim(0)  # the arenas' free pages back to the kernel: no case reuses another's
        before = rss()
        model, info = trainer.prepare_model(cfg, dist)
        after = rss()
        hostmem.reset_peak_rss()
        train_steps(model, info, cfg, dist.rank)
        peak = hostmem.hwm_bytes()
        keys = ("params_total", "params_trainable", "attn_implementation", "parallel")
        out.append(
            {"config": path, "before_build": before, "after_build": after, "steps": peak}
            | {k: info[k] for k in keys}
        )
        del model
        gc.collect()
        torch.distributed.barrier()
    Path(cases_path).with_name(f"cases{dist.rank}.json").write_text(
        json.dumps({"mmap_threshold_fixed": fixed, "cases": out})
    )
    torch.distributed.destroy_process_group()


def main() -> None:
    if sys.argv[1] == "--cases":
        return cases_main(sys.argv[2])
    cfg = TrainConfig.from_json(sys.argv[1])
    fixed = hostmem.fixed_mmap_threshold()
    torch.set_num_threads(1)
    dist = trainer.init_distributed(cfg)
    models.import_libraries(cfg)
    snaps = [snapshot("before build")]
    model, info = trainer.prepare_model(cfg, dist)
    snaps.append(snapshot("after build", model))
    train_steps(model, info, cfg, dist.rank, lambda tag: snaps.append(snapshot(tag, model)))
    with open(f"{cfg.outdir}/probe{dist.rank}.json", "w") as f:
        json.dump(
            {
                "mmap_threshold_fixed": fixed,
                "params_total": info["params_total"],
                "snapshots": snaps,
            },
            f,
        )
    torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main()
