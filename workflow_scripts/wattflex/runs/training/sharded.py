"""Sharded construction: no rank ever builds or loads the whole model (except rank 0's read of
real weights, below).

The pattern of torchtitan's trainer and transformers' own distributed loading: build the model
under ``torch.device("meta")`` (shapes, no storage), wrap it (LoRA, checkpointing, compile),
shard it (FSDP2 ``fully_shard`` per decoder layer, the input embedding and the output head
each their own unit as torchtitan does, both in the root where their weights are tied, then
the root), and only then ``to_empty`` on the
training device: each rank allocates its shard alone. Values then come from

- random init: the model's own ``initialize_weights`` (transformers' ``_init_weights`` per
  module, which also recomputes RoPE's non-persistent ``inv_freq``), and peft's
  ``reset_lora_parameters`` for the adapters (lora_B zero). Each rank initialises its own
  shard, so the values differ from a one-process build with the same seed (same
  distributions). On CUDA DTensor's offset-based RNG draws each shard as its slice of the
  whole tensor from the shared seed; on CPU DTensor random ops run on the local shard with
  the process's generator (torch: "only cuda/cuda-like devices"), so ranks are seeded
  ``seed + rank`` there, else every shard would be a copy of the first.
- real weights: rank 0 reads the checkpoint once (whole, in host memory) and
  ``set_model_state_dict(..., broadcast_from_rank0=True, full_state_dict=True)`` sends each
  rank its slice; the other ranks never hold more than their shard. The non-persistent buffers,
  which no state dict carries, are then recomputed by the model's own init (``init_buffers``).
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

log = logging.getLogger("wattflex.runs.training")


def hf_model(model: nn.Module) -> nn.Module:
    """The transformers model inside a peft wrapper (or the model itself)."""
    return model.get_base_model() if hasattr(model, "get_base_model") else model


def tied_embeddings(model: nn.Module) -> bool:
    """Whether the output head's weight is the input embedding's (``tie_word_embeddings``)."""
    base = hf_model(model)
    head = base.get_output_embeddings()
    return head is not None and head.weight is base.get_input_embeddings().weight


def fsdp_units(model: nn.Module, decoder_layers: list[nn.Module]) -> list[nn.Module]:
    """The modules sharded as their own FSDP units, innermost first: every decoder layer, the
    input embedding and the output head. Tied, the two share one weight, which one FSDP group
    must hold: both stay in the root (transformers' FSDP plan keeps such a tied pair gathered
    too); a unit for the embedding with the head in the root fails FSDP2's first forward
    ("shared with a parameter already managed by another FSDP group")."""
    base = hf_model(model)
    if tied_embeddings(model):
        return list(decoder_layers)
    head = base.get_output_embeddings()
    return [*decoder_layers, base.get_input_embeddings(), *([head] if head is not None else [])]


def apply_fsdp(model: nn.Module, decoder_layers: list[nn.Module], mp_policy: Any) -> nn.Module:
    """FSDP2 over the default process group: the units of ``fsdp_units``, then the root
    (norms, rotary embedding and whatever else is left). The output head, the forward's last
    unit, is not resharded after forward (torchtitan's last unit): backward starts with it,
    and the chunked loss (training.loss) uses the forward's gather for all its chunks."""
    from torch.distributed.fsdp import fully_shard

    head = hf_model(model).get_output_embeddings()
    for unit in fsdp_units(model, decoder_layers):
        fully_shard(unit, mp_policy=mp_policy, reshard_after_forward=unit is not head)
    fully_shard(model, mp_policy=mp_policy)
    return model


def on_meta(build: Callable[[], nn.Module]) -> nn.Module:
    """``build()`` under the meta device: every parameter and buffer a shape without storage
    (transformers skips its weight init there)."""
    with torch.device("meta"):
        return build()


@torch.no_grad()
def init_random(model: nn.Module, device: torch.device, seed: int, rank: int) -> None:
    """Allocate the (sharded) meta ``model`` on ``device`` and initialise it as a fresh model."""
    model.to_empty(device=device)
    if device.type != "cuda" and (copies := replicated(model)):
        raise RuntimeError(
            f"random init on {device.type}: {copies[0]} is replicated across ranks, and ranks draw "
            f"with their own seeds there (DTensor keeps replicas equal on CUDA only); every "
            f"parameter must be sharded, or load weights with cuda.model_path"
        )
    torch.manual_seed(seed if device.type == "cuda" else seed + rank)
    hf_model(model).initialize_weights()
    reset_lora(model)


def replicated(model: nn.Module) -> list[str]:
    """Parameters of which several ranks hold the same copy: plain tensors, or DTensors
    replicated along a mesh dimension of more than one rank. FSDP2 and transformers' expert
    layouts leave none (checked for the 2- and 4-rank layouts of the tests)."""
    from torch.distributed.tensor import DTensor, Replicate

    if not torch.distributed.is_initialized() or torch.distributed.get_world_size() == 1:
        return []
    return [
        n
        for n, p in model.named_parameters()
        if not isinstance(p, DTensor)
        or any(
            isinstance(pl, Replicate) and p.device_mesh.size(i) > 1
            for i, pl in enumerate(p.placements)
        )
    ]


def reset_lora(model: nn.Module) -> None:
    """peft's own adapter init (lora_A Kaiming-uniform, lora_B zero): transformers' init above
    treats the adapters' linears as ordinary layers."""
    try:
        from peft.tuners.lora import LoraLayer
    except ImportError:  # peft is needed only for LoRA
        return
    for module in model.modules():
        if isinstance(module, LoraLayer):
            for adapter in module.lora_A:
                module.reset_lora_parameters(adapter, True)


@torch.no_grad()
def init_buffers(model: nn.Module) -> None:
    """Recompute the non-persistent buffers, which no state dict carries and ``to_empty`` leaves
    uninitialised (RoPE's ``inv_freq``, Gemma's ``embed_scale`` in its embedding modules), with the
    model's own ``_init_weights`` of every module that holds one. That module's parameters and
    persistent buffers (loaded) are marked ``_is_hf_initialized`` meanwhile: transformers' init
    functions skip tensors so marked (from_pretrained initialises what a checkpoint lacks the
    same way), so no loaded value is touched."""
    base = hf_model(model)
    for module in base.modules():
        if not module._non_persistent_buffers_set:
            continue
        loaded = [
            *module.parameters(recurse=False),
            *(
                b
                for n, b in module.named_buffers(recurse=False)
                if n not in module._non_persistent_buffers_set
            ),
        ]
        with _marked_initialized(loaded):
            base._init_weights(module)


@contextlib.contextmanager
def _marked_initialized(tensors: list[torch.Tensor]):
    """``tensors`` flagged ``_is_hf_initialized`` inside the block; their own flags restored after."""
    before = [t.__dict__.get("_is_hf_initialized") for t in tensors]
    for t in tensors:
        t._is_hf_initialized = True
    try:
        yield
    finally:
        for t, flag in zip(tensors, before):
            if flag is None:
                del t._is_hf_initialized
            else:
                t._is_hf_initialized = flag


def load_from_rank0(
    model: nn.Module, full_state_dict: dict[str, torch.Tensor] | None, device: torch.device
) -> None:
    """Allocate the sharded meta ``model`` on ``device`` and fill it from rank 0's
    ``full_state_dict`` (None on the other ranks): each rank keeps only its slice."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict

    model.to_empty(device=device)
    set_model_state_dict(
        model,
        full_state_dict or {},
        options=StateDictOptions(full_state_dict=True, broadcast_from_rank0=True),
    )
    init_buffers(model)


def model_class(model: nn.Module) -> str:
    """The transformers class name (FSDP2 renames the classes it wraps ``FSDP<name>``)."""
    return next(
        c.__name__ for c in type(hf_model(model)).__mro__ if not c.__name__.startswith("FSDP")
    )


def model_bytes(model: nn.Module) -> int:
    """Bytes of the whole model's parameters in their stored dtype (global shapes for DTensors)."""
    return int(sum(p.numel() * p.element_size() for p in model.parameters()))
