#!/usr/bin/python3 -I
"""FAKE squeue and scontrol (installed under both names) for the sudo wrapper's tests: the
jobs are ``jobs.json`` beside it, ``[{"id", "uid", "user", "state", "nodes": {node: "0-1"}}]``.
Answers what slurm/wattflex-setcap asks, in SLURM 22.05's formats:
``squeue -h -t STATE -u UID -w NODE -o %A`` (filtered as the real one filters),
``scontrol show job -d ID`` (the detail line's format is libslurmfull's
``  Nodes=%s CPU_IDs=%s Mem=%lu GRES=%s``, a GRES ``name:type:count(IDX:list)``) and
``scontrol show hostnames LIST`` (plain comma lists only)."""

import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
with open(os.path.join(HERE, "jobs.json")) as f:
    JOBS = json.load(f)
prog, args = os.path.basename(sys.argv[0]), sys.argv[1:]


def option(flag):
    return args[args.index(flag) + 1] if flag in args else None


if prog == "squeue":
    state, uid, node = option("-t"), option("-u"), option("-w")
    for j in JOBS:
        if (
            (state is None or j["state"] == state)
            and (uid is None or str(j["uid"]) == uid)
            and (node is None or node in j["nodes"])
        ):
            print(j["id"])
elif prog == "scontrol" and args[:2] == ["show", "hostnames"]:
    print("\n".join(args[2].split(",")))
elif prog == "scontrol" and args[:3] == ["show", "job", "-d"]:
    (j,) = [j for j in JOBS if str(j["id"]) == args[3]]
    print(
        f"JobId={j['id']} JobName=train\n   UserId={j['user']}({j['uid']}) GroupId={j['user']}({j['uid']}) "
        f"MCS_label=N/A\n   JobState={j['state']} Reason=None Dependency=(null)\n"
        f"   NodeList={','.join(j['nodes'])}\n   NumNodes={len(j['nodes'])} NumCPUs=8"
    )
    for node, idx in j["nodes"].items():
        count = sum(
            len(range(int(a), int(b or a) + 1))
            for a, _, b in (p.partition("-") for p in idx.split(","))
        )
        print(f"     Nodes={node} CPU_IDs=0-7 Mem=0 GRES=gpu:h200:{count}(IDX:{idx})")
else:
    print(f"fake {prog}: unsupported {args}", file=sys.stderr)
    sys.exit(1)
