"""Models for the harness: build from catalog facts (random init), load local weights, wrap
with LoRA, and count the parameters and FLOPs that TFLOPS/MFU are computed from.

MoE families in transformers 5 keep each layer's routed experts as fused 3-D parameters
(``mlp.experts.gate_up_proj`` [E, ...] and ``mlp.experts.down_proj`` [E, ...], plus
``*_bias`` in gpt-oss), not one ``nn.Linear`` per expert, so ``target_modules`` cannot reach
them; LoRA reaches them through peft's ``target_parameters`` (checked against the modeling
files of transformers 5.24 for qwen3_moe, mixtral, gpt_oss and deepseek_v2).
"""

from __future__ import annotations

import logging
from typing import Any

import torch
from torch import nn

from wattflex.architectures import ARCHITECTURES
from wattflex.runs.training.config import TrainConfig
from wattflex.runs.training.sharded import hf_model, tied_embeddings

log = logging.getLogger("wattflex.runs.training")

# Attention projections and dense-MLP linears, by family (targets of LoRA's target_modules).
ATTENTION_MODULES = {
    "deepseek_v2": ["q_proj", "q_a_proj", "q_b_proj", "kv_a_proj_with_mqa", "kv_b_proj", "o_proj"],
}
DEFAULT_ATTENTION = ["q_proj", "k_proj", "v_proj", "o_proj"]
DENSE_MLP_MODULES = ["gate_proj", "up_proj", "down_proj"]
# Fused routed-expert weights (peft target_parameters); biases stay frozen.
EXPERT_PARAMETERS = ["mlp.experts.gate_up_proj", "mlp.experts.down_proj"]
# Peak dense bf16 tensor throughput per GPU (SXM parts), for MFU.

TINY = {"hidden": 64, "layers": 2, "heads": 4, "head_dim": 16, "vocab": 256,
        "intermediate": 128, "expert_intermediate": 32, "experts": 4, "experts_active": 2}


