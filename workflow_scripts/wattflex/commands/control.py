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
from dataclasses import fields
from pathlib import Path
from typing import TYPE_CHECKING

from wattflex.commands import RenamedOption, add_log_level, command_logging
from wattflex.errors import UserError
from wattflex.policies import CONTROL_POLICIES, THROUGHPUT_POLICIES
from wattflex.schema import section_defaults

if TYPE_CHECKING:  # the service (numpy, pandas) is imported when the command runs, not for --help
    from wattflex.ops.services.node_agent import NodeAgentSettings

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
    """The options of ``wattflex control``, in its help's groups."""
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


def run(args: argparse.Namespace) -> int:
    """The command, its library log lines on stderr at ``--log-level``: the node agent
    (:func:`wattflex.ops.services.node_agent.run_node_agent`) on the options' settings."""
    from wattflex.ops.services.node_agent import run_node_agent
    from wattflex.plots.grid import mv_figure  # figures only once a command runs (test_layout)

    with command_logging(args.log_level):
        return run_node_agent(agent_settings(args), mv_figure=mv_figure)


def agent_settings(args: argparse.Namespace) -> NodeAgentSettings:
    """The node agent's settings from the options, bad ones refused in one line before any GPU
    is read or set (and the predictor model read, with ``--model``)."""
    from wattflex.commands.predict import load_model
    from wattflex.ops.events import MAX_SPAN_S
    from wattflex.ops.services.node_agent import NodeAgentSettings
    from wattflex.runs.devices.caps import default_state_dir

    check_args(args, MAX_SPAN_S)
    indices = [parse_gpus(j) for j in args.job] if args.job else None
    state_dir = Path(args.state_dir) if args.state_dir else default_state_dir()
    if not args.dry_run:
        if args.cap_control == "command":
            check_cap_command(args.cap_command)
        check_state_dir(state_dir)
        if args.mv_out:
            check_mv_dir(Path(args.mv_out))
    taken = {"jobs", "state_dir", "model", "params"}
    return NodeAgentSettings(
        jobs=indices,
        state_dir=state_dir,
        model=load_model(args.model) if args.model else None,
        params={k: v for k, v in vars(args).items() if not k.startswith("_")},
        **{f.name: getattr(args, f.name) for f in fields(NodeAgentSettings) if f.name not in taken},
    )


def check_mv_dir(out: Path) -> None:
    """The M&V folder must be (or become) a folder we can write; refused before any cap is set."""
    from wattflex.commands._outputs import check_not_in_measured_run, check_outputs
    from wattflex.ops.services.mv import mv_png_name

    if out.exists() and not out.is_dir():
        raise UserError(f"--mv-out {out}: is a file, not a folder")
    check_not_in_measured_run(out, "--mv-out")  # before the folder is made
    out.mkdir(parents=True, exist_ok=True)
    check_outputs(
        [out / "mv.json", out / "mv_intervals.csv", out / "timeseries.csv", out / mv_png_name(0)],
        [],
    )
