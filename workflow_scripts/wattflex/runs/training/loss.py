"""The causal-LM loss of a training step, optionally chunked over tokens.

transformers' ``model(input_ids=x, labels=x).loss`` projects every token onto the whole
vocabulary and upcasts the logits to fp32 (``ForCausalLMLoss``): at seq_len x batch x vocab
that tensor, its log-softmax and their gradients dominate a step's memory for large
vocabularies (``wattflex.runs.plan.LOGIT_BYTES``). The chunked loss (the technique of Liger
Kernel's fused linear cross entropy and torchtitan's chunked loss) runs the model to its last
hidden state, then for each chunk of ``chunk_tokens`` tokens computes ``lm_head(chunk).float()``
(tanh soft-capped where the config's ``final_logit_softcapping`` says so, as Gemma's forward does)
and the summed shifted cross entropy under ``torch.utils.checkpoint`` (non-reentrant), so no
chunk's logits are kept for backward: the logits peak is one chunk's. All chunks run inside one
call of ``lm_head`` (its hooks once), so FSDP2 gathers it once a step, not once per chunk. The sum is divided by
the number of target tokens: the same value as ``ForCausalLMLoss``'s mean.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from torch.distributed.fsdp import FSDPModule
from torch.utils.checkpoint import checkpoint

from wattflex.runs.training.parallel import ep_in_effect
from wattflex.runs.training.sharded import hf_model

IGNORE_INDEX = -100  # transformers' ignore_index (labels padded with it when shifted)


def chunked_applies(model: nn.Module, chunk_tokens: int) -> str | None:
    """Why the chunked loss is not used for ``model`` (None: it is). DDP marks each parameter
    ready once per backward, and the chunks reuse lm_head's weight (each recomputed chunk
    accumulates into its gradient); a MoE model's router auxiliary loss is part of
    transformers' loss and not of this one. Expert-parallel layouts (ep > 1) keep transformers'
    loss too: there the chunked loss crashed both gloo ranks (SIGSEGV,
    tests/workflow/torchrun/test_training_ep.py's ep2 run; cause not found yet)."""
    if chunk_tokens <= 0:
        return "cuda.loss_chunk_tokens is 0"
    if isinstance(model, nn.parallel.DistributedDataParallel):
        return "DDP (a reused lm_head is marked ready more than once per backward)"
    if ep_in_effect(model) > 1:
        return "expert parallelism (ep > 1: the chunked loss crashed under it on gloo)"
    if getattr(hf_model(model).config, "output_router_logits", False):
        return "output_router_logits (the router auxiliary loss is transformers')"
    return None


def _chunk_loss_sum(
    project, head: nn.Module, hidden: torch.Tensor, targets: torch.Tensor, softcap: float | None
) -> torch.Tensor:
    logits = project(head, hidden).float()
    if softcap:  # the model's final_logit_softcapping, as its own forward applies it (Gemma)
        logits = torch.tanh(logits / softcap) * softcap
    return F.cross_entropy(
        logits.view(-1, logits.shape[-1]),
        targets.reshape(-1),
        ignore_index=IGNORE_INDEX,
        reduction="sum",
    )


def _loss_sum_over_chunks(
    head: nn.Module,
    hidden: torch.Tensor,
    targets: torch.Tensor,
    chunk_tokens: int,
    softcap: float | None = None,
) -> torch.Tensor:
    """The summed cross entropy, one checkpointed chunk at a time, each projected by the head's
    own forward without its hooks (the call around this one runs them)."""
    project = type(head).forward
    total = hidden.new_zeros((), dtype=torch.float32)
    for start in range(0, hidden.shape[0], chunk_tokens):
        part = slice(start, start + chunk_tokens)
        total = total + checkpoint(
            _chunk_loss_sum,
            project,
            head,
            hidden[part],
            targets[part],
            softcap,
            use_reentrant=False,
        )
    return total


def _in_one_call(module: nn.Module, fn, *args):
    """``fn(*args)`` as the forward of one call of ``module``, so its hooks run once around all
    of it: FSDP2's unshard before (a no-op after the model's own forward, as the head is not
    resharded after forward: training.sharded.apply_fsdp) and, in backward, one reduce-scatter
    once every chunk's gradient is in. A call per chunk all-gathered the head again for each
    chunk's recomputation in backward."""
    own = module.__dict__.get("forward")
    module.forward = fn
    try:
        return module(*args)
    finally:
        if own is None:
            del module.forward
        else:
            module.forward = own


def last_hidden_state(model: nn.Module, input_ids: torch.Tensor) -> torch.Tensor:
    """The decoder's last (normed) hidden state, through the model's own forward, so every
    wrapper's hooks (FSDP2's root unit: norm, rotary) run; ``logits_to_keep`` of no position
    keeps transformers from projecting any token onto the vocabulary."""
    decoder = hf_model(model).get_decoder()
    seen: list[torch.Tensor] = []
    handle = decoder.register_forward_hook(lambda _m, _a, out: seen.append(out.last_hidden_state))
    try:
        model(
            input_ids=input_ids,
            logits_to_keep=torch.empty(0, dtype=torch.long, device=input_ids.device),
        )
    finally:
        handle.remove()
    return seen[-1]


def chunked_causal_lm_loss(
    model: nn.Module, input_ids: torch.Tensor, chunk_tokens: int
) -> torch.Tensor:
    """Mean next-token cross entropy of ``input_ids`` (labels = inputs), ``chunk_tokens``
    tokens of the flattened batch at a time."""
    hidden = last_hidden_state(model, input_ids)
    head = hf_model(model).get_output_embeddings()
    targets = F.pad(input_ids, (0, 1), value=IGNORE_INDEX)[..., 1:]
    hidden, targets = hidden.reshape(-1, hidden.shape[-1]), targets.reshape(-1)
    softcap = getattr(hf_model(model).config, "final_logit_softcapping", None)
    total = _in_one_call(
        head, lambda h, t: _loss_sum_over_chunks(head, h, t, chunk_tokens, softcap), hidden, targets
    )
    if not torch.is_grad_enabled() and isinstance(head, FSDPModule):
        head.reshard()  # no backward to reshard it (evaluation)
    return total / (targets != IGNORE_INDEX).sum()


def causal_lm_loss(
    model: nn.Module, input_ids: torch.Tensor, chunk_tokens: int, chunked: bool | None = None
) -> torch.Tensor:
    """The step's loss: chunked where ``chunked_applies``, else transformers' own. The loop
    decides ``chunked`` once (``chunked_applies`` walks every parameter for the EP check) and
    passes it in; None decides here."""
    if chunked is None:
        chunked = chunked_applies(model, chunk_tokens) is None
    if chunked:
        return chunked_causal_lm_loss(model, input_ids, chunk_tokens)
    return model(input_ids=input_ids, labels=input_ids).loss
