"""``wattflex control``: per-job GPU caps that keep this node's GPUs under a power budget.

``--dry-run`` reads the GPUs through NVML, read-only, and prints the cap the controller
would set on each for the budget now; nothing is written to them. Without it the
controller runs for ``--duration-s`` (default: to the end of the signal), one decision
every ``--period-s``, and puts every GPU's original limit back when it stops: at the end,
on an error, on SIGINT/SIGTERM/SIGHUP/SIGQUIT/SIGUSR1/SIGUSR2 (a SIGKILL leaves a state
file; the next ``control`` restores the limits it recorded before it reads any limit as an
original, as a real run does, and so does ``wattflex restore-caps``).

Bad input stops it before anything is changed, with one line: a budget that is not a
finite number > 0 or is below the jobs' floors (every GPU at its minimum cap; a --signal
that dips below them is allowed: the GPUs are then held at their floors and every such
period logs a warning), a period under ``MIN_PERIOD_S``, a GPU index this node lacks, a
cap command that is not there, a state directory that is a file.

Jobs are groups of GPUs that share a cap (``--job 0-3 --job 4-7``; default: each GPU is
its own job). A GPU reports no tokens/s: each job's comes from the training log it already
writes (``--throughput-log`` per job, read live with the command backend's framework preset,
``--throughput-preset``, or ``--throughput-regex``: wattflex.runs.throughput). The policies
that need it (curve-aware: the curve's scale; online-learning: its shape) are refused
without one; PFI comes from the DRAM copy product through ``--model`` (a predictor's
model.json), or is taken as equal for all jobs.

A ``--budget-file`` that names ``clock_mhz`` (cluster-control carrying out the knob menu's
``clock``) has the GPUs' SM clock locked there as well, reset when the file names none and
however the agent ends (``ClockGuard``: state file, signals; the epilog resets a killed one's).
"""

from __future__ import annotations

import argparse
import logging
import math
import os
import shlex
import shutil
import sys
from datetime import UTC
from pathlib import Path

from wattflex.allocation.policies import CONTROL_POLICIES, REGISTRY, THROUGHPUT_POLICIES
from wattflex.commands import RenamedOption, add_log_level, command_logging
from wattflex.errors import UserError
from wattflex.schema import section_defaults

NAME = "control"
HELP = (
    "Per-job GPU caps that follow a power budget or signal (--dry-run: print them, change nothing)"
)
MIN_PERIOD_S = 0.1  # a shorter period only busies NVML (a limit takes ~100 ms to act)
MAX_PERIOD_S = 3600.0  # a control period longer than an hour follows no grid event
# the campaign's controller settings and cap control, the defaults of the same options here
_CONTROLLER, _CUDA = section_defaults("control", "controller"), section_defaults("cuda")
_SCENARIO = section_defaults("control", "scenarios", "*")
log = logging.getLogger("wattflex.commands.control")  # timestamped (--log-level)
MAX_GPU_INDEX = 1023  # no node has more GPUs; checked before a range is expanded into a list


