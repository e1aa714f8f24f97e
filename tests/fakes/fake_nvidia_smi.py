#!/usr/bin/python3 -I
"""FAKE nvidia-smi for the sudo wrapper's tests (slurm/wattflex-setcap): answers
``-i ID --query-gpu=FIELDS --format=csv,noheader,nounits`` (FIELDS of pci.bus_id,
power.min_limit, power.max_limit) and ``-i ID -pl W`` only, ID an index or a PCI bus id (fake GPU i is on bus i+1, written as
nvidia-smi writes it, ``00000000:01:00.0``); a GPU that is not there: "No devices were found",
exit 6, as the real one. Every call is appended to ``nvidia-smi.calls`` (one JSON argv a line)
beside it; limits go to the FAKE NVML GPUs in ``gpus.json`` beside it (tests/fakes/fake_pynvml.py,
copied there too), so a run reading NVML sees the limit this set."""

import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
os.environ["FAKE_PYNVML_STATE"] = os.path.join(HERE, "gpus.json")
import fake_pynvml as nv  # noqa: E402

args = sys.argv[1:]
with open(os.path.join(HERE, "nvidia-smi.calls"), "a") as calls:
    calls.write(json.dumps(args) + "\n")
state = nv.state()


def bus_id(i):
    """Fake GPU i's PCI bus id, as nvidia-smi writes one."""
    return f"00000000:{i + 1:02X}:00.0"


buses = [bus_id(i) for i in range(len(state["gpus"]))]
which = args[1] if len(args) >= 3 and args[0] == "-i" else None
if which in buses:
    which = str(buses.index(which))
if which is None or not which.isdigit() or int(which) >= len(state["gpus"]):
    print("No devices were found" if which else f"fake nvidia-smi: unsupported call {args}")
    sys.exit(6)
i = int(which)
gpu = state["gpus"][i]
FIELDS = {
    "pci.bus_id": bus_id(i),
    "power.min_limit": f"{gpu['min_mw'] / 1000:.2f}",
    "power.max_limit": f"{gpu['max_mw'] / 1000:.2f}",
}
query = args[2].removeprefix("--query-gpu=").split(",") if len(args) == 4 else []
if args[2].startswith("--query-gpu=") and args[3:] == ["--format=csv,noheader,nounits"]:
    if not set(query) <= set(FIELDS):
        print(f"fake nvidia-smi: unsupported fields {query}", file=sys.stderr)
        sys.exit(6)
    print(", ".join(FIELDS[f] for f in query))
elif len(args) == 4 and args[2] == "-pl":
    gpu["limit_mw"] = int(float(args[3]) * 1000)
    state["set_calls"].append([i, gpu["limit_mw"]])
    nv._save(state)
    print(f"Power limit for GPU {bus_id(i)} was set to {float(args[3]):.2f} W from ...")
else:
    print(f"fake nvidia-smi: unsupported call {args}", file=sys.stderr)
    sys.exit(6)
