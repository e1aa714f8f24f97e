"""One rank's memory through a training step, phase by phase: RSS, the bytes glibc's malloc has
handed out and holds free (mallinfo2), the peak since the last phase (VmHWM), and how many FSDP2
units are gathered. Run under torchrun by ``benchmarks/step_memory.py --probe`` (the mechanism
behind benchmarks/results/step_memory.md: allocated bytes flat step to step, RSS rising with
malloc's free bytes under glibc's rising mmap threshold).

Usage: torchrun --nproc-per-node 4 benchmarks/step_memory_probe.py CFG.json  (writes probe<rank>.json
to the config's outdir; WATTFLEX_GLIBC_DYNAMIC_MMAP=1 leaves glibc's threshold as it is)
"""

from __future__ import annotations

import ctypes
import json
import os
import sys

import torch
from torch.distributed.fsdp import FSDPModule

from wattflex.runs.training import hostmem, loop, models
from wattflex.runs.training.config import TrainConfig
from wattflex.runs.training.loss import causal_lm_loss, chunked_applies


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


def main() -> None:
    cfg = TrainConfig.from_json(sys.argv[1])
    fixed = hostmem.fixed_mmap_threshold()
    torch.set_num_threads(1)
    dist = loop.init_distributed(cfg)
    models.import_libraries(cfg)
    snaps = [snapshot("before build")]
    model, info = loop.prepare_model(cfg, dist)
    snaps.append(snapshot("after build", model))
    chunked = chunked_applies(model, cfg.loss_chunk_tokens) is None
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-4)
    vocab = int(info["hf_config"]["vocab_size"])
    gen = torch.Generator().manual_seed(dist.rank)
    model.train()
    for step in range(1, (cfg.max_steps or 3) + 1):
        x = torch.randint(0, vocab, (cfg.batch, cfg.seq_len), generator=gen)
        loss = causal_lm_loss(model, x, cfg.loss_chunk_tokens, chunked)
        snaps.append(snapshot(f"step {step} forward", model))
        loss.backward()
        snaps.append(snapshot(f"step {step} backward", model))
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        snaps.append(snapshot(f"step {step} optimizer", model))
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