def add_arguments(parser: argparse.ArgumentParser) -> None:
    how = parser.add_mutually_exclusive_group(required=True)
    how.add_argument("--budget-w", type=float, help="power budget for these GPUs together, in W")
    how.add_argument(
        "--signal",
        help="grid events: a schedule CSV/JSON (event_id,start_s|start,end_s|end,"
        "target_kw|fraction,ramp_kw_per_s,deadline_s) or the time_s,fraction CSV; "
        "fractions are of --basis, >= 1 = no limit",
    )
    how.add_argument(
        "--openadr-vtn",
        metavar="URL",
        help="follow the events of this OpenADR 2.0b VTN as a VEN "
        "(e.g. http://127.0.0.1:8080/OpenADR2/Simple/2.0b)",
    )
    how.add_argument(
        "--openadr3-vtn",
        metavar="URL",
        help="follow the events of this OpenADR 3 VTN (its REST base URL); "
        "bearer token from $WATTFLEX_OPENADR3_TOKEN if set",
    )
    how.add_argument(
        "--budget-file",
        metavar="JSON",
        help="agent of `wattflex cluster-control`: follow the budget this "
        "file holds (rewritten every period; stale: held to the "
        "event's end, then restored)",
    )
    parser.add_argument(
        "--load-file", metavar="JSON", help="write this node's measured load here every period"
    )
    parser.add_argument(
        "--site",
        metavar="YAML",
        help="the site's electrical tree (docs/grid.md): this node holds its "
        "equal share of every level above it in every period, ramps "
        "included (a --budget-file agent gets its share from the "
        "coordinator instead)",
    )
    parser.add_argument(
        "--node",
        help="this node's name in --site and in the metrics' node label "
        "(default $SLURMD_NODENAME, else the host name)",
    )
    parser.add_argument(
        "--budget-stale-s",
        type=float,
        default=15.0,
        help="--budget-file: older than this counts as no word from the coordinator (default 15 s)",
    )
    parser.add_argument(
        "--openadr3-program", metavar="ID", help="--openadr3-vtn: only this program's events"
    )
    parser.add_argument(
        "--ven-name",
        default=None,
        help="--openadr-vtn/--openadr3-vtn: this VEN's name (default: the host name)",
    )
    parser.add_argument(
        "--ramp-kw-per-s",
        type=float,
        help="--openadr-vtn: ramp limit of its events (default: none)",
    )
    parser.add_argument(
        "--basis",
        choices=("nominal", "measured"),
        default="nominal",
        help="what a signal's fraction applies to: the sum of the GPUs' maximum limits "
        "(nominal, default) or their power measured at the start",
    )
    parser.add_argument(
        "--policy", choices=CONTROL_POLICIES, default="equal-weight", help="allocation policy"
    )
    parser.add_argument(
        "--dry-run", action="store_true", help="print the caps it would set; change nothing"
    )
    parser.add_argument(
        "--at-s", type=float, default=0.0, help="--dry-run with --signal: the signal's time to use"
    )
    parser.add_argument(
        "--job-gpus",
        "--job",
        dest="job",
        action=RenamedOption,
        old=("--job",),
        append=True,
        metavar="GPUS",
        help="NVML indices of one job's GPUs, e.g. 0-3 or 0,2 (repeat per job; default: one job "
        "per GPU; --job is the old spelling)",
    )
    parser.add_argument(
        "--moe-ft",
        action="append",
        default=[],
        metavar="JOB",
        help="job number (0-based, in --job-gpus order) that is MoE fine-tuning (moe-ft-weighted)",
    )
    parser.add_argument("--model", help="predictor model.json (PFI from the DRAM copy product)")
    parser.add_argument(
        "--period-s",
        type=float,
        default=_CONTROLLER["period_s"],
        help=f"control period (default %(default)g s, at least {MIN_PERIOD_S:g} s)",
    )
    parser.add_argument(
        "--duration-s", type=float, help="how long to control (default: the signal's length)"
    )
    parser.add_argument(
        "--cap-control",
        choices=("nvml", "command"),
        default=_CUDA["cap_control"],
        help="how limits are set: NVML directly (root) or --cap-command (default %(default)s)",
    )
    parser.add_argument(
        "--cap-command",
        help="admin-approved command, e.g. 'sudo /usr/local/bin/setcap {gpu} {watts}'",
    )
    parser.add_argument(
        "--state-dir",
        help="cap state files (default $WATTFLEX_STATE_DIR, else /var/tmp/wattflex for root, /var/tmp/wattflex-<uid> for a user)",
    )
    parser.add_argument(
        "--restore-stagger-s",
        type=float,
        default=_CONTROLLER["restore_stagger_s"],
        help="after an event, uncap one job every this many seconds "
        "(default %(default)g; 0: all at once)",
    )
    parser.add_argument(
        "--mv-out",
        metavar="DIR",
        help="write the M&V of every event here (mv.json, mv_intervals.csv, timeseries.csv)",
    )
    parser.add_argument(
        "--response-s",
        type=float,
        default=_SCENARIO["response_s"],
        help="M&V deadline of events that name none "
        "(the time_s,fraction CSV; default %(default)g s)",
    )
    parser.add_argument(
        "--metrics-port", type=int, help="serve Prometheus metrics on this port (0: a free one)"
    )
    parser.add_argument(
        "--metrics-addr",
        default="127.0.0.1",
        help="address of the metrics server (default 127.0.0.1)",
    )
    parser.add_argument(
        "--throughput-log",
        action="append",
        metavar="PATH",
        help="the training log of each job (repeat in --job order; one per job), followed live "
        "as the command backend follows it; needed by "
        + ", ".join(THROUGHPUT_POLICIES)
        + " (the throughput panel's numbers too)",
    )
    parser.add_argument(
        "--throughput-preset",
        metavar="NAME",
        help="--throughput-log: the framework's log line (a preset of wattflex.runs.throughput: "
        "torchtitan, megatron, nemo, hf-trainer)",
    )
    parser.add_argument(
        "--throughput-regex",
        metavar="RX",
        help="--throughput-log: your own regex with a (?P<tokens_per_s>...) group",
    )
    parser.add_argument(
        "--throughput-stale-s",
        type=float,
        default=60.0,
        help="--throughput-log: a job's last logged rate older than this counts as none "
        "(default %(default)g s)",
    )
    add_log_level(parser)
    parser.add_argument(
        "--hpc-job-mapping-dir",
        metavar="DIR",
        default=os.environ.get("DCGM_HPC_JOB_MAPPING_DIR"),
        help="--metrics-port: dcgm-exporter's GPU-to-job mapping folder (one file per GPU "
        "index, one SLURM job id a line), the metrics' hpc_job label "
        "(default $DCGM_HPC_JOB_MAPPING_DIR)",
    )
    parser.add_argument(
        "--hpc-job",
        metavar="ID",
        default="",
        help="--metrics-port without a mapping folder: the SLURM job these GPUs run "
        "(cluster-control's agents name theirs), the hpc_job label",
    )


