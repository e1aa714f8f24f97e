"""The LoRA adapters the harness trains per family (issue 51): targets derived from each model's
own attention and MLP layers (``wattflex.runs.training.models.lora_targets``) and the trainable
parameters peft creates, at rank 32.

Catalogue families: the tiny config of their transformers class (tests/family_checkpoints.py
``FAMILIES``); families users bring with ``cuda.model_path`` (``BROUGHT``: Phi-3, DeepSeek-V3,
Qwen2.5, OLMo-2): a tiny ``save_pretrained`` checkpoint loaded as the harness loads it; GPT-2
(attention in Conv1D) is refused. Each row checks the linear adapters against r x (in + out)
over the modeling file's projection names. Prints a markdown table;
``python benchmarks/lora_targets.py > benchmarks/results/lora_targets.md``.
"""

from __future__ import annotations

import platform
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO), str(REPO / "workflow_scripts")]

import peft  # noqa: E402
import torch  # noqa: E402
import transformers  # noqa: E402

from tests.family_checkpoints import (  # noqa: E402
    BROUGHT,
    FAMILIES,
    NO_ATTENTION_LINEAR,
    expected_adapters,
    save_brought,
    tiny_hf_config,
)
from tests.tiny_training import tiny_cfg  # noqa: E402
from wattflex.runs.training import models  # noqa: E402

RANK = 32


def row(name: str, model_type: str, model: torch.nn.Module, cfg, spec=None) -> str:
    cls = type(model).__name__
    try:
        modules, params = models.lora_targets(model, model_type)
    except ValueError as exc:
        return f"| {name} | `{model_type}` | {cls} | refused: {exc} | — | — | — |"
    check = "—" if spec is None else f"{expected_adapters(model, spec, RANK):,}"
    peft_model = models.apply_lora(model, cfg)
    trainable = sum(p.numel() for p in peft_model.parameters() if p.requires_grad)
    linear = sum(
        p.numel()
        for n, p in peft_model.named_parameters()
        if p.requires_grad and ".experts." not in n
    )
    return (
        f"| {name} | `{model_type}` | {cls} | {', '.join(f'`{m}`' for m in modules)} | "
        f"{', '.join(f'`{p}`' for p in params) or '—'} | {trainable:,} ({linear:,} on linears) | {check} |"
    )


def main() -> None:
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    print("# LoRA targets per family, from the model's own layers (issue 51)\n")
    print(
        f"`python benchmarks/lora_targets.py`: rank {RANK}, fp32, CPU; torch {torch.__version__}, "
        f"transformers {transformers.__version__}, peft {peft.__version__}, {platform.machine()}. "
        "Tiny configs (hidden 64, 2 layers, vocab 256): the counts are of these tiny models, the "
        "targets those of the full ones. Last column: r x (in + out) summed over the nn.Linear "
        "layers whose names the family's modeling file gives its attention and MLP "
        "(tests/family_checkpoints.py `BROUGHT`), for the families users bring.\n"
    )
    print(
        "| family | model_type | class | target_modules | target_parameters (fused experts) "
        "| trainable parameters | modeling-file check (linears) |"
    )
    print("|---|---|---|---|---|---|---|")
    for fam in FAMILIES:
        model = AutoModelForCausalLM.from_config(tiny_hf_config(fam))
        cfg = tiny_cfg(fam.name, ".", model_facts=fam.facts, task="lora", lora_rank=RANK)
        print(row(fam.name, fam.hf_model_type, model, cfg))
    with tempfile.TemporaryDirectory() as tmp:
        for fam in [*BROUGHT, NO_ATTENTION_LINEAR]:
            path = Path(tmp) / fam.name
            save_brought(fam, path)
            cfg = tiny_cfg(
                fam.name,
                tmp,
                model_facts={"hf_model_type": fam.model_type},
                task="lora",
                tiny=False,
                model_path=str(path),
                lora_rank=RANK,
            )
            model = models.build_model(cfg, torch.float32)
            spec = fam if fam.targets else None
            print(row(f"{fam.name} (brought, `save_pretrained`)", fam.model_type, model, cfg, spec))


if __name__ == "__main__":
    main()
