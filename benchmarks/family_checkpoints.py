"""Every catalogue family through the harness's sharded path: one row per family.

Usage: python benchmarks/family_checkpoints.py [--families Llama-3.1-70B Qwen3-0.6B ...]
                                               [--out benchmarks/results/family_checkpoints.md]

For each row of ``tests/family_checkpoints.py``'s ``FAMILIES`` (every ``hf_model_type`` of
``wattflex.architectures.ARCHITECTURES``, tied and untied where the family publishes both), one
real 2-rank gloo torchrun job on CPU runs two cases in each rank (the cases of
tests/workflow/torchrun/test_family_checkpoints.py):

- checkpoint: a tiny config of the family's transformers class with the published config's rotary
  settings, ``save_pretrained``, then ``trainer.prepare_model`` with ``cuda.model_path`` (meta build,
  FSDP2, rank 0 reads and broadcasts): against the same checkpoint loaded whole in one process,
  the logits on the same tokens, every parameter and buffer, the gradient of one step of the
  harness's loss; then an AdamW step (loss finite, every trainable parameter moved);
- random init: ``cuda.tiny``, the harness's own sharded random init: every buffer against a fresh
  unsharded build (RoPE's ``inv_freq``, Gemma's ``embed_scale``), then logits, gradient and step
  as above against the unsharded model given the gathered weights;
- and the multimodal Gemma-4 checkpoint (Gemma4ForConditionalGeneration): its text decoder only.

Writes a Markdown table to ``--out``; the figures are the worse of the two ranks.
"""

from __future__ import annotations

import argparse
import platform
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO), str(REPO / "workflow_scripts")]


def yes(v: bool) -> str:
    return "yes" if v else "**no**"


def lora_cell(job, fc, family) -> str:
    """LoRA from the checkpoint: base weights equal, logits and gradient diffs, adapters moved."""
    if family.name not in fc.LORA:
        return "—"
    s = fc.summary(job.reports(f"{family.name}-lora"))
    return (
        f"{yes(s['params_equal'] and s['buffers_equal'])}, {s['logits_max_diff']:.0e} / {s['grad_max_diff']:.0e}, "
        f"{s['moved']} of {s['trainable']} moved{'' if s['step_taken'] else ' **no step**'}"
    )


def main() -> None:
    import torch
    import transformers

    from tests import family_checkpoints as fc
    from tests.workflow.torchrun.training_jobs import run_probes

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--families", nargs="*", default=None, help="rows of FAMILIES by name (default: all)"
    )
    ap.add_argument(
        "--out", type=Path, default=REPO / "benchmarks" / "results" / "family_checkpoints.md"
    )
    args = ap.parse_args()
    families = [f for f in fc.FAMILIES if args.families is None or f.name in args.families]
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        cases = {
            k: v
            for k, v in fc.cases(work).items()
            if any(k.startswith(f.name + "-") for f in families)
        }
        t = time.time()
        job = run_probes(cases, work)
        wall = time.time() - t
        rows = []
        for f in families:
            ck = fc.summary(job.reports(f"{f.name}-model_path"))
            ri = fc.summary(job.reports(f"{f.name}-random_init"))
            rows.append(
                f"| {f.name} | `{f.hf_model_type}` | {ck['model_class']} | {yes(ck['tied']) if f.tied else 'no'} "
                f"| {ck['logits_max_diff']:.1e} | {ck['grad_max_diff']:.1e} | {yes(ck['params_equal'])} "
                f"| {yes(ck['buffers_equal'])} ({len(ck['buffers'])}) | {yes(ck['step_taken'])} ({ck['loss']:.3f}) "
                f"| {yes(ri['buffers_equal'])} ({len(ri['buffers'])}) | {ri['logits_max_diff']:.1e} "
                f"| {yes(ri['step_taken'])} | {lora_cell(job, fc, f)} |"
            )
            print(rows[-1], flush=True)
        mm_line = ""
        if fc.MULTIMODAL in cases:
            mm = job.reports(fc.MULTIMODAL)
            r0 = mm[0]
            text_only = all(
                sorted(r["params"])
                == sorted(n.replace("model.language_model.", "model.", 1) for n in r["text_params"])
                for r in mm
            )
            mm_line = (
                f"| {fc.MULTIMODAL} | {r0['model_class']} | {len(r0['params'])} of the checkpoint's "
                f"{len(r0['text_params'])} text-decoder parameters ({'only those' if text_only else '**others too**'}) "
                f"| {yes(all(all(r['params_equal'].values()) for r in mm))} "
                f"| {yes(all(all(r['buffers'].values()) for r in mm))} "
                f"| {max(r['logits_max_diff'] for r in mm):.1e} | {r0['loss']:.3f} |"
            )
    header = (
        "| family | hf_model_type | class | tied | logits max diff | grad max diff | weights equal "
        "| buffers equal (n) | step taken (loss) | random init: buffers equal (n) | random init: logits max diff "
        "| random init: step taken | LoRA from the checkpoint: weights and buffers equal, logits / grad max diff, "
        "adapters moved |\n|" + "---|" * 13
    )
    text = f"""# Every catalogue family through the sharded path

`python benchmarks/family_checkpoints.py` — one 2-rank gloo torchrun job on CPU ({wall:.0f} s for
{len(cases)} cases), torch {torch.__version__}, transformers {transformers.__version__}, {platform.machine()}.
Each family: a tiny config of its transformers class (hidden 64, 2 layers, vocab 256; the published
config's rotary settings and embedding tying: `tests/family_checkpoints.py` names each source),
`save_pretrained`, loaded by the harness (`trainer.prepare_model`, `cuda.model_path`, FSDP2 on 2 ranks, compile off)
and compared with the same checkpoint loaded whole in one process: logits on the same 2 x 32 tokens,
the gradient of the harness's loss (both ranks on the same tokens, so the reduced gradient is the
unsharded model's), every parameter and buffer gathered; one AdamW step (lr 1e-2, no weight decay):
finite loss and every trainable parameter moved. Random init: the harness's tiny sharded build, its
buffers against a fresh unsharded build's (weights differ by construction: each rank draws its own
shard on CPU), then logits and step against the unsharded model given the gathered weights.
LoRA (rank 4, peft; the fused expert weights through `target_parameters`) from the checkpoint for
the MoE families and a tied dense one: the step moves every `lora_B` (and no `lora_A`: its gradient
is zero while `lora_B` is).
Figures: the worse of the two ranks; fp32.

{header}
{chr(10).join(rows)}

A published Gemma-4 checkpoint is multimodal (`Gemma4ForConditionalGeneration`, config model_type
`gemma4`, the decoder under `model.language_model.`, vision and audio towers beside it). The harness
loads its text decoder only (`models.load_pretrained`), compared with the whole multimodal model
loaded by transformers (text-only logits):

| case | class built | parameters | weights equal | buffers equal | logits max diff | loss |
|---|---|---|---|---|---|---|
{mm_line}
"""
    args.out.write_text(text)
    print(f"wrote {args.out} ({wall:.0f} s)")


if __name__ == "__main__":
    main()
