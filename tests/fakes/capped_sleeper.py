"""A process that caps FAKE GPUs with the real CapGuard and then waits to be signalled.

``capped_sleeper.py STATE_DIR CAP_W [CLOCK_MHZ]``: prints CAPPED once the cap is set (and, with
CLOCK_MHZ, the SM clock locked through the real ClockGuard), then sleeps.
The fake GPU state is shared through FAKE_PYNVML_STATE, so the test can check afterwards
whether the limits were restored (SIGTERM/SIGHUP/SIGINT) or left (SIGKILL).
"""

import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import fake_pynvml

sys.modules["pynvml"] = fake_pynvml

from contextlib import ExitStack

from wattflex.runs.devices import caps, clocks
from wattflex.runs.devices.nvml import open_gpus

with ExitStack() as stack:
    gpus = open_gpus(gpm=False)
    stack.enter_context(caps.CapGuard(gpus, float(sys.argv[2]), "nvml", sys.argv[1]))
    if len(sys.argv) > 3:
        stack.enter_context(clocks.ClockGuard(gpus, float(sys.argv[3]), "nvml", sys.argv[1]))
    print("CAPPED", flush=True)
    time.sleep(60)
