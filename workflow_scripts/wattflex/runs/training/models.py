"""Models for the harness: build from catalog facts (random init), load local weights, wrap
with LoRA, and count the parameters and FLOPs that TFLOPS/MFU are computed from.

MoE families in transformers 5 keep each layer's routed experts as fused 3-D parameters
(``mlp.experts.gate_up_proj`` [E, ...] and ``mlp.experts.down_proj`` [E, ...], plus
``*_bias`` in gpt-oss), not one ``nn.Linear`` per expert, so ``target_modules`` cannot reach
them; LoRA reaches them through peft's ``target_parameters`` (checked against the modeling
files of transformers 5.24 for qwen3_moe, mixtral, gpt_oss and deepseek_v2; Gemma-4 keeps them
beside the dense MLP, ``experts.gate_up_proj``, in transformers 5.25).

Some configs keep attributes per layer (transformers' heterogeneous configs: Gemma-4's
``head_dim`` is 256 in its sliding-window layers, 512 in its full-attention ones) and raise
``AmbiguousGlobalPerLayerAttributeError`` on a global read: ``per_layer`` reads them.
"""

from __future__ import annotations

import logging
from typing import Any

import torch
from torch import nn

from wattflex.architectures import ARCHITECTURES, MULTIMODAL_TEXT_PREFIX
from wattflex.runs.training.sharded import hf_model, tied_embeddings
from wattflex.runs.training.train_config import TrainConfig
from wattflex.schema import section_defaults

_GROUP, _CUDA = section_defaults("group_defaults"), section_defaults("cuda")

log = logging.getLogger("wattflex.runs.training")

# LoRA's target_modules come from the model itself: the nn.Linear children of its attention
# and dense-MLP modules, as transformers names those classes in every family's modeling file
# (``<Family>Attention``: LlamaAttention, Phi3Attention with its fused qkv_proj,
# DeepseekV3Attention with its MLA projections, Gemma4TextAttention; ``<Family>MLP``: LlamaMLP,
# Phi3MLP with its fused gate_up_proj, DeepseekV3MLP of the dense layers and shared experts).
# A MoE block's router is neither. A family without an attention class of nn.Linear projections
# (GPT-2's Conv1D c_attn) is refused rather than given whatever matches.
ATTENTION_CLASS_SUFFIX, MLP_CLASS_SUFFIX = "Attention", "MLP"
# Fused routed-expert weights (peft target_parameters); biases stay frozen.
EXPERT_PARAMETERS = ["mlp.experts.gate_up_proj", "mlp.experts.down_proj"]
EXPERT_PARAMETERS_BY_FAMILY = {"gemma4_text": ["experts.gate_up_proj", "experts.down_proj"]}
# Peak dense bf16 tensor throughput per GPU (SXM parts), for MFU.

TINY = {
    "hidden": 64,
    "layers": 2,
    "heads": 4,
    "head_dim": 16,
    "vocab": 256,
    "intermediate": 128,
    "expert_intermediate": 32,
    "experts": 4,
    "experts_active": 2,
    "sliding_window": 16,
}


def per_layer(hf_cfg: Any, key: str, default: Any = None) -> list[Any]:
    """``key`` of every decoder layer: its layer's own value where the config keeps it per layer
    (``per_layer_config``, transformers 5.24+), else the global value for each layer."""
    layers = int(hf_cfg.num_hidden_layers)
    view = getattr(hf_cfg, "per_layer_config", None)
    if view is None:
        return [getattr(hf_cfg, key, default)] * layers
    return [getattr(view[i], key, default) for i in range(layers)]


def per_layer_record(hf_cfg: Any, keys: tuple[str, ...]) -> dict[str, Any]:
    """The config's ``keys`` for run.json: a per-layer attribute as its list of layer values."""
    varying = getattr(hf_cfg, "per_layer_attributes", None) or set()
    out = {k: v for k, v in hf_cfg.to_dict().items() if k in keys and k not in varying}
    out.update({k: per_layer(hf_cfg, k) for k in sorted(varying) if k in keys})
    return out


