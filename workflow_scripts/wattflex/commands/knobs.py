"""``wattflex knobs``: the cheapest knob per job for one grid event, as ``cluster-control
--knob-choice`` reads it.

From the campaign's measured curves (``--curves runs.parquet``: each group's cap curve, and
the clock curve of ``knob: clock`` groups) and the jobs running (``--jobs``: job, group,
since_checkpoint_s, ...; :data:`wattflex.allocation.knobs.JOB_TABLE_OPTIONAL`), the exact
MILP of :func:`wattflex.allocation.knobs.choose` picks cap, clock, pause or requeue for each
job so that the event's depth is shed at the fewest tokens lost. The output has one row per
job: ``job, knob, power_w, shed_kw, tokens_lost, clock_mhz, why``. ``why`` prices each option
in tokens per kWh shed, the taken one starred. ``--site`` (the site file ``allocate`` and
``cluster-control`` read): every feed, PDU, rack and node held too, each job placed by the
``node`` column of ``--jobs``; each level's load and limit printed and written to the
sidecar's ``levels``.
"""

from __future__ import annotations

import argparse
import sys

from wattflex.commands import finite_float, name_list, read_site_option
from wattflex.gpus import DEFAULT_GPU, GPUS

NAME = "knobs"
HELP = (
    "Choose the cheapest knob per job (cap, clock, pause, requeue) for a grid event, "
    "from the measured curves: the CSV cluster-control --knob-choice reads"
)
KNOB_NAMES = ("cap", "clock", "pause", "requeue")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """``wattflex knobs``'s options on ``parser``: the runs, the running jobs, the event's depth
    (``--depth-kw`` or ``--target-kw``) and duration, the knobs allowed, ``--site`` and the output.
    """
    parser.add_argument(
        "--curves",
        "--runs",
        dest="curves",
        metavar="RUNS",
        required=True,
        help="the campaign's runs.parquet (or .csv): each group's power -> tokens/s points, "
        "per cap, and per clock for knob: clock groups",
    )
    parser.add_argument(
        "--jobs",
        metavar="CSV",
        required=True,
        help="the jobs running, one row each: job (SLURM job id or name), group, "
        "since_checkpoint_s; optional gpus, clock_group, restart_s, checkpoint_write_s, "
        "max_pause_s, requeue_residual_w, idle_w",
    )
    depth = parser.add_mutually_exclusive_group(required=True)
    depth.add_argument(
        "--depth-kw",
        type=finite_float(min=0, strict=True),
        help="kW to shed below the jobs' uncapped power",
    )
    depth.add_argument(
        "--depth-frac",
        type=finite_float(min=0, max=1, strict=True),
        help="fraction of the jobs' uncapped power to shed, e.g. 0.6",
    )
    parser.add_argument(
        "--duration-s",
        type=finite_float(min=0, strict=True),
        required=True,
        help="how long the event lasts (s)",
    )
    parser.add_argument(
        "--notice-s",
        type=finite_float(min=0),
        default=0.0,
        help="warning before the event starts (s; a requeue with time to checkpoint loses "
        "less; default 0)",
    )
    parser.add_argument(
        "--plan",
        metavar="CSV",
        help="the resource plan (tables/resource_plan.csv: group, startup_s, "
        "checkpoint_write_s) for the jobs' restart and checkpoint times",
    )
    parser.add_argument(
        "--knobs",
        default=",".join(KNOB_NAMES),
        help=f"the knobs allowed, comma-separated (default: {','.join(KNOB_NAMES)})",
    )
    parser.add_argument(
        "--gpu",
        choices=sorted(GPUS),
        default=DEFAULT_GPU,
        help="the GPUs' model (the idle power of a paused job's GPUs)",
    )
    parser.add_argument(
        "--site",
        metavar="YAML",
        help="the site's electrical tree (feeds > PDUs > racks > nodes, limits in kW; "
        "docs/grid.md), as allocate and cluster-control read it: every level held besides "
        "the event; each job's node from a node column of --jobs",
    )
    parser.add_argument("-o", "--output", help="write the choice here (default: CSV on stdout)")


def run(args: argparse.Namespace) -> int:
    """Choose the cheapest knob per job that meets the event and print (or write, with provenance)
    the choice table. Returns the exit status, 0.

    Raises UserError for unknown knob names, bad runs/jobs tables, or when no choice meets the
    event.
    """
    from wattflex.allocation import knobs as kn
    from wattflex.commands._outputs import check_outputs
    from wattflex.commands.allocate import read_curves
    from wattflex.errors import UserError
    from wattflex.provenance import csv_files, provenance, write_together

    allowed = name_list(args.knobs)
    unknown = sorted(set(allowed) - set(KNOB_NAMES))
    if unknown or not allowed:
        raise UserError(f"--knobs {args.knobs!r}: name one or more of {', '.join(KNOB_NAMES)}")
    inputs = [args.curves, args.jobs, args.plan, args.site]
    if args.output:
        check_outputs([args.output, f"{args.output}.meta.json"], inputs)
    site = read_site_option(args.site) if args.site else None
    try:
        table = read_curves(args.jobs)
        jobs = kn.jobs_from_runs(
            read_curves(args.curves),
            table,
            GPUS[args.gpu].idle_w,
            read_curves(args.plan) if args.plan else None,
        )
    except ValueError as e:
        raise UserError(str(e)) from None
    levels = site_levels(site, table) if site is not None else None
    site_w = sum(j.ceiling_w for j in jobs)
    depth_w = args.depth_kw * 1e3 if args.depth_kw is not None else args.depth_frac * site_w
    event = kn.Event(depth_w, args.duration_s, args.notice_s)
    choice = kn.choose(jobs, event, allowed, levels=levels)
    if not choice.feasible:
        raise UserError(f"no choice meets the event: {choice.reason}")
    counts = ", ".join(f"{k} {v}" for k, v in sorted(choice.counts().items()))
    print(
        f"{len(jobs)} job(s), {site_w / 1e3:.3g} kW uncapped: shed {depth_w / 1e3:.3g} kW for "
        f"{args.duration_s:g} s ({counts}), {choice.tokens_lost:.4g} tokens lost",
        file=sys.stderr,
    )
    for name, level in choice.levels.items():
        print(
            f"  {name}: {level['load_w']:.1f} W of its {level['limit_w']:.1f} W limit",
            file=sys.stderr,
        )
    if not args.output:
        choice.table.to_csv(sys.stdout, index=False)
        return 0
    params = {k: v for k, v in vars(args).items() if not k.startswith("_")}
    prov = provenance(params=params, inputs=[p for p in inputs if p])
    extra = {"levels": choice.levels} if site is not None else {}
    write_together(csv_files(choice.table, args.output, prov, **extra))
    print(f"wrote {args.output}", file=sys.stderr)
    return 0


def site_levels(site, table):
    """The site's levels over the jobs of ``table`` (its rows in order), each placed by its
    ``node``; a job on a node the site does not name is held by the site's limit only (said)."""
    from wattflex.errors import UserError

    if "node" not in table:
        raise UserError("--site needs a node column in --jobs: the node each job runs on")
    empty = table["node"].isna() | table["node"].astype(str).str.strip().eq("")
    if empty.any():
        raise UserError(f"--site: job {table['job'][empty].iloc[0]} names no node in --jobs")
    nodes = [str(n).strip() for n in table["node"]]
    note = site.unplaced_note(nodes)
    if note:
        print(note, file=sys.stderr)
    return site.laminar(nodes)