def parse_gpus(spec: str) -> list[int]:
    """``"0-3"`` -> [0, 1, 2, 3]; ``"0,2"`` -> [0, 2]."""
    out: list[int] = []
    for part in (p.strip() for p in spec.split(",") if p.strip()):
        lo, _, hi = part.partition("-")
        if not lo.isdigit() or (hi and not hi.isdigit()):
            raise ValueError(f"--job-gpus {spec!r}: expected NVML indices like 0-3 or 0,2")
        if hi and int(hi) < int(lo):
            raise ValueError(f"--job-gpus {spec!r}: range {part} runs backwards (write {hi}-{lo})")
        if int(hi or lo) > MAX_GPU_INDEX:
            raise ValueError(
                f"--job-gpus {spec!r}: GPU index {int(hi or lo)} is over {MAX_GPU_INDEX} "
                f"(NVML indices of this node's GPUs, 0-{MAX_GPU_INDEX})"
            )
        out += list(range(int(lo), int(hi or lo) + 1))
    if not out:
        raise ValueError(
            f"--job-gpus {spec!r}: names no GPU (expected NVML indices like 0-3 or 0,2)"
        )
    return out


def check_args(args: argparse.Namespace, max_span_s: float) -> None:
    """Refuse numbers that would make a wrong or runaway controller, before anything is read;
    ``max_span_s``: the longest time in seconds (``wattflex.ops.events.MAX_SPAN_S``)."""

    def finite(
        name: str, v: float | None, low: float, inclusive: bool = False, high: float = math.inf
    ) -> None:
        if v is not None and not (
            math.isfinite(v) and (v >= low if inclusive else v > low) and v <= high
        ):
            top = f" and <= {high:g}" if math.isfinite(high) else ""
            raise UserError(
                f"{name} {v:g}: must be a finite number {'>=' if inclusive else '>'} {low:g}{top}"
            )

    # seconds are held to a year (max_span_s), a period to an hour (as cluster-control's):
    # larger ones overflowed time_t and the waits built on them
    finite("--budget-w", args.budget_w, 0.0)
    finite("--period-s", args.period_s, MIN_PERIOD_S, inclusive=True, high=MAX_PERIOD_S)
    finite("--duration-s", args.duration_s, 0.0, high=max_span_s)
    finite("--at-s", args.at_s, 0.0, inclusive=True, high=max_span_s)
    finite("--restore-stagger-s", args.restore_stagger_s, 0.0, inclusive=True, high=MAX_PERIOD_S)
    finite("--response-s", args.response_s, 0.0, inclusive=True, high=max_span_s)
    finite("--ramp-kw-per-s", args.ramp_kw_per_s, 0.0)
    finite("--budget-stale-s", args.budget_stale_s, 0.0, high=max_span_s)
    if args.budget_file and args.duration_s is None:
        raise UserError("with --budget-file, say how long to control with --duration-s")
    vtn = "--openadr-vtn" if args.openadr_vtn else "--openadr3-vtn" if args.openadr3_vtn else None
    if vtn and args.duration_s is None:
        raise UserError(f"with {vtn}, say how long to control with --duration-s")
    if vtn and args.dry_run:
        raise UserError(
            f"--dry-run takes --budget-w or --signal, not {vtn} (a VEN takes events as they come)"
        )
    finite("--throughput-stale-s", args.throughput_stale_s, 0.0)
    if args.policy in THROUGHPUT_POLICIES and not args.throughput_log:
        raise UserError(
            f"--policy {args.policy} needs each job's tokens/s: give --throughput-log PATH per "
            f"job (its training log) with --throughput-preset or --throughput-regex; a GPU "
            f"reports no throughput"
        )
    if args.throughput_log and bool(args.throughput_preset) == bool(args.throughput_regex):
        raise UserError(
            "--throughput-log: give one of --throughput-preset or --throughput-regex "
            "(how to read its lines)"
        )
    if args.metrics_port is not None and not 0 <= args.metrics_port <= 65535:
        raise UserError(f"--metrics-port {args.metrics_port}: must be 0..65535 (0: a free port)")
    n_jobs = len(args.job) if args.job else None
    for m in args.moe_ft:
        if not m.isdigit() or (n_jobs is not None and int(m) >= n_jobs):
            which = f" 0..{n_jobs - 1}" if n_jobs is not None else ""
            raise UserError(
                f"--moe-ft {m!r}: expected a job number{which} (0-based, in --job-gpus order)"
            )


