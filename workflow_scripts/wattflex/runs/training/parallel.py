"""Expert parallelism (``ep > 1``) for MoE pretraining, with transformers' ``DistributedConfig``.

transformers (checked against 5.24) lays a model out over two views of the same ranks: the
dense weights (attention, embeddings, norms, routers) FSDP2-sharded over all ``world`` ranks,
and the routed experts over an ``(efsdp, ep)`` mesh: every group of ``ep`` ranks holds all
experts, ``experts / ep`` whole experts per rank, tokens reach them by all-to-all, and the
``efsdp = world / ep`` ranks holding the same experts FSDP-shard them. Each rank keeps its own
batch (data parallel over all ranks). Hence: EP always comes with FSDP here (never DDP), ``ep``
must divide the world size and the expert count, and LoRA is not combined with it (peft wraps
the fused expert weights that the EP plan shards, so the plan no longer matches them).

No rank builds the model whole (training.trainer): the layout is applied to a meta build, which
each rank then allocates and fills, from its own random init or from rank 0's read of the
real weights (training.sharded).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from wattflex.runs.training.train_config import TrainConfig

log = logging.getLogger("wattflex.runs.training")


@dataclass(frozen=True)
class ExpertLayout:
    """The expert-parallel degree a MoE group shards with (1: none) and, when it differs from the
    one asked for, why.
    """

    ep: int  # expert-parallel degree to shard with (1: none)
    note: str | None = None  # why the ep asked for is not used


def expert_layout(cfg: TrainConfig, world: int, experts: int | None) -> ExpertLayout:
    """The expert-parallel degree for ``cfg`` on ``world`` ranks of a model with ``experts``
    routed experts per layer (None: dense). Falls back to 1 (with a note) where there is
    nothing to spread experts over; raises ValueError for layouts that cannot be built."""
    if cfg.ep <= 1:
        return ExpertLayout(1)
    if not experts:
        return ExpertLayout(
            1, f"ep {cfg.ep} ignored: {cfg.hf_model_type or 'the model'} is dense (no experts)"
        )
    if world == 1:
        return ExpertLayout(1, f"ep {cfg.ep} ignored: one process, no other rank to hold experts")
    if world % cfg.ep:
        raise ValueError(
            f"ep {cfg.ep} does not divide the {world} training processes: dense weights are "
            f"FSDP-sharded over all of them and the experts over groups of ep ranks"
        )
    if experts % cfg.ep:
        raise ValueError(
            f"ep {cfg.ep} does not divide the {experts} experts per layer of {cfg.hf_model_type}: "
            f"each expert-parallel rank holds experts / ep whole experts"
        )
    return ExpertLayout(cfg.ep)


def distributed_config(cfg: TrainConfig, world: int, ep: int):
    """FSDP over all ranks with ``ep``-way expert parallelism (and FSDP's bf16 mixed precision
    for ``bf16-mixed``: bf16 compute, fp32 gradient reduction, as the harness's own FSDP path)."""
    from transformers import DistributedConfig

    return DistributedConfig(
        fsdp_size=world, ep_size=ep, fsdp_mixed_precision=cfg.dtype_policy == "bf16-mixed"
    )


def shard(model: Any, dconfig: Any, device: str) -> Any:
    """Lay ``model`` (on the meta device, or whole and identical on every rank) out as
    ``dconfig`` says: the model's ``ep_plan`` on the expert mesh, then FSDP2 with its
    ``fsdp_plan``, on ``device`` (cuda|cpu)."""
    import torch

    # transformers puts its device mesh on the machine's accelerator, whatever the run asked for
    accelerator = torch.accelerator.current_accelerator()
    if (accelerator.type if accelerator else "cpu") != device:
        raise ValueError(
            f"ep > 1 on {device}: transformers lays experts out on this machine's "
            f"{accelerator.type if accelerator else 'cpu'}; on a GPU host hide the GPUs "
            f"(CUDA_VISIBLE_DEVICES='') for a cpu run"
        )
    cls = type(model)
    dconfig, _, mesh = cls.prepare_distribute_model(dconfig)
    return cls.maybe_distribute_model(model, dconfig, mesh)


def ep_in_effect(model: Any) -> int:
    """The expert-parallel degree the model's weights are actually laid out with: the size of
    the ``ep`` mesh dimension its expert weights are sharded over (1 if none)."""
    from torch.distributed.tensor import DTensor

    for p in model.parameters():
        if isinstance(p, DTensor) and "ep" in (p.device_mesh.mesh_dim_names or ()):
            return p.device_mesh["ep"].size()
    return 1
