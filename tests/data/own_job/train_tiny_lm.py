"""A plain PyTorch training loop that knows nothing of wattflex: the stand-in for a user's own
job in the tests of the command launch (wattflex.runs.command_run).

A tiny causal language model (embedding, two transformer encoder layers with a causal mask,
LM head) on random tokens, AdamW, CPU. Every ``--log-freq`` steps it logs a metrics line the
way torchtitan's MetricsProcessor does (``step: N  loss: L  memory: ...  tps: T  tflops: ...
mfu: ...``, tps = tokens per second per device over the steps since the last line), and
every ``--eval-freq`` steps it runs a few evaluation batches (a throughput dip, as a real
job's eval is). ``--fail-at STEP`` raises at that step (a crashing job), ``--hang-at STEP``
sleeps forever there (a hung job), ``--ignore-term`` ignores SIGTERM (a job slow to stop, which
only SIGKILL ends), ``--quiet`` logs nothing of its rate. ``--step-s S`` makes
each step last at least S seconds, the host sleeping out the rest: on a GPU the host queues a
step's kernels and then waits for the device, so a step's time is the device's and its host
thread mostly sleeps (a long run then costs a fraction of its seconds in CPU, as a GPU job's
host does).

    python train_tiny_lm.py --steps 60 --batch 4 --seq 64
"""

import argparse
import logging
import signal
import time

import torch
from torch import nn

logging.basicConfig(
    format="[titan] %(asctime)s - %(name)s - %(levelname)s - %(message)s", level=logging.INFO
)
logger = logging.getLogger("root")


class TinyLM(nn.Module):
    def __init__(self, vocab: int, dim: int, layers: int) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        layer = nn.TransformerEncoderLayer(dim, nhead=4, dim_feedforward=4 * dim, batch_first=True)
        self.blocks = nn.TransformerEncoder(layer, layers)
        self.head = nn.Linear(dim, vocab)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        mask = nn.Transformer.generate_square_subsequent_mask(tokens.shape[1])
        return self.head(self.blocks(self.embed(tokens), mask=mask, is_causal=True))


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=50)
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--seq", type=int, default=64)
    p.add_argument("--vocab", type=int, default=512)
    p.add_argument("--dim", type=int, default=64)
    p.add_argument("--log-freq", type=int, default=1)
    p.add_argument("--eval-freq", type=int, default=0)
    p.add_argument("--fail-at", type=int, default=0)
    p.add_argument("--hang-at", type=int, default=0)
    p.add_argument("--ignore-term", action="store_true")
    p.add_argument("--quiet", action="store_true")
    p.add_argument("--step-s", type=float, default=0.0)
    a = p.parse_args()
    if a.ignore_term:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    torch.manual_seed(0)
    torch.set_num_threads(1)
    model = TinyLM(a.vocab, a.dim, 2)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    loss_fn = nn.CrossEntropyLoss()
    n_params = sum(p.numel() for p in model.parameters())
    logger.info(
        "Model tiny_lm: %d parameters, %d steps of %d x %d tokens",
        n_params,
        a.steps,
        a.batch,
        a.seq,
    )
    tokens_since, t_last = 0, time.perf_counter()
    for step in range(1, a.steps + 1):
        t_step = time.perf_counter()
        if step == a.fail_at:
            raise RuntimeError(f"simulated failure at step {step}")
        if step == a.hang_at:
            logger.info("step %d: waiting forever", step)
            while True:
                time.sleep(1)
        x = torch.randint(0, a.vocab, (a.batch, a.seq + 1))
        logits = model(x[:, :-1])
        loss = loss_fn(logits.reshape(-1, a.vocab), x[:, 1:].reshape(-1))
        opt.zero_grad()
        loss.backward()
        opt.step()
        time.sleep(
            max(0.0, t_step + a.step_s - time.perf_counter())
        )  # the device's part of the step
        tokens_since += a.batch * a.seq
        if step % a.log_freq == 0 and not a.quiet:
            dt = time.perf_counter() - t_last
            tps = tokens_since / dt
            tflops = 6 * n_params * tps / 1e12
            logger.info(
                "step: %2d  loss: %7.4f  memory:  0.00GiB(0.00%%)  tps: %s  tflops: %.4f  mfu: 0.00%%",
                step,
                loss.item(),
                f"{tps:,.0f}",
                tflops,
            )
            tokens_since, t_last = 0, time.perf_counter()
        if a.eval_freq and step % a.eval_freq == 0:
            with torch.no_grad():
                for _ in range(5):
                    model(torch.randint(0, a.vocab, (a.batch, a.seq)))
            logger.info("eval at step %d done", step)
            t_last = time.perf_counter()
    logger.info("Training completed")


if __name__ == "__main__":
    main()