def check_gpu_indices(flat: list[int], count: int) -> None:
    for i in flat:
        if i >= count:
            have = (
                "no GPUs"
                if count == 0
                else f"{count} GPU{'s' if count > 1 else ''}: "
                + ("0" if count == 1 else f"0-{count - 1}")
            )
            raise UserError(f"GPU index {i} does not exist (this node has {have})")


def check_cap_command(template: str | None) -> None:
    """The cap command's template (``cap_command_problem``: only {gpu} and {watts}, valid
    format syntax) and its program, which must exist: all before anything is read or set."""
    from wattflex.runs.devices.caps import cap_command_problem

    if not template:
        raise UserError(
            "--cap-control command needs --cap-command, e.g. 'sudo /usr/local/bin/setcap {gpu} {watts}'"
        )
    problem = cap_command_problem(template)
    if problem:
        raise UserError(f"--cap-command {template!r}: {problem}")
    parts = shlex.split(template)
    if shutil.which(parts[0]) is None:
        raise UserError(f"--cap-command {template!r}: {parts[0]!r} is not an executable on PATH")


def check_state_dir(state_dir: Path) -> None:
    """The state directory must be (or become) a writable directory no other user can write."""
    from wattflex.runs.devices.cap_state import UnsafeStateDir, open_folder, trusted_uids

    if state_dir.exists() and not state_dir.is_dir():
        raise UserError(
            f"--state-dir {state_dir}: is a file, not a directory (cap state files go there)"
        )
    try:
        with open_folder(state_dir, trusted_uids(), create=True):
            pass
    except UnsafeStateDir as exc:
        raise UserError(f"--state-dir: {exc}") from None
    except OSError as exc:
        raise UserError(
            f"--state-dir {state_dir}: cannot create it ({exc.strerror or exc})"
        ) from None
    if not os.access(state_dir, os.W_OK | os.X_OK):
        raise UserError(f"--state-dir {state_dir}: not writable (cap state files go there)")


def restore_stale(
    state_dir: Path, flat: list[int], dry_run: bool, cap_command: str | None = None
) -> None:
    """Before any limit is read as an original: put back the limits recorded by runs that were
    killed (SIGKILL), as a real run does; refuse GPUs another live process is capping. Records
    another user planted are reported and left alone; ``cap_command`` is this agent's own."""
    from wattflex.runs.devices.caps import restore_from_state_dir

    for r in restore_from_state_dir(
        state_dir, dry_run=dry_run, only_gpus=flat, cap_command=cap_command
    ):
        gpus = ", ".join(
            f"GPU {g['index']} -> {g.get('restored_w', g['original_limit_w']):g} W"
            for g in r.get("gpus", [])
        )
        if r["action"] == "untrusted":
            print(f"warning: {r['path']}: {r['note']}; left alone", file=sys.stderr)
        elif r["action"] == "restored":
            print(
                f"restored the power limits left by killed process {r['pid']} ({gpus}; state file {r['path']})",
                file=sys.stderr,
            )
        elif r["action"] == "would restore":
            print(
                f"note: state file {r['path']} of killed process {r['pid']}: the limits shown are its caps; "
                f"control (or wattflex restore-caps) first puts back {gpus}",
                file=sys.stderr,
            )
        elif dry_run:
            print(
                f"note: state file {r['path']}: {r['action']}{': ' + r['error'] if r.get('error') else ''}; "
                f"the limits shown may not be the GPUs' own",
                file=sys.stderr,
            )
        elif r["action"].startswith("skipped"):
            raise UserError(
                f"process {r['pid']} is capping these GPUs now (state file {r['path']}); "
                f"stop it first, two controllers would fight"
            )
        else:
            raise UserError(
                f"state file {r['path']} of a killed run could not be restored ({r.get('error')}); "
                f"the limits now are not the originals: fix it, then `wattflex restore-caps "
                f"--state-dir {state_dir}`"
            )


def run(args: argparse.Namespace) -> int:
    """The command, its library log lines on stderr at ``--log-level``."""
    with command_logging(args.log_level):
        return follow(args)


