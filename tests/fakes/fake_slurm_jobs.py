#!/usr/bin/python3 -I
"""FAKE squeue and slurmd -G for the sudo wrapper's tests (slurm/wattflex-setcap): the jobs
are ``jobs.json`` beside it, ``[{"id", "uid", "user", "state", "nodes": {node: "0-1"}, "name"?}]``. Answers what the
wrapper asks, ``squeue --json -t STATE -u UID -w NODE``, in SLURM 22.05's layout (openapi
v0.0.38, as the real squeue of tests/slurm/cluster.sh prints it: ``job_state`` a string,
``gres_detail`` one ``gpu:TYPE:COUNT(IDX:LIST)`` per node of the job, in the order of
``job_resources.allocated_nodes``), filtered as the real one filters. The wrapper's test on the
real cluster (tests/workflow/test_slurm_setcap.py) checks the same fields against real SLURM.
``slurmd -G -f CONF -N NODE`` prints, on stderr as the real one, one GPU record for the device files
``nvidia0``.. beside it (``gres.json``: their count), in 22.05's format."""

import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
with open(os.path.join(HERE, "jobs.json")) as f:
    JOBS = json.load(f)
prog, args = os.path.basename(sys.argv[0]), sys.argv[1:]


def option(flag):
    return args[args.index(flag) + 1] if flag in args else None


def count(idx):
    return sum(
        len(range(int(a), int(b or a) + 1))
        for a, _, b in (p.partition("-") for p in idx.split(","))
    )


if prog == "squeue" and "--json" in args:
    state, uid, node = option("-t"), option("-u"), option("-w")
    jobs = [
        {
            "job_id": j["id"],
            "name": j.get("name", "train"),
            "user_id": j["uid"],
            "user_name": j["user"],
            "job_state": j["state"],
            "nodes": ",".join(j["nodes"]),
            "gres_detail": [f"gpu:h200:{count(idx)}(IDX:{idx})" for idx in j["nodes"].values()],
            "job_resources": {"allocated_nodes": [{"nodename": n} for n in j["nodes"]]},
        }
        for j in JOBS
        if (state is None or j["state"] == state)
        and (uid is None or str(j["uid"]) == uid)
        and (node is None or node in j["nodes"])
    ]
    meta = {"plugin": {"type": "openapi/v0.0.38"}, "Slurm": {"release": "22.05.8"}}
    print(json.dumps({"meta": meta, "errors": [], "jobs": jobs}, indent=2))
elif prog == "slurmd" and args[:1] == ["-G"]:
    with open(os.path.join(HERE, "gres.json")) as f:
        n = json.load(f)["gpus"]
    print(
        f"slurmd-{option('-N')}: Gres Name=gpu Type=h200 Count={n} Index=0 ID=7696487 "
        f"File={HERE}/nvidia[0-{n - 1}] (null)",
        file=sys.stderr,
    )
else:
    print(f"fake {prog}: unsupported {args}", file=sys.stderr)
    sys.exit(1)
