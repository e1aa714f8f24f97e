"""Peak host memory of one loss forward + backward, chunked vs transformers' whole-sequence loss,
on CPU (wattflex.runs.training.loss; the plan's logits term, wattflex.runs.plan.LOGIT_BYTES).

Usage: python benchmarks/bench_loss_memory.py [--tokens 8192] [--vocab 32000] [--chunks 0 4096 1024] [--out MD]

A 1-layer Qwen3 of hidden 256 with a vocabulary of ``--vocab`` (fp32; the logits dominate)
runs one step on ``--tokens`` tokens in a fresh process per chunk size; the step's peak RSS
above the RSS just before it (ru_maxrss, Linux) is set beside the plan's 12 B x tokens-in-a-
chunk x vocab. Writes benchmarks/results/loss_memory.md (``--out``).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "workflow_scripts"))

STEP = """
import json, resource, sys, torch
from transformers import Qwen3Config, Qwen3ForCausalLM
from wattflex.runs.training.loss import causal_lm_loss
tokens, vocab, chunk = map(int, sys.argv[1:4])
torch.manual_seed(0)
model = Qwen3ForCausalLM(Qwen3Config(vocab_size=vocab, hidden_size=256, intermediate_size=512, num_hidden_layers=1,
                                     num_attention_heads=4, num_key_value_heads=2, head_dim=64))
x = torch.randint(0, vocab, (1, tokens))
causal_lm_loss(model, x[:, :64], chunk).backward()       # allocator and autograd warm, weight grads allocated
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
loss = causal_lm_loss(model, x, chunk)
loss.backward()
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
print(json.dumps({"loss": float(loss), "step_peak_bytes": peak - before}))
"""


def main(argv: list[str] | None = None) -> str:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--tokens", type=int, default=8192)
    p.add_argument("--vocab", type=int, default=32000)
    p.add_argument("--chunks", type=int, nargs="+", default=[0, 4096, 1024])
    p.add_argument("--out", type=Path, default=REPO / "benchmarks" / "results" / "loss_memory.md")
    args = p.parse_args(argv)
    from wattflex.runs.plan import LOGIT_BYTES

    env = {
        "PYTHONPATH": str(REPO / "workflow_scripts"),
        "OMP_NUM_THREADS": "1",
        "PATH": "/usr/bin:/bin",
    }
    rows = []
    for chunk in args.chunks:
        out = subprocess.run(
            [sys.executable, "-c", STEP, str(args.tokens), str(args.vocab), str(chunk)],
            capture_output=True,
            text=True,
            env=env,
            check=True,
        )
        r = json.loads(out.stdout.strip().splitlines()[-1])
        in_chunk = min(chunk, args.tokens) if chunk > 0 else args.tokens
        rows.append(
            (
                chunk or "off",
                r["loss"],
                r["step_peak_bytes"] / 2**30,
                LOGIT_BYTES * in_chunk * args.vocab / 2**30,
            )
        )
    md = [
        f"# Loss memory on CPU: {args.tokens} tokens, vocab {args.vocab}, fp32 (`python benchmarks/bench_loss_memory.py"
        f" --tokens {args.tokens} --vocab {args.vocab} --chunks {' '.join(map(str, args.chunks))}`)",
        "",
        "| loss_chunk_tokens | loss | step peak RSS GiB (measured) | plan's logits GiB | measured - plan GiB |",
        "| --- | --- | --- | --- | --- |",
    ]
    md += [f"| {c} | {loss:.6f} | {m:.2f} | {pl:.2f} | {m - pl:.2f} |" for c, loss, m, pl in rows]
    text = "\n".join(md) + "\n"
    args.out.write_text(text)
    print(text)
    return text


if __name__ == "__main__":
    main()