def follow(args: argparse.Namespace) -> int:
    from wattflex.ops.events import MAX_SPAN_S
    from wattflex.ops.services.node_agent import NodeJob, sample_devices
    from wattflex.runs.devices.caps import default_state_dir, limit_setter
    from wattflex.runs.devices.nvml import local_gpu_indices, nvml, open_gpus

    check_args(args, MAX_SPAN_S)
    indices = [parse_gpus(j) for j in args.job] if args.job else None
    state_dir = Path(args.state_dir) if args.state_dir else default_state_dir()
    if not args.dry_run:
        if args.cap_control == "command":
            check_cap_command(args.cap_command)
        check_state_dir(state_dir)
        if args.mv_out:
            check_mv_dir(Path(args.mv_out))
    try:
        nv = nvml()
    except RuntimeError as exc:
        raise UserError(
            f"no NVML on this machine ({exc}); there are no NVIDIA GPUs here to read or cap"
        ) from None
    if indices is None:
        indices = [[i] for i in local_gpu_indices()]
        if args.moe_ft and max(map(int, args.moe_ft)) >= len(indices):
            raise UserError(
                f"--moe-ft {max(map(int, args.moe_ft))}: this node has {len(indices)} job(s) (one per GPU)"
            )
    flat = [i for job in indices for i in job]
    if len(set(flat)) != len(flat):
        raise UserError("a GPU appears in two --job groups")
    check_gpu_indices(flat, int(nv.nvmlDeviceGetCount()))
    if args.dry_run:
        if state_dir.is_dir():
            restore_stale(state_dir, flat, dry_run=True)
    else:
        restore_stale(
            state_dir,
            flat,
            dry_run=False,
            cap_command=args.cap_command if args.cap_control == "command" else None,
        )
    setter = None if args.dry_run else limit_setter(args.cap_control, args.cap_command)
    # the node as SLURM names it (an agent's step; several nodes may share a host name in tests)
    node = args.node or os.environ.get("SLURMD_NODENAME") or None
    gpus = {g.index: g for g in open_gpus(set_limit=setter, indices=flat, node=node)}
    model = None
    if args.model:
        from wattflex.commands.predict import load_model

        model = load_model(args.model)
    logs = throughput_sources(args, indices)
    jobs = []
    for n, idx in enumerate(indices):
        devs = [gpus[i] for i in idx]
        tps = logs[n].tokens_per_s if logs else None
        jobs.append(
            NodeJob(
                job_id="gpu" + "+".join(map(str, idx)),
                devices=devs,
                read=lambda t, devs=devs, tps=tps: sample_devices(devs, t, tps),
                moe_ft=str(n) in args.moe_ft,
            )
        )
    try:
        return control_jobs(args, jobs, gpus, flat, model, state_dir)
    finally:
        for log in logs:
            log.close()


def throughput_sources(args: argparse.Namespace, indices: list[list[int]]) -> list:
    """One :class:`wattflex.ops.services.node_agent.LogThroughput` per job from ``--throughput-log``
    (none without it); a count that is not the jobs' or a preset/regex the command backend
    refuses is one line."""
    from wattflex.ops.services.node_agent import LogThroughput
    from wattflex.runs.throughput import ThroughputError, ThroughputSource

    if not args.throughput_log:
        return []
    if len(args.throughput_log) != len(indices):
        raise UserError(
            f"--throughput-log given {len(args.throughput_log)} time(s) for {len(indices)} job(s): "
            f"one per job, in --job order"
        )
    spec = (
        {"preset": args.throughput_preset}
        if args.throughput_preset
        else {"regex": args.throughput_regex}
    )
    try:
        sources = [ThroughputSource.from_spec(spec, "--throughput", gpus=len(i)) for i in indices]
    except ThroughputError as exc:
        raise UserError(str(exc)) from None
    return [
        LogThroughput(path, src, args.throughput_stale_s)
        for path, src in zip(args.throughput_log, sources)
    ]