def hf_config(facts: dict[str, Any], *, tiny: bool = False, seq_len: int = 4096, ep: int = 1):
    """A transformers config for the catalog entry ``facts`` (full size, or tiny for tests).

    Tiny keeps the family and the MoE routing shape (experts > active) but shrinks every
    width: hidden 64, 2 layers, vocab 256, 4 experts with 2 active (with ``ep`` > 1: the
    smallest multiple of ``ep`` >= 4, so every expert-parallel rank holds whole experts).
    """
    from transformers import AutoConfig

    mt = str(facts.get("hf_model_type", ""))
    if mt not in ARCHITECTURES:
        raise ValueError(f"hf_model_type {mt!r}: supported families are {', '.join(sorted(ARCHITECTURES))}")
    moe = ARCHITECTURES[mt] == "moe"
    if tiny:
        heads = TINY["heads"]
        tiny_experts = -(-TINY["experts"] // ep) * ep
        ratio = max(1, int(facts.get("heads", heads)) // max(1, int(facts.get("kv_heads", heads))))
        f = {"hidden": TINY["hidden"], "layers": TINY["layers"], "heads": heads,
             "kv_heads": max(1, heads // min(ratio, heads)), "head_dim": TINY["head_dim"],
             "vocab": TINY["vocab"],
             "intermediate": TINY["expert_intermediate"] if moe else TINY["intermediate"],
             "experts": min(int(facts.get("experts") or tiny_experts), tiny_experts),
             "experts_active": min(int(facts.get("experts_active") or TINY["experts_active"]),
                                   TINY["experts_active"])}
    else:
        f = facts
    kw: dict[str, Any] = dict(
        vocab_size=int(f["vocab"]), hidden_size=int(f["hidden"]), num_hidden_layers=int(f["layers"]),
        num_attention_heads=int(f["heads"]), num_key_value_heads=int(f.get("kv_heads") or f["heads"]),
        use_cache=False,
    )
    if "tie_word_embeddings" in facts:      # else the family's default (Gemma ties, the others do not)
        kw["tie_word_embeddings"] = bool(facts["tie_word_embeddings"])
    if f.get("head_dim"):
        kw["head_dim"] = int(f["head_dim"])
    inter = int(f["intermediate"])
    if mt == "qwen3_moe":
        kw.update(moe_intermediate_size=inter, intermediate_size=inter, num_experts=int(f["experts"]),
                  num_experts_per_tok=int(f["experts_active"]), norm_topk_prob=True, mlp_only_layers=[])
    elif mt in ("mixtral", "gpt_oss"):
        kw.update(intermediate_size=inter, num_local_experts=int(f["experts"]),
                  num_experts_per_tok=int(f["experts_active"]))
    elif mt == "deepseek_v2":
        head_dim = int(f.get("head_dim") or 128)
        kw.pop("head_dim", None)
        kw.update(moe_intermediate_size=inter, intermediate_size=inter * 8, n_routed_experts=int(f["experts"]),
                  num_experts_per_tok=int(f["experts_active"]), n_shared_experts=2 if not tiny else 1,
                  first_k_dense_replace=1 if not tiny else 0, q_lora_rank=None,
                  kv_lora_rank=512 if not tiny else 16, qk_nope_head_dim=head_dim,
                  qk_rope_head_dim=head_dim // 2, v_head_dim=head_dim)
    else:
        kw["intermediate_size"] = inter
    cfg = AutoConfig.for_model(mt, **kw)
    if getattr(cfg, "max_position_embeddings", seq_len) < seq_len:
        cfg.max_position_embeddings = seq_len
    return cfg


def model_config(cfg: TrainConfig, ep: int = 1):
    """The transformers config of the model ``build_model`` gives, without building it."""
    if cfg.model_path and not cfg.tiny:
        from transformers import AutoConfig

        return AutoConfig.from_pretrained(cfg.model_path, local_files_only=True)
    return hf_config(cfg.model_facts, tiny=cfg.tiny, seq_len=cfg.seq_len, ep=ep)


def _attention_kwargs(cfg: TrainConfig) -> dict[str, str]:
    impl = cfg.attn_implementation
    if impl == "flex_attention" and cfg.device != "cuda" and cfg.model_facts.get("attention_sinks"):
        # transformers' flex path runs attention sinks on CUDA only (it raises on CPU)
        log.info("flex_attention with sinks needs CUDA; using eager attention on %s", cfg.device)
        impl = "eager"
    return {"attn_implementation": impl} if impl else {}


def quantization_kwargs(hf_cfg: Any) -> dict[str, Any]:
    """What ``from_pretrained`` needs to load a checkpoint for training: MXFP4 checkpoints
    (gpt-oss) are dequantised to bf16 explicitly, as OpenAI's fine-tuning recipe does, so
    training never depends on whether the ``kernels`` package happens to be installed (with
    it transformers keeps the experts MXFP4, which it does not train)."""
    quant = getattr(hf_cfg, "quantization_config", None)
    method = quant.get("quant_method") if isinstance(quant, dict) else getattr(quant, "quant_method", None)
    if str(getattr(method, "value", method)) == "mxfp4":
        from transformers import Mxfp4Config

        return {"quantization_config": Mxfp4Config(dequantize=True)}
    return {}


def load_pretrained(cfg: TrainConfig, dtype: torch.dtype) -> nn.Module:
    """The local checkpoint ``cfg.model_path``, whole in this process, offline."""
    from transformers import AutoModelForCausalLM

    quant = quantization_kwargs(model_config(cfg))
    try:
        return AutoModelForCausalLM.from_pretrained(cfg.model_path, dtype=dtype, local_files_only=True,
                                                    **_attention_kwargs(cfg), **quant)
    except OSError as exc:
        raise FileNotFoundError(f"cannot load model from {cfg.model_path} (offline): {exc}") from exc


def from_config(cfg: TrainConfig, dtype: torch.dtype, ep: int = 1) -> nn.Module:
    """The architecture of ``cfg`` with transformers' random init (no weights on the meta device)."""
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_config(model_config(cfg, ep), dtype=dtype, **_attention_kwargs(cfg))


def import_libraries(cfg: TrainConfig) -> None:
    """Import what building ``cfg``'s model imports (transformers' modeling code of the family,
    peft for LoRA), so memory measured after this and after the build differs by the model."""
    import importlib

    import transformers  # noqa: F401

    mt = cfg.hf_model_type
    try:
        importlib.import_module(f"transformers.models.{mt}.modeling_{mt}")
    except ModuleNotFoundError:     # a family outside the catalogue's: imported by the build
        pass
    if cfg.task == "lora":
        import peft  # noqa: F401


def build_model(cfg: TrainConfig, dtype: torch.dtype, ep: int = 1) -> nn.Module:
    """Random-init (tiny or full-size) or locally stored causal LM, whole in this process, never
    from the network. ``ep``: the expert-parallel degree it will be sharded with (sizes the tiny
    expert count)."""
    if cfg.model_path and not cfg.tiny:
        return load_pretrained(cfg, dtype)
    log.info("building %s %s with random weights", "tiny" if cfg.tiny else "full-size", cfg.hf_model_type)
    return from_config(cfg, dtype, ep)


def lora_targets(model: nn.Module, hf_model_type: str) -> tuple[list[str], list[str]]:
    """(target_modules, target_parameters) present in ``model``: attention + dense MLP
    linears, and the fused expert weights of MoE layers."""
    names = {n.rsplit(".", 1)[-1] for n, m in model.named_modules() if isinstance(m, nn.Linear)}
    modules = [m for m in ATTENTION_MODULES.get(hf_model_type, DEFAULT_ATTENTION) + DENSE_MLP_MODULES
               if m in names]
    params = [p for p in EXPERT_PARAMETERS if any(n.endswith(p) for n, _ in model.named_parameters())]
    return modules, params


def apply_lora(model: nn.Module, cfg: TrainConfig) -> nn.Module:
    """Freeze the base model and add rank-``lora_rank`` adapters (alpha = 2 x rank)."""
    from peft import LoraConfig, get_peft_model

    modules, params = lora_targets(model, cfg.hf_model_type)
    if not modules and not params:
        raise ValueError(f"no LoRA targets found in {type(model).__name__}")
    lc = LoraConfig(r=cfg.lora_rank, lora_alpha=2 * cfg.lora_rank, lora_dropout=0.0,
                    target_modules=modules, target_parameters=params or None, task_type="CAUSAL_LM")
    return get_peft_model(model, lc)


def routing(hf_cfg: Any) -> tuple[int | None, int | None]:
    """(routed experts per layer, experts active per token) of a config; (None, None) if dense."""
    experts = next((getattr(hf_cfg, k) for k in ("num_experts", "num_local_experts", "n_routed_experts")
                    if getattr(hf_cfg, k, None)), None)
    return experts, (getattr(hf_cfg, "num_experts_per_tok", None) if experts else None)


def parameter_counts(model: nn.Module, experts: int | None, experts_active: int | None) -> dict[str, int]:
    """Total, trainable and per-token active matmul parameters (input embedding excluded, but
    a tied one counted once as the output head's matmul; routed experts counted at
    ``experts_active / experts``)."""
    total = trainable = active = 0.0
    share = (experts_active / experts) if experts and experts_active else 1.0
    for name, p in model.named_parameters():        # a tied weight once, under embed_tokens
        n = p.numel()
        total += n
        trainable += n if p.requires_grad else 0
        if "embed_tokens" in name:
            continue
        routed = ".experts." in name and "shared_experts" not in name and p.dim() >= 2 and "lora_" not in name
        active += n * share if routed else n
    if tied_embeddings(model):
        active += hf_model(model).get_output_embeddings().weight.numel()
    return {"params_total": int(total), "params_trainable": int(trainable), "params_active": int(active)}


def flops_per_token(params_active: int, facts: dict[str, Any], hf_cfg: Any, seq_len: int, task: str) -> float:
    """Model FLOPs per trained token (recomputation from checkpointing not counted):
    forward = 2 x active params + causal attention; pretraining = 3 x forward, LoRA = 2 x
    forward (frozen weights get no weight-gradient GEMM)."""
    layers = int(getattr(hf_cfg, "num_hidden_layers", facts.get("layers", 0)))
    heads = int(getattr(hf_cfg, "num_attention_heads", facts.get("heads", 0)))
    head_dim = int(getattr(hf_cfg, "head_dim", None) or getattr(hf_cfg, "v_head_dim", None)
                   or facts.get("head_dim") or hf_cfg.hidden_size // max(heads, 1))
    attn = 2 * 2 * seq_len * heads * head_dim * layers / 2     # QK^T and AV, causal half
    forward = 2 * params_active + attn
    return float(forward * (3 if task == "pt" else 2))
