"""Every catalogue family through the harness's sharded path, from a real-format checkpoint and
from random init (tests/workflow/torchrun/test_family_checkpoints.py and
benchmarks/family_checkpoints.py run these cases in one 2-rank gloo job).

For each ``hf_model_type`` of ``wattflex.architectures.ARCHITECTURES``: a tiny config of the
real transformers class (``models.hf_config(..., tiny=True)``) with the published config's
rotary settings and its embedding tying, saved by ``save_pretrained`` and loaded through
``trainer.prepare_model`` (FSDP2 on 2 ranks), compared with the same checkpoint loaded whole in
one process; the same family built at random by the harness, its buffers compared with a
fresh unsharded build's; LoRA from the checkpoint for the MoE families and a tied dense one; and
a multimodal Gemma-4 checkpoint (Gemma4ForConditionalGeneration), of which the harness trains the
text decoder.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import yaml

from wattflex.architectures import ARCHITECTURES

REPO = Path(__file__).resolve().parents[1]
CATALOG = yaml.safe_load((REPO / "config" / "models.yaml").read_text())["models"]


@dataclass(frozen=True)
class Family:
    """One row: ``facts`` a catalogue entry (or the published config's head counts for the
    families the catalogue has no model of), ``rope`` the published config's rotary settings
    (transformers 5 ``rope_parameters``; None: the config class's default), ``tied`` whether
    lm_head is the input embedding, ``extra`` other published config values set on the tiny
    config (max_position_embeddings beside a rope scaling that names an original length)."""

    name: str
    facts: dict[str, Any]
    tied: bool
    rope: dict[str, Any] | None = None
    source: str = ""
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def hf_model_type(self) -> str:
        return str(self.facts["hf_model_type"])


# Published configs (config.json on each model's Hugging Face page; rope_scaling as transformers 5's
# rope_parameters). Tied: the small Llama-3.2, Qwen2.5 and Qwen3 models tie their embeddings, the
# catalogue's large ones do not; Gemma-4 ties.
FAMILIES = [
    Family(
        "Llama-3.1-70B",
        CATALOG["Llama-3.1-70B"],
        False,
        {
            "rope_type": "llama3",
            "rope_theta": 500000.0,
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 8192,
        },
        "meta-llama/Llama-3.1-70B config.json",
        {"max_position_embeddings": 131072},
    ),
    Family(
        "Llama-3.2-1B",
        {**CATALOG["Llama-3.1-70B"], "heads": 32, "kv_heads": 8},
        True,
        {
            "rope_type": "llama3",
            "rope_theta": 500000.0,
            "factor": 32.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 8192,
        },
        "meta-llama/Llama-3.2-1B config.json (tie_word_embeddings true)",
        {"max_position_embeddings": 131072},
    ),
    Family(
        "Mistral-Small-24B-Base-2501",
        CATALOG["Mistral-Small-24B-Base-2501"],
        False,
        {"rope_type": "default", "rope_theta": 100000000.0},
        "mistralai/Mistral-Small-24B-Base-2501 config.json",
    ),
    Family(
        "Qwen2.5-7B",
        {"hf_model_type": "qwen2", "heads": 28, "kv_heads": 4},
        False,
        {"rope_type": "default", "rope_theta": 1000000.0},
        "Qwen/Qwen2.5-7B config.json",
    ),
    Family(
        "Qwen2.5-0.5B",
        {"hf_model_type": "qwen2", "heads": 14, "kv_heads": 2},
        True,
        {"rope_type": "default", "rope_theta": 1000000.0},
        "Qwen/Qwen2.5-0.5B config.json (tie_word_embeddings true)",
    ),
    Family(
        "Qwen3-32B",
        CATALOG["Qwen3-32B"],
        False,
        {"rope_type": "default", "rope_theta": 1000000.0},
        "Qwen/Qwen3-32B config.json",
    ),
    Family(
        "Qwen3-0.6B",
        {**CATALOG["Qwen3-32B"], "heads": 16, "kv_heads": 8},
        True,
        {"rope_type": "default", "rope_theta": 1000000.0},
        "Qwen/Qwen3-0.6B config.json (tie_word_embeddings true)",
    ),
    Family(
        "Qwen3-30B-A3B",
        CATALOG["Qwen3-30B-A3B"],
        False,
        {"rope_type": "default", "rope_theta": 1000000.0},
        "Qwen/Qwen3-30B-A3B config.json",
    ),
    Family(
        "Mixtral-8x7B-v0.1",
        {"hf_model_type": "mixtral", "heads": 32, "kv_heads": 8, "experts": 8, "experts_active": 2},
        False,
        {"rope_type": "default", "rope_theta": 1000000.0},
        "mistralai/Mixtral-8x7B-v0.1 config.json",
    ),
    Family(
        "gpt-oss-20b",
        CATALOG["gpt-oss-20b"],
        False,
        {
            "rope_type": "yarn",
            "rope_theta": 150000.0,
            "factor": 32.0,
            "beta_fast": 32.0,
            "beta_slow": 1.0,
            "truncate": False,
            "original_max_position_embeddings": 4096,
        },
        "openai/gpt-oss-20b config.json",
        {"max_position_embeddings": 131072},
    ),
    Family(
        "DeepSeek-V2-Lite",
        CATALOG["DeepSeek-V2-Lite"],
        False,
        {
            "rope_type": "yarn",
            "rope_theta": 10000.0,
            "factor": 40.0,
            "beta_fast": 32.0,
            "beta_slow": 1.0,
            "mscale": 0.707,
            "mscale_all_dim": 0.707,
            "original_max_position_embeddings": 4096,
        },
        "deepseek-ai/DeepSeek-V2-Lite config.json",
        {"max_position_embeddings": 163840},
    ),
    Family(
        "Gemma-4-26B-A4B",
        CATALOG["Gemma-4-26B-A4B"],
        True,
        None,
        "google/gemma-4-26B-A4B config.json text_config (Gemma4TextConfig's own rope defaults)",
    ),
]
assert {f.hf_model_type for f in FAMILIES} == set(ARCHITECTURES), "every catalogue family has a row"


def tiny_hf_config(family: Family):
    """The tiny config of ``family``'s real transformers class, as a checkpoint of it would carry."""
    from wattflex.runs.training import models

    cfg = models.hf_config(family.facts, tiny=True)
    cfg.tie_word_embeddings = family.tied
    if family.rope is not None:
        cfg.rope_parameters = dict(family.rope)
    for k, v in family.extra.items():
        setattr(cfg, k, v)
    return cfg


GEMMA4 = FAMILIES[-1]


def save_multimodal_gemma4(path: Path, seed: int = 3) -> None:
    """``save_pretrained`` of a tiny Gemma4ForConditionalGeneration, the class and layout of
    google/gemma-4-26B-A4B's published checkpoint (config model_type "gemma4": the text decoder's
    config under text_config, its weights under ``model.language_model.``, a vision tower and an
    audio tower beside it; transformers 5.25), the text decoder the catalogue's tiny Gemma-4."""
    from transformers import (
        Gemma4AudioConfig,
        Gemma4Config,
        Gemma4ForConditionalGeneration,
        Gemma4VisionConfig,
    )

    vision = Gemma4VisionConfig(
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=2,
        head_dim=16,
        position_embedding_size=64,
    )
    audio = Gemma4AudioConfig(
        hidden_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        output_proj_dims=32,
        subsampling_conv_channels=[8, 4],
    )
    cfg = Gemma4Config(
        text_config=tiny_hf_config(GEMMA4).to_dict(),
        vision_config=vision.to_dict(),
        audio_config=audio.to_dict(),
    )
    torch.manual_seed(seed)
    Gemma4ForConditionalGeneration(cfg).save_pretrained(path)


def save_checkpoint(family: Family, path: Path, seed: int = 3) -> None:
    """``save_pretrained`` of a tiny ``family`` model with transformers' random init (seed 3: not
    what the harness's seed would draw)."""
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(tiny_hf_config(family))
    assert (
        model.get_output_embeddings().weight is model.get_input_embeddings().weight
    ) == family.tied
    model.save_pretrained(path)


# Per case and rank: the harness's model (``model``, PROBE_PREAMBLE of training_jobs) against the
# whole unsharded one (``ref``: the checkpoint loaded in one process, or a fresh random build).
# Random init draws other values per rank, so the random-init case copies the gathered weights
# into ``ref`` before comparing logits and gradients (its buffers are compared before that).
FAMILY_PROBE = """
    from torch.distributed.tensor import DTensor
    from wattflex.runs.training.loss import causal_lm_loss, chunked_applies
    full = lambda t: t.full_tensor() if isinstance(t, DTensor) else t
    base = sharded.hf_model(model)
    ref_buffers = dict(ref.named_buffers())
    buffers = {n: bool(full(b).shape == ref_buffers[n].shape and torch.equal(full(b), ref_buffers[n]))
               if n in ref_buffers else False for n, b in model.named_buffers()}
    buffers.update({n: False for n in ref_buffers if n not in buffers})
    params_equal = {n: bool(torch.equal(full(p), ref_params[n])) for n, p in model.named_parameters()}
    # the sharded parameters, as the loop takes them (a forward swaps the unsharded ones in)
    trainable = {n: p for n, p in model.named_parameters() if p.requires_grad}
    before = {n: full(p).detach().clone() for n, p in trainable.items()}
    optimizer = torch.optim.AdamW(list(trainable.values()), lr=1e-2, weight_decay=0.0)
    # random init and LoRA's lora_A: other draws than the one-process build; the comparisons below are
    # of the computation, on the same (gathered) weights
    ref.load_state_dict({n: full(t) for n, t in model.state_dict().items()})
    torch.manual_seed(7)
    x = torch.randint(0, base.config.vocab_size, (cfg.batch, cfg.seq_len))
    with torch.no_grad():
        logits_diff = float((model(input_ids=x).logits - ref(input_ids=x).logits).abs().max())
    chunked = chunked_applies(model, cfg.loss_chunk_tokens) is None
    loss = causal_lm_loss(model, x, cfg.loss_chunk_tokens, chunked)    # both ranks on the same tokens:
    loss.backward()                                                    # the mean gradient is the
    ref_loss = ref(input_ids=x, labels=x).loss                         # unsharded model's
    ref_loss.backward()
    ref_grads = {n: p.grad for n, p in ref.named_parameters()}
    grad_diff = max(float((full(p.grad) - ref_grads[n]).abs().max()) for n, p in trainable.items()
                    if p.grad is not None and ref_grads.get(n) is not None)
    no_grad = sorted(n for n, p in trainable.items() if p.grad is None)
    ref_no_grad = sorted(n for n, p in ref.named_parameters() if p.requires_grad and p.grad is None)
    zero_grad = sorted(n for n, p in trainable.items() if ref_grads.get(n) is None or not ref_grads[n].any())
    optimizer.step()
    unchanged = sorted(n for n, p in trainable.items() if torch.equal(full(p).detach(), before[n]))
    out = {"model_class": info["model_class"], "sharded_build": info["sharded_build"],
           "tied": base.get_output_embeddings().weight is base.get_input_embeddings().weight,
           "ref_tied": ref.get_output_embeddings().weight is ref.get_input_embeddings().weight,
           "buffers": buffers, "params_equal": params_equal, "logits_max_diff": logits_diff,
           "loss": float(loss), "ref_loss": float(ref_loss), "grad_max_diff": grad_diff, "chunked": chunked,
           "params": len(trainable), "unchanged": unchanged, "zero_grad": zero_grad, "no_grad": no_grad, "ref_no_grad": ref_no_grad}
    open(f"{cfg.outdir}/probe{dist.rank}.json", "w").write(json.dumps(out))
    torch.distributed.destroy_process_group()
"""
SOURCES = ("model_path", "random_init")
# LoRA (peft, the fused experts through target_parameters) from the checkpoint: the MoE families and
# a tied dense one
LORA = (
    "Qwen3-0.6B",
    "Qwen3-30B-A3B",
    "Mixtral-8x7B-v0.1",
    "gpt-oss-20b",
    "DeepSeek-V2-Lite",
    "Gemma-4-26B-A4B",
)

# A multimodal Gemma-4 checkpoint: the harness's text decoder against the whole
# Gemma4ForConditionalGeneration loaded by transformers in one process (its text-only logits, its
# language model's weights under their names there).
MULTIMODAL_PROBE = """
    from transformers import Gemma4ForConditionalGeneration
    from torch.distributed.tensor import DTensor
    from wattflex.runs.training.loss import causal_lm_loss
    full = lambda t: t.full_tensor() if isinstance(t, DTensor) else t
    whole = Gemma4ForConditionalGeneration.from_pretrained(cfg.model_path, dtype=torch.float32)
    whole_params = dict(whole.named_parameters())
    rename = lambda n: n.replace("model.", "model.language_model.", 1) if n.startswith("model.") else n
    params_equal = {n: rename(n) in whole_params and bool(torch.equal(full(p), whole_params[rename(n)]))
                    for n, p in model.named_parameters()}
    whole_buffers = dict(whole.named_buffers())
    buffers = {n: rename(n) in whole_buffers and bool(torch.equal(full(b), whole_buffers[rename(n)]))
               for n, b in model.named_buffers()}
    text_params = sorted(n for n in whole_params if n.startswith(("model.language_model.", "lm_head.")))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.0)
    torch.manual_seed(7)
    x = torch.randint(0, whole.config.text_config.vocab_size, (cfg.batch, cfg.seq_len))
    with torch.no_grad():
        logits_diff = float((model(input_ids=x).logits - whole(input_ids=x).logits).abs().max())
    loss = causal_lm_loss(model, x, cfg.loss_chunk_tokens)
    loss.backward()
    optimizer.step()
    out = {"model_class": info["model_class"], "params": sorted(n for n, _ in model.named_parameters()),
           "text_params": [n for n in text_params if n != "lm_head.weight"],
           "params_equal": params_equal, "buffers": buffers, "logits_max_diff": logits_diff, "loss": float(loss),
           "layers": len(trainer.decoder_layers(model)), "hf_config": info["hf_config"]}
    open(f"{cfg.outdir}/probe{dist.rank}.json", "w").write(json.dumps(out))
    torch.distributed.destroy_process_group()
"""
MULTIMODAL = "Gemma-4-26B-A4B-multimodal_checkpoint"


def train_config(family: Family, source: str, outdir: Path, task: str = "pt"):
    """The harness's config for ``family``: the saved checkpoint's path, or the tiny random build of
    the same config (the family's tying and rope as catalogue facts the tiny build does not read:
    random init is compared on buffers, which it recomputes)."""
    from wattflex.runs.training.train_config import TrainConfig

    facts = {**family.facts, "tie_word_embeddings": family.tied}
    # compile off: what is checked is the load, the sharding and one step, not torch.compile (traced
    # per layer on the CPU it was ~70 % of the job's CPU time; gpu_check's step j is the compile check)
    kw = dict(
        model_facts=facts,
        task=task,
        lora_rank=4,
        seq_len=32,
        batch=2,
        device="cpu",
        max_steps=1,
        duration_s=120,
        eval_at_s=None,
        checkpoint_at_s=None,
        parallel="fsdp",
        compile=False,
        outdir=str(outdir),
    )
    if source == "random_init":
        return TrainConfig(tiny=True, **kw)
    save_checkpoint(family, outdir / "model")
    return TrainConfig(model_path=str(outdir / "model"), **kw)


def cases(work: Path) -> dict[str, tuple[str, Any]]:
    """Every family x source as ``run_probes`` cases."""
    out = {}
    for family in FAMILIES:
        for source in SOURCES:
            d = work / f"{family.name}-{source}"
            out[d.name] = (FAMILY_PROBE, train_config(family, source, d))
        if family.name in LORA:
            d = work / f"{family.name}-lora"
            out[d.name] = (FAMILY_PROBE, train_config(family, "model_path", d, task="lora"))
    d = work / MULTIMODAL
    save_multimodal_gemma4(d / "model")
    cfg = train_config(GEMMA4, "random_init", d)
    cfg.tiny, cfg.model_path = False, str(d / "model")
    out[d.name] = (MULTIMODAL_PROBE, cfg)
    return out


def summary(reports: list[dict]) -> dict[str, Any]:
    """One row of the table from every rank's report of a case (the worst rank's figures)."""
    return {
        "logits_max_diff": max(r["logits_max_diff"] for r in reports),
        "grad_max_diff": max(r["grad_max_diff"] for r in reports),
        "buffers_equal": all(all(r["buffers"].values()) for r in reports),
        "buffers": sorted(reports[0]["buffers"]),
        "unequal_buffers": sorted({n for r in reports for n, ok in r["buffers"].items() if not ok}),
        # the base model's weights (LoRA's lora_A are each rank's own draws)
        "params_equal": all(
            ok for r in reports for n, ok in r["params_equal"].items() if "lora_" not in n
        ),
        # a finite loss, and every parameter moved but those of no gradient (lora_A while lora_B is 0)
        "step_taken": all(
            math.isfinite(r["loss"])
            and len(r["unchanged"]) < r["params"]
            and set(r["unchanged"]) <= set(r["zero_grad"])
            for r in reports
        ),
        "moved": min(r["params"] - len(r["unchanged"]) for r in reports),
        "trainable": reports[0]["params"],
        "loss": reports[0]["loss"],
        "ref_loss": reports[0]["ref_loss"],
        "unchanged": sorted({n for r in reports for n in r["unchanged"]}),
        "tied": all(r["tied"] for r in reports),
        "model_class": reports[0]["model_class"],
    }


# ---- families users bring (cuda.model_path): outside the catalogue, through LoRA -----------------
@dataclass(frozen=True)
class BroughtFamily:
    """A transformers family the catalogue has no model of, as a user's checkpoint brings it:
    ``config`` the tiny config of its real class (the published config.json's layout, widths
    shrunk), ``targets`` the adapters its modeling file's attention and MLP classes hold (the
    spec the harness's derived targets are checked against), ``expert_parameters`` the fused
    expert weights LoRA reaches through ``target_parameters``."""

    name: str
    model_type: str
    config: dict[str, Any]
    targets: tuple[str, ...]
    source: str
    expert_parameters: tuple[str, ...] = ()


_IDS = {"pad_token_id": 0, "bos_token_id": 1, "eos_token_id": 2}  # inside the tiny vocabulary
_TINY_DENSE = {
    "vocab_size": 256,
    "hidden_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "intermediate_size": 128,
    **_IDS,
}
_QKVO_MLP = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
BROUGHT = [
    BroughtFamily(
        "Phi-3-mini-4k",
        "phi3",
        _TINY_DENSE,
        ("qkv_proj", "o_proj", "gate_up_proj", "down_proj"),  # modeling_phi3: fused qkv, gate_up
        "microsoft/Phi-3-mini-4k-instruct config.json; transformers 5.25 modeling_phi3.py",
    ),
    BroughtFamily(
        "DeepSeek-V3",
        "deepseek_v3",
        {
            **_TINY_DENSE,
            "num_key_value_heads": 4,
            "moe_intermediate_size": 32,
            "n_routed_experts": 4,
            "num_experts_per_tok": 2,
            "n_shared_experts": 1,
            "first_k_dense_replace": 1,  # published 3 of 61 layers dense; here 1 of 2
            "q_lora_rank": 32,  # published 1536: MLA's low-rank query (q_a_proj, q_b_proj)
            "kv_lora_rank": 16,  # published 512
            "qk_nope_head_dim": 16,
            "qk_rope_head_dim": 8,
            "v_head_dim": 16,
            "n_group": 1,
            "topk_group": 1,
        },
        (
            "q_a_proj",
            "q_b_proj",
            "kv_a_proj_with_mqa",
            "kv_b_proj",
            "o_proj",
            "gate_proj",
            "up_proj",
            "down_proj",
        ),
        "deepseek-ai/DeepSeek-V3 config.json; transformers 5.25 modeling_deepseek_v3.py (MLA)",
        ("mlp.experts.gate_up_proj", "mlp.experts.down_proj"),
    ),
    BroughtFamily(
        "Qwen2.5-0.5B",
        "qwen2",
        {**_TINY_DENSE, "tie_word_embeddings": True},
        _QKVO_MLP,
        "Qwen/Qwen2.5-0.5B config.json (tie_word_embeddings true)",
    ),
    BroughtFamily(
        "OLMo-2-1124-7B",
        "olmo2",
        {**_TINY_DENSE, "num_key_value_heads": 4},
        _QKVO_MLP,
        "allenai/OLMo-2-1124-7B config.json; transformers 5.25 modeling_olmo2.py",
    ),
]
# GPT-2 keeps its attention projections in Conv1D (c_attn, c_proj), no nn.Linear: refused
NO_ATTENTION_LINEAR = BroughtFamily(
    "gpt2",
    "gpt2",
    {"vocab_size": 256, "n_embd": 64, "n_layer": 2, "n_head": 4, **_IDS},
    (),
    "openai-community/gpt2 config.json; transformers 5.25 modeling_gpt2.py (Conv1D)",
)


def save_brought(family: BroughtFamily, path: Path, seed: int = 3) -> None:
    """``save_pretrained`` of a tiny random ``family`` model: the checkpoint a user would bring."""
    from transformers import AutoConfig, AutoModelForCausalLM

    torch.manual_seed(seed)
    config = AutoConfig.for_model(family.model_type, **family.config)
    AutoModelForCausalLM.from_config(config).save_pretrained(path)


def expected_adapters(model: torch.nn.Module, family: BroughtFamily, rank: int) -> int:
    """LoRA parameters of rank ``rank`` on ``family.targets``: r x (in + out) per nn.Linear of
    that name (peft's lora_A [r, in] and lora_B [out, r]), counted off the base model."""
    return sum(
        rank * (m.in_features + m.out_features)
        for name, m in model.named_modules()
        if isinstance(m, torch.nn.Linear) and name.rsplit(".", 1)[-1] in family.targets
    )