def control_jobs(
    args: argparse.Namespace, jobs: list, gpus: dict, flat: list[int], model, state_dir: Path
) -> int:
    """The rest of ``run``: the jobs' first reading, the budget's source, then a dry run's
    table or the control loop with its exporter, clock hold and M&V."""
    import numpy as np

    from wattflex.ops.controller import ControlConfig, Controller, pfi_from_model
    from wattflex.ops.events import (
        Schedule,
        check_schedule,
        check_target_units,
        ramp_at,
        read_schedule,
    )
    from wattflex.ops.services.node_agent import floor_w, job_table, read_jobs, run_loop
    from wattflex.runs.devices.base import CapError

    first = read_jobs(jobs, 0.0)
    nominal = sum(hi for g in gpus.values() for _, hi in [g.constraints()])
    for j, p in zip(jobs, first.power_w):
        uncapped = all(d.power_limit_w() >= d.constraints()[1] - 1.0 for d in j.devices)
        j.p_max_w = float(p) if uncapped and math.isfinite(p) else math.nan
    dcp = first.dram_active * first.mem_copy_util
    predict_pfi = pfi_from_model(model)
    for j, d in zip(jobs, dcp):
        j.dram_copy_product = float(d)
        j.pfi = (
            float(predict_pfi(np.array([d]))[0])
            if predict_pfi is not None and math.isfinite(d)
            else math.nan
        )
    floor = floor_w(job_table(jobs))
    if args.budget_w is not None and args.budget_w < floor:
        raise UserError(
            f"--budget-w {args.budget_w:g} W is below these GPUs' floor of {floor:.0f} W (the sum of "
            f"their minimum caps, {len(flat)} GPU(s)): no cap keeps them under it"
        )
    if args.budget_w is not None:
        check_target_units(
            args.budget_w,
            nominal,
            f"--budget-w {args.budget_w:g} W",
            "--budget-w is in W",
        )
    signal, ven, load_w = None, None, [math.nan]
    if args.signal:
        signal = read_schedule(args.signal)
        basis = nominal if args.basis == "nominal" else float(np.nansum(first.power_w))
        if isinstance(signal, Schedule):
            checked = check_schedule(signal, floor, basis, args.period_s, ceiling_w=nominal)
            for w in checked.warnings:
                log.warning("%s", w)
            signal = checked.schedule
            end_s = signal_end_s(
                signal, basis, args.restore_stagger_s * len(jobs) + 2 * args.period_s
            )
        else:
            low = signal.fraction * basis
            if (low < floor).any():
                k = int(np.argmin(low))
                log.warning(
                    f"signal {args.signal} dips to {low[k]:.0f} W at t={signal.time_s[k]:g} s, below these "
                    f"GPUs' floor of {floor:.0f} W: they are held at their minimum caps then (power may exceed "
                    f"the budget; each such period logs a warning)"
                )
            end_s = signal.duration_s

        def budget_at(t: float) -> float:
            return float(signal.budget(t, basis))

        source = f"signal {args.signal} ({args.basis} basis {basis:.0f} W)"
        duration = args.duration_s if args.duration_s is not None else end_s
    elif args.openadr_vtn or args.openadr3_vtn:
        signal, ven = start_ven(
            args,
            floor,
            nominal if args.basis == "nominal" else float(np.nansum(first.power_w)),
            load_w,
        )
        basis = ven.s.basis_w
        budget_at = lambda t: float(signal.budget(t, basis))  # noqa: E731
        source = f"OpenADR{' 3' if args.openadr3_vtn else ''} VTN {ven.s.vtn_url} ({args.basis} basis {basis:.0f} W)"
        duration = args.duration_s
    elif args.budget_file:
        from wattflex.ops.adapters.slurm import BudgetFile

        budget_file = BudgetFile(
            args.budget_file,
            args.budget_stale_s,
            lambda msg: log.warning("%s", msg),
        )
        budget_at = budget_file.budget_at
        source = f"budget file {args.budget_file}"
        duration = args.duration_s
    else:
        budget_at = lambda t: float(args.budget_w)  # noqa: E731
        source = f"--budget-w {args.budget_w:g}"
        duration = args.duration_s if args.duration_s is not None else math.inf
    limit_at = budget_file.limit_at if args.budget_file else None
    if args.site:
        from wattflex.errors import ConfigError
        from wattflex.ops.adapters.topology import read_site

        node = args.node or os.environ.get("SLURMD_NODENAME") or os.uname().nodename
        try:
            share = read_site(args.site).node_share_w(node)
        except ConfigError as e:
            raise UserError(str(e)) from None
        if share < floor:
            raise UserError(
                f"--site {args.site}: node {node}'s share of its limits is {share:.0f} W, below these "
                f"GPUs' floor of {floor:.0f} W: no cap keeps them under it"
            )
        coordinated = limit_at
        limit_at = (lambda t: min(share, coordinated(t))) if coordinated else (lambda t: share)
        source += f", node {node}'s share of the site's limits {share:.0f} W"
    cfg = ControlConfig(period_s=args.period_s, restore_stagger_s=args.restore_stagger_s)
    if args.dry_run:
        t = args.at_s if args.signal else 0.0
        budget = budget_at(t)
        ctl = Controller([args.policy], cfg, len(jobs), predict_pfi)
        caps = ctl.step(
            t, budget, job_table(jobs), first, limit_w=math.inf if limit_at is None else limit_at(t)
        )[0]
        print(
            f"wattflex control --dry-run: policy {args.policy}, budget "
            f"{'none (no curtailment)' if not math.isfinite(budget) else f'{budget:.0f} W'} from {source} "
            f"at t={t:g} s, {len(flat)} GPU(s) in {len(jobs)} job(s)"
        )
        print(
            f"{'job':<12}{'gpu':>5}{'power_w':>10}{'limit_w':>10}{'would_set_w':>13}{'range_w':>11}"
        )
        for j, p, cap in zip(jobs, first.power_w, caps):
            for d in j.devices:
                lo, hi = d.constraints()
                print(
                    f"{j.job_id:<12}{d.index:>5}{p / len(j.devices):>10.1f}{d.power_limit_w():>10.0f}"
                    f"{cap:>13.0f}{f'{lo:.0f}-{hi:.0f}':>11}"
                )
        if predict_pfi is None and REGISTRY[args.policy].feature == "pfi":
            print(
                "note: no --model (or no DRAM activity from GPM): every job's PFI taken as equal",
                file=sys.stderr,
            )
        print("dry run: no power limit was changed")
        return 0
    if not math.isfinite(duration):
        raise UserError("with --budget-w, say how long to control with --duration-s")
    print(
        f"controlling {len(flat)} GPU(s) in {len(jobs)} job(s) with {args.policy} for {duration:g} s, budget from "
        f"{source}; limits are restored when this stops",
        flush=True,
    )
    exporter = None
    if args.metrics_port is not None:
        from wattflex.ops.services.exporter import ControlExporter

        try:
            exporter = ControlExporter(
                args.metrics_port, args.metrics_addr, args.hpc_job_mapping_dir, args.hpc_job
            )
        except OSError as exc:
            if ven is not None:
                ven.stop()
            raise UserError(
                f"--metrics-port {args.metrics_port}: cannot listen on {args.metrics_addr} "
                f"({exc.strerror or exc})"
            ) from None
        print(f"metrics at {exporter.url}", flush=True)

    clock_hold = None
    if args.budget_file:  # the knob menu's clock, named in the budget file during an event
        from wattflex.runs.devices.clocks import ClockHold

        clock_hold = ClockHold(list(gpus.values()), "nvml", state_dir)

    def on_period(r) -> None:
        load_w[0] = r.power_w[-1]
        if clock_hold is not None:
            follow_clock(clock_hold, budget_file.clock_at(r.t_s[-1]))
        if args.load_file:
            from wattflex.ops.adapters.slurm import write_load

            write_load(
                args.load_file,
                Path(args.load_file).name.removesuffix(".load.json"),
                r.power_w[-1],
                r.caps_w[-1],
                exporter.url if exporter is not None else None,
            )
        if exporter is not None:
            exporter.update(r, jobs)

    if ven is not None:
        from datetime import datetime

        signal.rebase(datetime.now(UTC))
    try:
        # a schedule's (or VTN's) events also ramp-limit the cap changes, down and back up
        # (a cluster-control agent: its unit's share of the event's ramp, in its budget file)
        ramp = (
            (lambda t: ramp_at(signal, t))
            if signal is not None
            else (budget_file.ramp_at if args.budget_file else None)
        )
        rec = run_loop(
            jobs,
            budget_at,
            args.policy,
            cfg,
            duration,
            mode=args.cap_control,
            state_dir=state_dir,
            command=args.cap_command,
            predict_pfi=predict_pfi,
            on_period=on_period,
            ramp_at=ramp,
            limit_at=limit_at,
        )
    except CapError as exc:  # the guard has put back what it could; the message says what is left
        raise UserError(f"{exc} (--cap-control {args.cap_control})") from None
    finally:
        if clock_hold is not None:
            clock_hold.close()
        if exporter is not None:
            exporter.close()
        if ven is not None:
            ven.stop()
            for eid, resp in ven.responses.items():
                print(f"OpenADR{' 3' if args.openadr3_vtn else ''} event {eid}: {resp}", flush=True)
            signal = signal.schedule
    over = [p - b for p, b in zip(rec.power_w, rec.budget_w) if math.isfinite(b)]
    print(
        f"done: {len(rec.t_s)} periods, worst reading {max(over, default=0):+.0f} W vs the budget; "
        f"power limits restored"
    )
    if args.mv_out and signal is not None:
        p_max = float(np.nansum([j.p_max_w for j in jobs]))
        write_run_mv_report(
            Path(args.mv_out),
            rec,
            signal,
            args.response_s,
            p_max,
            {k: v for k, v in vars(args).items() if not k.startswith("_")},
            basis,
            f"wattflex control on {os.uname().nodename}",
        )
    return 0


