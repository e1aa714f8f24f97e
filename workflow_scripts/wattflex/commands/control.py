"""``wattflex control``: per-job GPU caps that keep this node's GPUs under a power budget.

``--dry-run`` reads the GPUs through NVML, read-only, and prints the cap the controller
would set on each for the budget now; nothing is written to them. Without it the
controller runs for ``--duration-s`` (default: to the end of the signal), one decision
every ``--period-s``, and puts every GPU's original limit back when it stops: at the end,
on an error, on SIGINT/SIGTERM/SIGHUP (a SIGKILL leaves a state file for
``wattflex restore-caps``).

Jobs are groups of GPUs that share a cap (``--job 0-3 --job 4-7``; default: each GPU is
its own job). A GPU reports no tokens/s, so the policies that weigh throughput
(pfi-aware, curve-aware, online-learning) take every GPU's throughput as equal, and
online-learning has nothing to learn from; PFI comes from the DRAM copy product through
``--model`` (a predictor's model.json), or is taken as equal for all jobs.
"""

from __future__ import annotations

import argparse
import math
import sys

from wattflex.allocation.policies import CONTROL_POLICIES, REGISTRY
from wattflex.errors import UserError

NAME = "control"
HELP = "Per-job GPU caps that follow a power budget or signal (--dry-run: print them, change nothing)"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    how = parser.add_mutually_exclusive_group(required=True)
    how.add_argument("--budget-w", type=float, help="power budget for these GPUs together, in W")
    how.add_argument("--signal", help="budget signal CSV (time_s,fraction); fraction of --basis, >= 1 = no limit")
    parser.add_argument("--basis", choices=("nominal", "measured"), default="nominal",
                        help="what a signal's fraction applies to: the sum of the GPUs' maximum limits "
                             "(nominal, default) or their power measured at the start")
    parser.add_argument("--policy", choices=CONTROL_POLICIES, default="equal-weight", help="allocation policy")
    parser.add_argument("--dry-run", action="store_true", help="print the caps it would set; change nothing")
    parser.add_argument("--at-s", type=float, default=0.0, help="--dry-run with --signal: the signal's time to use")
    parser.add_argument("--job", action="append", metavar="GPUS",
                        help="NVML indices of one job's GPUs, e.g. 0-3 or 0,2 (repeat per job; default: one job per GPU)")
    parser.add_argument("--moe-ft", action="append", default=[], metavar="JOB",
                        help="job number (0-based, in --job order) that is MoE fine-tuning (moe-ft-weighted)")
    parser.add_argument("--model", help="predictor model.json (PFI from the DRAM copy product)")
    parser.add_argument("--period-s", type=float, default=5.0, help="control period (default 5 s)")
    parser.add_argument("--duration-s", type=float, help="how long to control (default: the signal's length)")
    parser.add_argument("--cap-control", choices=("nvml", "command"), default="nvml",
                        help="how limits are set: NVML directly (root) or --cap-command")
    parser.add_argument("--cap-command", help="admin-approved command, e.g. 'sudo /usr/local/bin/setcap {gpu} {watts}'")
    parser.add_argument("--state-dir", help="cap state files (default $WATTFLEX_STATE_DIR or /var/tmp/wattflex)")


def parse_gpus(spec: str) -> list[int]:
    """``"0-3"`` -> [0, 1, 2, 3]; ``"0,2"`` -> [0, 2]."""
    out: list[int] = []
    for part in (p.strip() for p in spec.split(",") if p.strip()):
        lo, _, hi = part.partition("-")
        if not lo.isdigit() or (hi and not hi.isdigit()):
            raise ValueError(f"--job {spec!r}: expected NVML indices like 0-3 or 0,2")
        out += list(range(int(lo), int(hi or lo) + 1))
    return out


