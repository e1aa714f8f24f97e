"""Bytes a real transformers decoder layer saves for backward, per family and task: the layer
builds, the saved-tensor hooks and the fit that tests/unit/runs/test_activation_factors.py holds
the plan's activation factors (wattflex.runs.plan.ACTIVATION_FACTORS) against, and that the
benchmark ``python benchmarks/activation_bytes.py`` tabulates (benchmarks import tests' helpers,
never the reverse).

For each catalogue model (one per hf_model_type in config/models.yaml) and task (pt; LoRA at
rank 32 on the harness's targets, adapters fp32 as peft's autocast_adapter_dtype leaves them)
a one-layer model of the family's real transformers class is built in bf16 at 1/k and 1/2k of
the catalogue's widths (hidden, head_dim, intermediate, DeepSeek's kv_lora_rank; head and
expert counts kept), with the catalogue's attention (wattflex.runs.plan.attention_of; flex,
which needs CUDA with sinks, measured as eager, its linear part kept). Its forward runs under
``torch.autograd.graph.saved_tensors_hooks`` counting each unique storage saved for backward
inside the layer once, parameters and the inputs shared by all layers (rotary cos/sin, mask)
left out. Three sequence lengths at each width separate the bytes into
s*b*(c1*h + c0) (widths and per-token terms) + c2*a*s^2*b (eager scores) + W (tensors the size
of weights: peft's merged expert weights, saved by grouped_mm); the factor at the catalogue's
hidden h is c1 + c0/h, W is given per routed-expert parameter of the layer. With activation
checkpointing (non-reentrant, as the harness) a layer holds its bf16 input: 2 bytes per
s*b*h, measured as the input's bytes.
"""

from __future__ import annotations

import math
import sys
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "workflow_scripts"))

import torch  # noqa: E402
import yaml  # noqa: E402

from wattflex.runs import plan  # noqa: E402

CATALOG = yaml.safe_load((REPO / "config" / "models.yaml").read_text())["models"]
SEQ_LENS = (32, 64, 128)
LORA_RANK = 32
WIDTH_KEYS = ("hidden", "head_dim", "intermediate")
DEEPSEEK_KV_LORA_RANK = 512  # wattflex.runs.training.models.hf_config's full-size value


def families() -> dict[str, str]:
    """hf_model_type -> the catalogue model measured for it (the first of the family)."""
    out: dict[str, str] = {}
    for name, facts in CATALOG.items():
        out.setdefault(facts["hf_model_type"], name)
    return out


def shrink_factor(facts: dict, max_k: int = 16) -> int:
    """The largest k <= ``max_k`` that leaves, at 1/2k, rotary an even head_dim and hidden and
    intermediate multiples of 8 (grouped_mm wants 16-byte strides)."""
    rope_even = 4 if facts["hf_model_type"] == "deepseek_v2" else 2  # DeepSeek ropes head_dim / 2
    for k in (2**i for i in range(int(math.log2(max_k)), -1, -1)):
        if int(facts["head_dim"]) % (2 * k * rope_even) == 0 and all(
            int(facts[key]) % (16 * k) == 0 for key in ("hidden", "intermediate")
        ):
            return k
    raise ValueError(f"{facts['hf_model_type']}: no width divisor")