def follow_clock(hold, clock_mhz: float | None) -> None:
    """The agent's clock lock to ``clock_mhz``; a lock the GPUs refuse is said (the caps still
    hold the budget) and tried again next period."""
    from wattflex.runs.devices.base import CapError

    try:
        hold.follow(clock_mhz)
    except CapError as exc:
        log.warning(f"SM clock lock at {clock_mhz:g} MHz failed ({exc})")


def write_run_mv_report(
    out: Path,
    rec,
    source,
    response_s: float,
    uncapped_w,
    params: dict,
    basis_w: float | None,
    title: str,
) -> list[dict]:
    """A real run's M&V (:func:`wattflex.ops.services.mv.write_run_mv`: mv.json, mv_intervals.csv,
    timeseries.csv) and the figure the cluster simulation draws per event
    (:func:`wattflex.plots.grid.mv_figure`): ``mv.png`` for the first event, ``mv_<k>.png``
    for the k-th after it; one line per event said."""
    import numpy as np

    from wattflex.ops.services.mv import write_run_mv
    from wattflex.plots.grid import mv_figure
    from wattflex.provenance import provenance, save_png

    recs, ts = write_run_mv(out, rec, source, response_s, uncapped_w, params, basis_w)
    prov = provenance(params=params, backend="nvml")
    curves = ts["baseline_curves_w"].to_numpy(float)
    for k, r in enumerate(recs):
        png = out / mv_png_name(k)
        fig = mv_figure(
            ts["t_s"].to_numpy(float),
            {"measured load": ts["power_w"].to_numpy(float)},
            ts["budget_w"].to_numpy(float),
            r,
            curves if np.isfinite(curves).any() else None,
            "nvml",
            title,
        )
        save_png(fig, png, prov, event_id=r["event_id"])
        print(f"{mv_line(r)}; wrote {out}/mv.json and {png}", flush=True)
    return recs


