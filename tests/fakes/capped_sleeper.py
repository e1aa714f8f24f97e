"""A process that caps FAKE GPUs with the real CapGuard and then waits to be signalled.

``capped_sleeper.py STATE_DIR CAP_W``: prints CAPPED once the cap is set, then sleeps.
The fake GPU state is shared through FAKE_PYNVML_STATE, so the test can check afterwards
whether the limits were restored (SIGTERM/SIGHUP/SIGINT) or left (SIGKILL).
"""

import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import fake_pynvml

sys.modules["pynvml"] = fake_pynvml

from wattflex.runs.devices import caps
from wattflex.runs.devices.nvml import open_gpus

with caps.CapGuard(open_gpus(gpm=False), float(sys.argv[2]), "nvml", sys.argv[1]):
    print("CAPPED", flush=True)
    time.sleep(60)
