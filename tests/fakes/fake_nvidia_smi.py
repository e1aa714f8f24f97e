#!/usr/bin/python3 -I
"""FAKE nvidia-smi for the sudo wrapper's tests (slurm/wattflex-setcap): answers
``-i N --query-gpu=power.min_limit,power.max_limit --format=csv,noheader,nounits`` and
``-i N -pl W`` only. Every call is appended to ``nvidia-smi.calls`` (one JSON argv a line)
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
if len(args) < 3 or args[0] != "-i" or not args[1].isdigit() or int(args[1]) >= len(state["gpus"]):
    print(f"fake nvidia-smi: unsupported call {args}", file=sys.stderr)
    sys.exit(6)
gpu = state["gpus"][int(args[1])]
if args[2:] == ["--query-gpu=power.min_limit,power.max_limit", "--format=csv,noheader,nounits"]:
    print(f"{gpu['min_mw'] / 1000:.2f}, {gpu['max_mw'] / 1000:.2f}")
elif len(args) == 4 and args[2] == "-pl":
    gpu["limit_mw"] = int(float(args[3]) * 1000)
    state["set_calls"].append([int(args[1]), gpu["limit_mw"]])
    nv._save(state)
    print(
        f"Power limit for GPU 00000000:{int(args[1]):02X}:00.0 was set to {float(args[3]):.2f} W from ..."
    )
else:
    print(f"fake nvidia-smi: unsupported call {args}", file=sys.stderr)
    sys.exit(6)