def mv_line(r: dict) -> str:
    """One event's M&V record in a line, in the words of the schedule's warnings (deadline
    met or missed) and its numbers rounded as measured (0.1 s, 1 W)."""
    s = lambda v: "never" if v is None else f"{v:.1f} s"  # noqa: E731
    deadline = "no deadline" if r["deadline_s"] is None else f"deadline {r['deadline_s']:g} s"
    return (
        f"M&V {r['event_id']}: {deadline} {'met' if r['deadline_met'] else 'missed'} "
        f"(response {s(r['response_time_s'])}), "
        f"{r['seconds_above_target_after_deadline']:g} s above target after the deadline "
        f"(worst {r['worst_w_above_target_after_deadline']:.0f} W), restored after "
        f"{s(r['restore_time_s'])}"
    )


def mv_png_name(k: int) -> str:
    return "mv.png" if k == 0 else f"mv_{k + 1}.png"


def start_ven(args: argparse.Namespace, floor_w: float, basis_w: float, load_w: list[float]):
    """The OpenADR 2.0b VEN (registered with the VTN) or OpenADR 3 VEN (first poll done); its
    live schedule and itself. It reports ``load_w[0]``, the load the controller measured last."""
    import socket

    from wattflex.ops.adapters.openadr import OpenADRVen, VenSettings

    settings = VenSettings(
        ven_name=args.ven_name or socket.gethostname(),
        vtn_url=args.openadr_vtn or args.openadr3_vtn,
        floor_w=floor_w,
        basis_w=basis_w,
        period_s=args.period_s,
        ramp_w_per_s=math.inf if args.ramp_kw_per_s is None else args.ramp_kw_per_s * 1e3,
        deadline_s=args.response_s,
    )
    if args.openadr3_vtn:
        from wattflex.ops.adapters.openadr3 import OpenADR3Ven

        ven = OpenADR3Ven(
            settings,
            args.openadr3_program,
            lambda: load_w[0],
            poll_s=max(args.period_s, 0.5),
            token=os.environ.get("WATTFLEX_OPENADR3_TOKEN"),
        )
    else:
        ven = OpenADRVen(settings, load_w=lambda: load_w[0])
    try:
        ven.start()
    except ConnectionError as exc:
        raise UserError(str(exc)) from None
    return ven.live, ven


def signal_end_s(schedule, basis_w: float, extra_s: float) -> float:
    """When a schedule's last event has ramped back, plus ``extra_s`` (staggered restore)."""
    ends = [
        e.end_s + (e.ramp_s(basis_w) if math.isfinite(e.ramp_w_per_s) else 0.0)
        for e in schedule.events
    ]
    return max(ends, default=0.0) + extra_s


def check_mv_dir(out: Path) -> None:
    """The M&V folder must be (or become) a folder we can write; refused before any cap is set."""
    from wattflex.commands._outputs import check_not_in_measured_run, check_outputs

    if out.exists() and not out.is_dir():
        raise UserError(f"--mv-out {out}: is a file, not a folder")
    check_not_in_measured_run(out, "--mv-out")  # before the folder is made
    out.mkdir(parents=True, exist_ok=True)
    check_outputs(
        [out / "mv.json", out / "mv_intervals.csv", out / "timeseries.csv", out / mv_png_name(0)],
        [],
    )