def _gemma4_kwargs(f: dict[str, Any], facts: dict[str, Any], tiny: bool) -> dict[str, Any]:
    """Gemma-4's own geometry (transformers' Gemma4TextConfig): sliding-window layers with
    ``head_dim`` and ``kv_heads``, every ``full_attention_every``-th layer full attention with
    ``global_head_dim`` and ``global_kv_heads`` (keys shared with values: ``attention_k_eq_v``),
    a dense MLP of ``dense_intermediate`` beside the routed experts in every layer, tanh
    soft-capped logits. Tiny: the same kinds of layers (2: one sliding, one full), widths shrunk
    by the catalogue's ratios."""
    layers = int(f["layers"])
    every = int(facts.get("full_attention_every", 6))
    layer_types = (
        ["sliding_attention", "full_attention"]
        if tiny
        else [
            "full_attention" if (i + 1) % every == 0 else "sliding_attention" for i in range(layers)
        ]
    )
    layer_types[-1] = "full_attention"  # transformers forces the last layer to full attention
    head_dim = int(f["head_dim"])
    global_ratio = int(facts.get("global_head_dim", head_dim)) // int(
        facts.get("head_dim", head_dim)
    )
    kv = int(f.get("kv_heads") or f["heads"])
    kv_ratio = max(
        1, int(facts.get("kv_heads", kv)) // max(1, int(facts.get("global_kv_heads", kv)))
    )
    dense = int(facts.get("dense_intermediate", f["intermediate"]))
    return dict(
        intermediate_size=TINY["intermediate"] if tiny else dense,
        moe_intermediate_size=int(f["intermediate"]),
        enable_moe_block=True,
        num_experts=int(f["experts"]),
        top_k_experts=int(f["experts_active"]),
        layer_types=layer_types,
        global_head_dim=head_dim * global_ratio,
        num_global_key_value_heads=max(1, kv // kv_ratio),
        attention_k_eq_v=bool(facts.get("attention_k_eq_v", False)),
        sliding_window=TINY["sliding_window"] if tiny else int(facts.get("sliding_window", 1024)),
        final_logit_softcapping=facts.get("final_logit_softcapping"),
        hidden_size_per_layer_input=0,  # no per-layer input embeddings in the 26B-A4B
        **(
            {}
            if tiny or "max_position" not in facts
            else {"max_position_embeddings": int(facts["max_position"])}
        ),
    )


def hf_config(
    facts: dict[str, Any],
    *,
    tiny: bool = _CUDA["tiny"],
    seq_len: int = _GROUP["seq_len"],
    ep: int = _GROUP["ep"],
):
    """A transformers config for the catalog entry ``facts`` (full size, or tiny for tests).

    Tiny keeps the family and the MoE routing shape (experts > active) but shrinks every
    width: hidden 64, 2 layers, vocab 256, 4 experts with 2 active (with ``ep`` > 1: the
    smallest multiple of ``ep`` >= 4, so every expert-parallel rank holds whole experts).
    """
    from transformers import AutoConfig

    mt = str(facts.get("hf_model_type", ""))
    if mt not in ARCHITECTURES:
        raise ValueError(
            f"hf_model_type {mt!r}: supported families are {', '.join(sorted(ARCHITECTURES))}"
        )
    moe = ARCHITECTURES[mt] == "moe"
    if tiny:
        heads = TINY["heads"]
        tiny_experts = -(-TINY["experts"] // ep) * ep
        ratio = max(1, int(facts.get("heads", heads)) // max(1, int(facts.get("kv_heads", heads))))
        f = {
            "hidden": TINY["hidden"],
            "layers": TINY["layers"],
            "heads": heads,
            "kv_heads": max(1, heads // min(ratio, heads)),
            "head_dim": TINY["head_dim"],
            "vocab": TINY["vocab"],
            "intermediate": TINY["expert_intermediate"] if moe else TINY["intermediate"],
            "experts": min(int(facts.get("experts") or tiny_experts), tiny_experts),
            "experts_active": min(
                int(facts.get("experts_active") or TINY["experts_active"]), TINY["experts_active"]
            ),
        }
    else:
        f = facts
    kw: dict[str, Any] = dict(
        vocab_size=int(f["vocab"]),
        hidden_size=int(f["hidden"]),
        num_hidden_layers=int(f["layers"]),
        num_attention_heads=int(f["heads"]),
        num_key_value_heads=int(f.get("kv_heads") or f["heads"]),
        use_cache=False,
    )
    if "tie_word_embeddings" in facts:  # else the family's default (Gemma ties, the others do not)
        kw["tie_word_embeddings"] = bool(facts["tie_word_embeddings"])
    if f.get("head_dim"):
        kw["head_dim"] = int(f["head_dim"])
    inter = int(f["intermediate"])
    if mt == "qwen3_moe":
        kw.update(
            moe_intermediate_size=inter,
            intermediate_size=inter,
            num_experts=int(f["experts"]),
            num_experts_per_tok=int(f["experts_active"]),
            norm_topk_prob=True,
            mlp_only_layers=[],
        )
    elif mt in ("mixtral", "gpt_oss"):
        kw.update(
            intermediate_size=inter,
            num_local_experts=int(f["experts"]),
            num_experts_per_tok=int(f["experts_active"]),
        )
    elif mt == "gemma4_text":
        kw.update(_gemma4_kwargs(f, facts, tiny))
    elif mt == "deepseek_v2":
        head_dim = int(f.get("head_dim") or 128)
        kw.pop("head_dim", None)
        # the first layer's dense MLP: the catalogue's published width (DeepSeek-V2-Lite's
        # config.json: 10944, not 8 x the expert's 1408 = 11264); 8 x the expert's without one
        dense = inter * 8 if tiny else int(facts.get("dense_layer_intermediate", inter * 8))
        kw.update(
            moe_intermediate_size=inter,
            intermediate_size=dense,
            n_routed_experts=int(f["experts"]),
            num_experts_per_tok=int(f["experts_active"]),
            n_shared_experts=2 if not tiny else 1,
            first_k_dense_replace=1 if not tiny else 0,
            q_lora_rank=None,
            kv_lora_rank=512 if not tiny else 16,
            qk_nope_head_dim=head_dim,
            qk_rope_head_dim=head_dim // 2,
            v_head_dim=head_dim,
        )
    else:
        kw["intermediate_size"] = inter
    cfg = AutoConfig.for_model(mt, **kw)
    if getattr(cfg, "max_position_embeddings", seq_len) < seq_len:
        cfg.max_position_embeddings = seq_len
    return cfg


def checkpoint_config(cfg: TrainConfig):
    """The config.json of the checkpoint ``cfg.model_path`` as transformers reads it (offline)."""
    from transformers import AutoConfig

    return AutoConfig.from_pretrained(cfg.model_path, local_files_only=True)


def text_decoder_config(hf_cfg: Any):
    """The config of the causal LM the harness trains from a checkpoint's config: the config
    itself, or a multimodal checkpoint's text decoder (``text_config``, architectures'
    ``MULTIMODAL_TEXT_PREFIX``; its vision and audio towers are not built: the measured workloads
    are text-only)."""
    if hf_cfg.model_type in MULTIMODAL_TEXT_PREFIX:
        return hf_cfg.get_text_config(decoder=True)
    return hf_cfg


def model_config(cfg: TrainConfig, ep: int = _GROUP["ep"]):
    """The transformers config of the model ``build_model`` gives, without building it."""
    if cfg.model_path and not cfg.tiny:
        return text_decoder_config(checkpoint_config(cfg))
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
    method = (
        quant.get("quant_method")
        if isinstance(quant, dict)
        else getattr(quant, "quant_method", None)
    )
    if str(getattr(method, "value", method)) == "mxfp4":
        from transformers import Mxfp4Config

        return {"quantization_config": Mxfp4Config(dequantize=True)}
    return {}


def load_pretrained(cfg: TrainConfig, dtype: torch.dtype) -> nn.Module:
    """The local checkpoint ``cfg.model_path``, whole in this process, offline: the causal LM of
    ``model_config`` (a multimodal checkpoint's text decoder alone, its weights renamed from
    where the multimodal model keeps them; the other towers' weights are not loaded). Every
    weight of the model must come from the checkpoint: transformers initialises missing ones at
    random with a log line only, which would train (and measure) a different model."""
    from transformers import AutoModelForCausalLM

    full = checkpoint_config(cfg)
    text = text_decoder_config(full)
    kw: dict[str, Any] = {}
    if text is not full:
        prefix = MULTIMODAL_TEXT_PREFIX[full.model_type]
        kw = {"config": text, "key_mapping": {"^" + prefix.replace(".", r"\."): "model."}}
    try:
        model, loading = AutoModelForCausalLM.from_pretrained(
            cfg.model_path,
            dtype=dtype,
            local_files_only=True,
            output_loading_info=True,
            **_attention_kwargs(cfg),
            **quantization_kwargs(full),
            **kw,
        )
    except OSError as exc:
        raise FileNotFoundError(
            f"cannot load model from {cfg.model_path} (offline): {exc}"
        ) from exc
    missing = sorted(
        {
            *loading.get("missing_keys", ()),
            *(k[0] if isinstance(k, tuple) else k for k in loading.get("mismatched_keys", ())),
        }
    )
    if missing:
        raise ValueError(
            f"cuda.model_path {cfg.model_path}: the checkpoint has no (or a differently shaped) "
            f"{', '.join(missing[:5])}{f' and {len(missing) - 5} more' if len(missing) > 5 else ''} "
            f"for {type(model).__name__} (model_type {full.model_type!r}); transformers would "
            f"initialise them at random"
        )
    return model


def from_config(cfg: TrainConfig, dtype: torch.dtype, ep: int = _GROUP["ep"]) -> nn.Module:
    """The architecture of ``cfg`` with transformers' random init (no weights on the meta device)."""
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_config(
        model_config(cfg, ep), dtype=dtype, **_attention_kwargs(cfg)
    )


def import_libraries(cfg: TrainConfig) -> None:
    """Import what building ``cfg``'s model imports (transformers' modeling code of the family,
    peft for LoRA), so memory measured after this and after the build differs by the model."""
    import transformers
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    # the family's causal-LM class, wherever transformers keeps it (gemma4_text's is in
    # models/gemma4/modeling_gemma4, not models/gemma4_text/: a path built from the model_type
    # missed it, and its import counted as the model's memory)
    name = MODEL_FOR_CAUSAL_LM_MAPPING_NAMES.get(cfg.hf_model_type)
    if name:  # a family outside the catalogue's: imported by the build
        getattr(transformers, name)
    if cfg.task == "lora":
        import peft  # noqa: F401


def build_model(cfg: TrainConfig, dtype: torch.dtype, ep: int = _GROUP["ep"]) -> nn.Module:
    """Random-init (tiny or full-size) or locally stored causal LM, whole in this process, never
    from the network. ``ep``: the expert-parallel degree it will be sharded with (sizes the tiny
    expert count)."""
    if cfg.model_path and not cfg.tiny:
        return load_pretrained(cfg, dtype)
    log.info(
        "building %s %s with random weights", "tiny" if cfg.tiny else "full-size", cfg.hf_model_type
    )
    return from_config(cfg, dtype, ep)


def lora_targets(model: nn.Module, hf_model_type: str) -> tuple[list[str], list[str]]:
    """(target_modules, target_parameters) of ``model``: the names of the nn.Linear layers its
    attention modules hold (every projection, fused or MLA), then those of its dense MLPs, in
    the model's order; and the fused expert weights of MoE layers. Raises ValueError when no
    attention projection is found: LoRA would train other adapters than the family's."""
    attention: dict[str, None] = {}
    mlp: dict[str, None] = {}
    for _, parent in model.named_modules():
        kind = type(parent).__name__
        if kind.endswith(ATTENTION_CLASS_SUFFIX):
            into = attention
        elif kind.endswith(MLP_CLASS_SUFFIX):
            into = mlp
        else:
            continue
        for name, child in parent.named_children():
            if isinstance(child, nn.Linear):
                into[name] = None
    if not attention:
        raise ValueError(
            f"LoRA on {hf_model_type or type(model).__name__} ({type(model).__name__}): no "
            f"attention projection found (no nn.Linear in a *{ATTENTION_CLASS_SUFFIX} module); "
            f"refused rather than adapting other layers than the family's"
        )
    experts = EXPERT_PARAMETERS_BY_FAMILY.get(hf_model_type, EXPERT_PARAMETERS)
    params = [p for p in experts if any(n.endswith(p) for n, _ in model.named_parameters())]
    return [*attention, *(m for m in mlp if m not in attention)], params


def lora_record(model: nn.Module) -> dict[str, Any] | None:
    """The adapters a peft-wrapped ``model`` trains, for run.json: target modules and
    parameters as peft holds them, and the rank; None without LoRA."""
    peft_config = getattr(model, "peft_config", None)
    if not peft_config:
        return None
    lc = next(iter(peft_config.values()))
    return {
        "target_modules": sorted(lc.target_modules or ()),
        "target_parameters": sorted(lc.target_parameters or ()),
        "rank": lc.r,
    }


def apply_lora(model: nn.Module, cfg: TrainConfig) -> nn.Module:
    """Freeze the base model and add rank-``lora_rank`` adapters (alpha = 2 x rank)."""
    from peft import LoraConfig, get_peft_model

    modules, params = lora_targets(model, cfg.hf_model_type or model.config.model_type)
    lc = LoraConfig(
        r=cfg.lora_rank,
        lora_alpha=2 * cfg.lora_rank,
        lora_dropout=0.0,
        target_modules=modules,
        target_parameters=params or None,
        task_type="CAUSAL_LM",
    )
    return get_peft_model(model, lc)


def routing(hf_cfg: Any) -> tuple[int | None, int | None]:
    """(routed experts per layer, experts active per token) of a config; (None, None) if dense."""
    experts = next(
        (
            getattr(hf_cfg, k)
            for k in ("num_experts", "num_local_experts", "n_routed_experts")
            if getattr(hf_cfg, k, None)
        ),
        None,
    )
    active = next(
        (
            getattr(hf_cfg, k)
            for k in ("num_experts_per_tok", "top_k_experts")
            if getattr(hf_cfg, k, None)
        ),
        None,
    )
    return experts, (active if experts else None)


def parameter_counts(
    model: nn.Module, experts: int | None, experts_active: int | None
) -> dict[str, int]:
    """Total, trainable and per-token active matmul parameters (input embedding excluded, but
    a tied one counted once as the output head's matmul; routed experts counted at
    ``experts_active / experts``)."""
    total = trainable = active = 0.0
    share = (experts_active / experts) if experts and experts_active else 1.0
    for name, p in model.named_parameters():  # a tied weight once, under embed_tokens
        n = p.numel()
        total += n
        trainable += n if p.requires_grad else 0
        if "embed_tokens" in name:
            continue
        routed = (
            ".experts." in name
            and "shared_experts" not in name
            and p.dim() >= 2
            and "lora_" not in name
        )
        active += n * share if routed else n
    if tied_embeddings(model):
        active += hf_model(model).get_output_embeddings().weight.numel()
    return {
        "params_total": int(total),
        "params_trainable": int(trainable),
        "params_active": int(active),
    }


def flops_per_token(
    params_active: int, facts: dict[str, Any], hf_cfg: Any, seq_len: int, task: str
) -> float:
    """Model FLOPs per trained token (recomputation from checkpointing not counted):
    forward = 2 x active params + causal attention (each layer at its own head width; sliding
    windows counted as full causal, as MFU conventions do); pretraining = 3 x forward, LoRA = 2 x
    forward (frozen weights get no weight-gradient GEMM)."""
    heads = per_layer(hf_cfg, "num_attention_heads", facts.get("heads", 0))
    widths = [
        int(h) * int(d or v or facts.get("head_dim") or hf_cfg.hidden_size // max(int(h), 1))
        for h, d, v in zip(heads, per_layer(hf_cfg, "head_dim"), per_layer(hf_cfg, "v_head_dim"))
    ]
    attn = 2 * 2 * seq_len * sum(widths) / 2  # QK^T and AV, causal half
    forward = 2 * params_active + attn
    return float(forward * (3 if task == "pt" else 2))
