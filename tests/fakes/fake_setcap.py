"""FAKE admin cap command for ``cap_control: command`` tests: ``fake_setcap.py GPU WATTS``.

Stands in for a site's sudo wrapper around ``nvidia-smi -i GPU -pl WATTS``: it changes the
fake GPU state shared through FAKE_PYNVML_STATE (as root would, ignoring ``allow_set``).
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import fake_pynvml as nv

gpu, watts = int(sys.argv[1]), float(sys.argv[2])
s = nv.state()
g = s["gpus"][gpu]
if not g["min_mw"] <= watts * 1000 <= g["max_mw"]:
    print(f"setcap: {watts} W out of range", file=sys.stderr)
    sys.exit(3)
g["limit_mw"] = int(watts * 1000)
s["set_calls"].append([gpu, int(watts * 1000)])
nv._save(s)