def one_layer_model(facts: dict, k: int, task: str, attention: str, seq_len: int):
    """A one-layer causal LM of the family at 1/k of the catalogue's widths, bf16 (LoRA: fp32 adapters)."""
    from transformers import AutoModelForCausalLM

    from wattflex.runs.training.models import hf_config, lora_targets

    small = {**facts, "layers": 1, **{key: int(facts[key]) // k for key in WIDTH_KEYS}}
    cfg = hf_config(small, seq_len=seq_len)
    if facts["hf_model_type"] == "deepseek_v2":
        cfg.first_k_dense_replace, cfg.kv_lora_rank = 0, DEEPSEEK_KV_LORA_RANK // k  # the MoE layer
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(
        cfg,
        dtype=torch.bfloat16,
        attn_implementation="eager" if attention == "flex_attention" else attention,
    )
    if task == "lora":
        from peft import LoraConfig, inject_adapter_in_model

        modules, params = lora_targets(model, facts["hf_model_type"])
        model.requires_grad_(False)
        inject_adapter_in_model(
            LoraConfig(
                r=LORA_RANK,
                lora_alpha=2 * LORA_RANK,
                lora_dropout=0.0,
                target_modules=modules,
                target_parameters=params or None,
            ),
            model,
        )
        for name, p in model.named_parameters():
            if "lora_" in name:
                p.data = p.data.float()
                p.requires_grad_(True)
        # a layer past the first gets an input that needs grad (the adapters below it)
        model.model.embed_tokens.register_forward_hook(
            lambda mod, args, out: out.detach().requires_grad_()
        )
    return model


def saved_bytes(model, seq_len: int, batch: int = 1) -> tuple[int, int]:
    """(bytes of the unique storages the decoder layer saves for backward in one forward, bytes
    of its hidden-state input: what a non-reentrant checkpoint of the layer keeps instead)."""
    layer = model.model.layers[0]
    skip = {p.untyped_storage().data_ptr() for p in model.parameters()}
    seen: dict[int, int] = {}
    counting = [False]
    layer_input = [0]

    def pack(t):
        if counting[0]:
            storage = t.untyped_storage()
            if storage.data_ptr() not in skip:
                seen.setdefault(storage.data_ptr(), storage.nbytes())
        return t

    def start(mod, args, kwargs):
        layer_input[0] = args[0].untyped_storage().nbytes()
        for v in kwargs.values():  # shared by every layer: position embeddings, mask
            for t in v if isinstance(v, tuple) else (v,):
                if isinstance(t, torch.Tensor):
                    skip.add(t.untyped_storage().data_ptr())
        counting[0] = True

    def stop(mod, args, kwargs, out):
        counting[0] = False

    hooks = [
        layer.register_forward_pre_hook(start, with_kwargs=True),
        layer.register_forward_hook(stop, with_kwargs=True),
    ]
    try:
        ids = torch.randint(
            0,
            int(model.config.vocab_size),
            (batch, seq_len),
            generator=torch.Generator().manual_seed(0),
        )
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            model.model(input_ids=ids)
    finally:
        for h in hooks:
            h.remove()
    return sum(seen.values()), layer_input[0]


def routed_expert_params(model) -> int:
    return sum(
        p.numel() for n, p in model.named_parameters() if ".experts." in n and "lora_" not in n
    )


@dataclass(frozen=True)
class Measured:
    family: str
    model: str
    task: str
    attention: str
    factor: float  # bytes per s*b*h at the catalogue's hidden (c1 + c0/h)
    checkpointed: float  # bytes per s*b*h a checkpointed layer keeps (its input)
    score: float  # bytes per a*s^2*b (eager's scores and softmax)
    expert_weight: float  # s-independent bytes per routed-expert parameter of the layer
    small_hidden: int


@dataclass(frozen=True)
class WidthFit:
    """One width's bytes: s*per_token + a*s^2*per_score + weights (b = 1)."""

    hidden: int
    per_token: float
    per_score: float
    weights: float
    expert_params: int
    checkpointed: float  # the layer input's bytes per s*h


def fit_width(facts: dict, k: int, task: str, attention: str) -> WidthFit:
    """At 1/k of the widths, from three sequence lengths."""
    import numpy as np

    model = one_layer_model(facts, k, task, attention, max(SEQ_LENS))
    measured = [saved_bytes(model, s) for s in SEQ_LENS]
    a, h = int(facts["heads"]), int(facts["hidden"]) // k
    per_token, per_score, weights = np.linalg.solve(
        np.array([[s, a * s * s, 1.0] for s in SEQ_LENS], dtype=float),
        [saved for saved, _ in measured],
    )
    if attention != "eager":
        per_score = 0.0  # sdpa/flex keep no s^2 tensor; what remains is rounding
    s, (_, inp) = SEQ_LENS[-1], measured[-1]
    return WidthFit(
        h,
        float(per_token),
        float(per_score),
        float(weights),
        routed_expert_params(model),
        inp / (s * h),
    )


def measure(family: str, task: str, max_k: int = 16) -> Measured:
    """The factors of ``family``'s catalogue model for ``task``, measured at 1/k and 1/2k of its
    widths (k <= ``max_k``: larger is smaller and faster)."""
    name = families()[family]
    facts = CATALOG[name]
    attention = plan.attention_of(facts, task)
    k = shrink_factor(facts, max_k)
    wide, narrow = fit_width(facts, k, task, attention), fit_width(facts, 2 * k, task, attention)
    c1 = (wide.per_token - narrow.per_token) / (
        wide.hidden - narrow.hidden
    )  # per token and hidden unit
    c0 = wide.per_token - c1 * wide.hidden  # per token, width-free
    # weight-sized tensors: a part ~ width^2 (merged expert weights) and one ~ width (rank-r
    # products); at full size the first dominates, so it is the one kept, per expert parameter
    squared = 2 * (wide.weights - 2 * narrow.weights)
    per_param = max(squared, 0.0) / wide.expert_params if wide.expert_params else 0.0
    return Measured(
        family,
        name,
        task,
        attention,
        c1 + c0 / int(facts["hidden"]),
        wide.checkpointed,
        wide.per_score,
        per_param,
        wide.hidden,
    )
