"""A FAKE training job on one FAKE GPU: its throughput follows the GPU's power on a curve of
its own, and it logs torchtitan's metrics line (the format of tests/data/logs/torchtitan/).

``fake_trainer.py GPU T_MAX ALPHA LOG TOKENS_OUT SECONDS``: every 0.2 s for SECONDS, reads
the fake GPU's power P (tests/fakes/fake_pynvml.py, state in FAKE_PYNVML_STATE) and runs at
``T_MAX * (P / P_uncapped) ** ALPHA`` tokens/s (FAKE: a concave curve, ALPHA in (0, 1]; the
job's own, unknown to the controller), appends the line torchtitan's MetricsProcessor writes
(``tps``: tokens per second per device) to LOG, and counts its tokens; writes the total to
TOKENS_OUT at the end: the tokens the job kept, measured by the fake.
"""

import sys
import time
from datetime import datetime
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import fake_pynvml

gpu, t_max, alpha = int(sys.argv[1]), float(sys.argv[2]), float(sys.argv[3])
log, out, seconds = Path(sys.argv[4]), Path(sys.argv[5]), float(sys.argv[6])
tokens, step, start = 0.0, 0, time.time()
last = start
while last - start < seconds:
    time.sleep(0.2)
    now = time.time()
    g = fake_pynvml.state()["gpus"][gpu]
    tps = t_max * min(1.0, fake_pynvml.power_w(g) / g["demand_w"]) ** alpha
    tokens += tps * (now - last)
    last, step = now, step + 1
    stamp = datetime.now().strftime("%Y-%m-%d %H:%M:%S,%f")[:-3]
    with log.open("a") as f:
        f.write(
            f"[titan] {stamp} - root - INFO - step: {step:2d}  loss: {3.0:8.5f}  grad_norm:  1.2500  "
            f"memory: 45.30GiB(57.21%)  tps: {tps:,.0f}  tflops: 196.61  mfu: 19.88%\n"
        )
out.write_text(f"{tokens:.1f}\n")
