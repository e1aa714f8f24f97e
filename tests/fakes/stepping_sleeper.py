"""A stand-in for a harness job where the SLURM side is what a test checks, not the training
(tests/workflow/test_slurm_knobs.py): it steps by sleeping, so a job costs no CPU.

``stepping_sleeper.py OUTDIR [STEP_S]``: like ``python -m wattflex.runs.training`` with
``resume=True`` and a checkpoint at step 3, it writes OUTDIR/steps.live.csv afresh
("step,t_end_s,tokens,loss", one row per step; wattflex.runs.training.train_config.LIVE_STEPS_FILE),
a checkpoint folder OUTDIR/checkpoint/step3 whose ``.metadata`` is written last (the layout
wattflex.runs.training.checkpoint.latest reads), and, when it starts with a complete checkpoint
there (a requeued job), logs the harness's "resumed from step N" and goes on from step N + 1.
A step takes STEP_S seconds (default 0.25), asleep. It runs until it is signalled.
"""

import sys
import time
from pathlib import Path

CHECKPOINT_AT_STEP = 3

out = Path(sys.argv[1])
step_s = float(sys.argv[2]) if len(sys.argv) > 2 else 0.25
root = out / "checkpoint"
done = [
    int(p.name[4:])
    for p in root.glob("step*")
    if p.name[4:].isdigit() and (p / ".metadata").is_file()
]
step = max(done, default=0)
if done:
    print(f"resumed from step {step} ({root / f'step{step}'})", flush=True)
t0 = time.time()
with open(out / "steps.live.csv", "w", buffering=1) as live:
    live.write("step,t_end_s,tokens,loss\n")
    while True:
        time.sleep(step_s)
        step += 1
        live.write(f"{step},{time.time() - t0:.3f},128,1.0\n")
        if step == CHECKPOINT_AT_STEP and not done:
            (root / f"step{step}").mkdir(parents=True, exist_ok=True)
            (root / f"step{step}" / ".metadata").write_bytes(b"")