def run(args: argparse.Namespace) -> int:
    import numpy as np

    from wattflex.runs.devices.caps import limit_setter
    from wattflex.control.controller import ControlConfig, Controller, pfi_from_model, read_signal
    from wattflex.control.loop import NodeJob, job_table, read_jobs, run_loop, sample_devices
    from wattflex.runs.devices.nvml import local_gpu_indices, nvml, open_gpus

    try:
        nvml()
    except RuntimeError as exc:
        raise UserError(f"no NVML on this machine ({exc}); there are no NVIDIA GPUs here to read or cap") from None
    indices = [parse_gpus(j) for j in args.job] if args.job else [[i] for i in local_gpu_indices()]
    flat = [i for job in indices for i in job]
    if len(set(flat)) != len(flat):
        raise UserError("a GPU appears in two --job groups")
    setter = None if args.dry_run else limit_setter(args.cap_control, args.cap_command)
    gpus = {g.index: g for g in open_gpus(set_limit=setter, indices=flat)}
    model = None
    if args.model:
        from wattflex.provenance import read_json

        model = read_json(args.model)
    jobs = []
    for n, idx in enumerate(indices):
        devs = [gpus[i] for i in idx]
        jobs.append(NodeJob(job_id="gpu" + "+".join(map(str, idx)), devices=devs,
                            read=lambda t, devs=devs: sample_devices(devs, t), moe_ft=str(n) in args.moe_ft))
    first = read_jobs(jobs, 0.0)
    nominal = sum(hi for g in gpus.values() for _, hi in [g.constraints()])
    for j, p in zip(jobs, first.power_w):
        uncapped = all(d.power_limit_w() >= d.constraints()[1] - 1.0 for d in j.devices)
        j.p_max_w = float(p) if uncapped and math.isfinite(p) else math.nan
    dcp = first.dram_active * first.mem_copy_util
    predict_pfi = pfi_from_model(model)
    for j, d in zip(jobs, dcp):
        j.dram_copy_product = float(d)
        j.pfi = float(predict_pfi(np.array([d]))[0]) if predict_pfi is not None and math.isfinite(d) else math.nan
    if args.signal:
        signal = read_signal(args.signal)
        basis = nominal if args.basis == "nominal" else float(np.nansum(first.power_w))

        def budget_at(t: float) -> float:
            f = float(signal.at(t))
            return f * basis if f < 1.0 else math.inf
        source = f"signal {args.signal} ({args.basis} basis {basis:.0f} W)"
        duration = args.duration_s if args.duration_s is not None else signal.duration_s
    else:
        budget_at = lambda t: float(args.budget_w)  # noqa: E731
        source = f"--budget-w {args.budget_w:g}"
        duration = args.duration_s if args.duration_s is not None else math.inf
    cfg = ControlConfig(period_s=args.period_s)
    if args.dry_run:
        t = args.at_s if args.signal else 0.0
        budget = budget_at(t)
        ctl = Controller([args.policy], cfg, len(jobs), predict_pfi)
        caps = ctl.step(t, budget, job_table(jobs), first)[0]
        print(f"wattflex control --dry-run: policy {args.policy}, budget "
              f"{'none (no curtailment)' if not math.isfinite(budget) else f'{budget:.0f} W'} from {source} "
              f"at t={t:g} s, {len(flat)} GPU(s) in {len(jobs)} job(s)")
        print(f"{'job':<12}{'gpu':>5}{'power_w':>10}{'limit_w':>10}{'would_set_w':>13}{'range_w':>11}")
        for j, p, cap in zip(jobs, first.power_w, caps):
            for d in j.devices:
                lo, hi = d.constraints()
                print(f"{j.job_id:<12}{d.index:>5}{p / len(j.devices):>10.1f}{d.power_limit_w():>10.0f}"
                      f"{cap:>13.0f}{f'{lo:.0f}-{hi:.0f}':>11}")
        if predict_pfi is None and REGISTRY[args.policy].feature == "pfi":
            print("note: no --model (or no DRAM activity from GPM): every job's PFI taken as equal", file=sys.stderr)
        print("dry run: no power limit was changed")
        return 0
    if not math.isfinite(duration):
        raise UserError("with --budget-w, say how long to control with --duration-s")
    print(f"controlling {len(flat)} GPU(s) in {len(jobs)} job(s) with {args.policy} for {duration:g} s, budget from "
          f"{source}; limits are restored when this stops", flush=True)
    rec = run_loop(jobs, budget_at, args.policy, cfg, duration, mode=args.cap_control, state_dir=args.state_dir,
                   command=args.cap_command, predict_pfi=predict_pfi)
    over = [p - b for p, b in zip(rec.power_w, rec.budget_w) if math.isfinite(b)]
    print(f"done: {len(rec.t_s)} periods, worst reading {max(over, default=0):+.0f} W vs the budget; "
          f"power limits restored")
    return 0

