"""``wattflex cluster-control``: one grid event across the SLURM cluster's GPU jobs.

The coordinator (:func:`wattflex.ops.services.coordinator.run_coordinator`) learns the running GPU jobs
from ``squeue --json`` every period, starts one agent per (job, node) as an ``srun --overlap``
step into the job's allocation (``wattflex control --budget-file``; caps restored when the
step ends, by any signal, and by the epilog), splits the event's budget over the units
(one that stops answering counted at its uncapped power; ``--policy`` and ``--curves``: by
the allocation policies on the jobs' campaign curves, else equal weights) through files in ``--budget-dir``
(a folder every node sees), and at the end tells every agent to restore and stops them.
However it ends (an error, SIGINT/SIGTERM/SIGHUP/...), every agent is told to restore first,
given two periods, then stopped (SIGTERM: each agent's guard restores its caps then too). A
``squeue`` that fails is retried, then the last known jobs are held; a job it describes badly
is skipped with a warning (said once).
``--knob-choice`` (the knob menu's choice, ``wattflex.allocation.knobs.choose(...).table`` as
CSV/JSON: ``job`` = SLURM job id or name, ``knob``) meets an event deeper than the caps' floor:
at its start the chosen jobs are paused (``scontrol suspend``) or requeued held, counted at idle
power / nothing, and at its end resumed / released (:class:`wattflex.ops.adapters.slurm_knobs.KnobPlan`).
``--mv-out`` writes the event's M&V on the cluster load (tables and figure), its baseline
from the load just before the event and, with ``--curves``, from the jobs' curves.
"""

from __future__ import annotations

import argparse
import shutil
from pathlib import Path

from wattflex.commands import (
    add_log_level,
    command_logging,
    finite_float,
    name_list,
    read_site_option,
)
from wattflex.errors import UserError
from wattflex.gpus import DEFAULT_GPU, GPUS
from wattflex.policies import CONTROL_POLICIES, SPLIT_POLICIES, THROUGHPUT_POLICIES, get
from wattflex.schema import section_defaults

MIN_PERIOD_S = 0.2  # twice an agent's floor (control.MIN_PERIOD_S): a period also runs squeue and writes every unit's file
# squeue's answer on a busy controller takes seconds (slurmctld serialises RPCs under load);
# longer than this and the coordinator holds the last known jobs for the period instead
SQUEUE_TIMEOUT_S = 5.0
MAX_PERIOD_S = 3600.0  # a coordination period longer than an hour follows no grid event

NAME = "cluster-control"
HELP = "Follow a grid event across the SLURM cluster's GPU jobs: one agent per job and node, the budget split"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The options of ``wattflex cluster-control``, in its help's groups."""
    parser.add_argument(
        "--signal",
        required=True,
        help="event schedule CSV/JSON or time_s,fraction CSV (wattflex control)",
    )
    parser.add_argument(
        "--budget-dir",
        required=True,
        help="folder on a filesystem every node sees (budget and load files)",
    )
    parser.add_argument(
        "--duration-s",
        type=finite_float(min=0, strict=True),
        help="how long to coordinate, > 0, at most a year (default: to the schedule's end + 2 periods)",
    )
    parser.add_argument(
        "--period-s",
        type=finite_float(min=MIN_PERIOD_S, max=MAX_PERIOD_S),
        default=section_defaults("control", "controller")["period_s"],
        help=f"coordination period, {MIN_PERIOD_S:g} to {MAX_PERIOD_S:g} s (default %(default)g s)",
    )
    parser.add_argument(
        "--partition",
        metavar="NAME[,NAME...]",
        default="",
        help="only the jobs running in these SLURM partitions (default: every partition's GPU jobs)",
    )
    parser.add_argument(
        "--basis",
        choices=("measured", "nominal"),
        default="measured",
        help="what fractions apply to: the cluster load before the event (default) or GPUs x max limit",
    )
    parser.add_argument(
        "--policy",
        choices=SPLIT_POLICIES,
        default="equal-weight",
        help="how the budget is split over (job, node) units (default equal-weight; the others "
        "need --curves)",
    )
    parser.add_argument(
        "--curves",
        metavar="RUNS",
        help="the campaign's runs.parquet (or .csv): each job's power -> "
        "tokens/s curve, per GPU, by its group",
    )
    parser.add_argument(
        "--job-map",
        metavar="JOB=GROUP,...",
        default="",
        help="campaign group of a job (SLURM job id or name); default: the group named like the "
        "job; a job with no curve gets an equal-weight share",
    )
    parser.add_argument(
        "--agent-policy",
        choices=[p for p in CONTROL_POLICIES if p not in THROUGHPUT_POLICIES],
        default="equal-weight",
        help="each agent's policy over its unit's GPUs (not one that needs a job's "
        "throughput: agents read none)",
    )
    parser.add_argument(
        "--gpu", choices=sorted(GPUS), default=DEFAULT_GPU, help="the GPUs' model (their limits)"
    )
    parser.add_argument(
        "--response-s",
        type=finite_float(min=0),
        default=section_defaults("control", "scenarios", "*")["response_s"],
        help="M&V deadline of events that name none (default %(default)g s)",
    )
    parser.add_argument(
        "--mv-out", metavar="DIR", help="write the M&V of every event here (cluster load)"
    )
    parser.add_argument(
        "--site",
        metavar="YAML",
        help="the site's electrical tree (feeds > PDUs > racks > nodes, "
        "limits in kW; docs/grid.md): every level held in every period, "
        "events or not, and reported in the M&V",
    )
    parser.add_argument(
        "--knob-choice",
        metavar="FILE",
        help="the knob menu's choice (CSV/JSON: job, knob): jobs "
        "to pause or requeue (held) at each event's start, resumed / released at its end",
    )
    add_log_level(parser)
    parser.add_argument(
        "--metrics-port",
        type=int,
        help="serve the site's Prometheus metrics on this port (0: a free one)",
    )
    parser.add_argument(
        "--metrics-addr",
        default="127.0.0.1",
        help="address of the site's metrics server (default 127.0.0.1)",
    )
    parser.add_argument(
        "--agent-metrics-addr",
        metavar="ADDR",
        help="each agent serves its metrics on a free port at this address of its node "
        "(0.0.0.0: all); their endpoints are listed in <budget-dir>/prometheus-targets.json "
        "for Prometheus's file_sd_configs (resources/prometheus/prometheus.yml)",
    )
    parser.add_argument(
        "--agent-state-dir",
        metavar="DIR",
        help="the agents' cap state folder, {node} replaced by the "
        "node name (default: each node's $WATTFLEX_STATE_DIR "
        "or /var/tmp/wattflex, what the epilog restores from)",
    )


def run(args: argparse.Namespace) -> int:
    """The command, its library log lines on stderr at ``--log-level``."""
    with command_logging(args.log_level):
        return follow(args)


def follow(args: argparse.Namespace) -> int:
    """The options read and checked (bad input refused before anything starts), then the
    service: :func:`wattflex.ops.services.coordinator.run_cluster_control`."""
    from wattflex.commands._outputs import check_not_in_measured_run
    from wattflex.commands.control import check_mv_dir
    from wattflex.ops.events import (
        MAX_SPAN_S,
        Schedule,
        check_schedule,
        read_schedule,
        signal_end_s,
    )
    from wattflex.ops.services.coordinator import ClusterControlSettings, run_cluster_control
    from wattflex.plots.grid import mv_figure

    split = cluster_split(args)  # bad input refused before anything starts
    site = read_site_option(args.site) if args.site else None
    knobs = None
    if args.knob_choice:
        from wattflex.ops.adapters.slurm_knobs import KnobPlan, read_choice

        try:
            knobs = KnobPlan(
                read_choice(args.knob_choice),
                GPUS[args.gpu].idle_w,
                log=lambda m: print(m, flush=True),
            )
        except (OSError, ValueError) as e:
            raise UserError(f"--knob-choice: {e}") from None
    partitions = name_list(args.partition)
    if args.partition and not partitions:
        raise UserError(f"--partition {args.partition!r}: name at least one partition")
    if shutil.which("squeue") is None or shutil.which("srun") is None:
        raise UserError(
            "squeue/srun not on PATH: cluster-control runs on a SLURM login or batch node"
        )
    gpu = GPUS[args.gpu]
    source = read_schedule(args.signal)
    if isinstance(source, Schedule):
        # overlapping or past events and bad rows are refused here; floors and ramps need the
        # GPUs, which the agents check on their nodes
        source = check_schedule(source, 0.0, 0.0, args.period_s).schedule
        end_s = signal_end_s(source, 0.0, 2 * args.period_s)
    else:
        end_s = source.duration_s
    duration = args.duration_s if args.duration_s is not None else end_s
    if duration > MAX_SPAN_S:  # its waits and the agents' would overflow time_t
        raise UserError(
            f"--duration-s {duration:g}: at most a year ({MAX_SPAN_S:g} s): give a shorter run"
        )
    out = Path(args.budget_dir)
    check_not_in_measured_run(out, "--budget-dir")
    out.mkdir(parents=True, exist_ok=True)
    if args.mv_out:
        check_mv_dir(Path(args.mv_out))
    return run_cluster_control(
        ClusterControlSettings(
            source=source,
            duration_s=duration,
            budget_dir=out,
            period_s=args.period_s,
            basis=args.basis,
            gpu=gpu,
            split=split,
            site=site,
            knobs=knobs,
            partitions=partitions,
            agent_policy=args.agent_policy,
            agent_state_dir=args.agent_state_dir,
            agent_metrics_addr=args.agent_metrics_addr,
            metrics_port=args.metrics_port,
            metrics_addr=args.metrics_addr,
            mv_out=args.mv_out,
            response_s=args.response_s,
            squeue_timeout_s=SQUEUE_TIMEOUT_S,
            options={k: v for k, v in vars(args).items() if not k.startswith("_")},
        ),
        mv_figure,
    )


def cluster_split(args: argparse.Namespace):
    """The split of ``--policy``, ``--curves`` and ``--job-map``, refused with one line if bad."""
    from wattflex.ops.adapters.slurm import ClusterSplit, read_group_curves

    job_group = {}
    for item in filter(None, (x.strip() for x in args.job_map.split(","))):
        job, sep, group = item.partition("=")
        if not (sep and job and group):
            raise UserError(
                f"--job-map {item!r}: expected JOB=GROUP (SLURM job id or name = campaign group)"
            )
        job_group[job] = group
    if get(args.policy).needs_curves and not args.curves:
        raise UserError(
            f"--policy {args.policy} splits on the jobs' curves: give --curves <campaign runs.parquet>"
        )
    try:
        curves = read_group_curves(args.curves) if args.curves else None
        return ClusterSplit(args.policy, curves, job_group)
    except (OSError, ValueError) as e:
        raise UserError(str(e)) from None
