"""``wattflex allocate``: split a power cut across the jobs of one workload."""

from __future__ import annotations

import argparse
import sys

from wattflex.commands import finite_float, read_site_option, whole_number
from wattflex.policies import POLICIES
from wattflex.schema import section_defaults

_ALLOCATION = section_defaults("allocation")  # the campaign's allocation: defaults

NAME = "allocate"
HELP = "Split a cluster power cut across jobs (equal-weight, PFI-aware, ..., exact oracle)"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """``wattflex allocate``'s options on ``parser``: the curve table, ``--cut`` or ``--budget-w``,
    the policy and its parameters, ``--site`` and the output.
    """
    parser.add_argument(
        "curves",
        help="CSV (or parquet): job,power_w,throughput, one row per measured point "
        "(highest power = uncapped); optional cap_w per point and per-job pfi, pfi_measured, "
        "gpus, max_slowdown, cluster, dram_copy_product",
    )
    how = parser.add_mutually_exclusive_group(required=True)
    how.add_argument(
        "--cut", type=float, help="fraction of the jobs' uncapped power to shed, e.g. 0.3"
    )
    how.add_argument("--budget-w", type=float, help="cluster power budget in W instead of --cut")
    parser.add_argument(
        "--policy", choices=POLICIES, default="oracle", help="allocation policy (default: oracle)"
    )
    parser.add_argument(
        "--moe-ft-share",
        type=finite_float(min=0, strict=True),
        default=_ALLOCATION["moe_ft_share"],
        help=f"share multiplier of MoE fine-tuning jobs for moe-ft-weighted "
        f"(default: {_ALLOCATION['moe_ft_share']:g})",
    )
    parser.add_argument(
        "--curve-nodes",
        type=whole_number(min=2, max=50),
        default=_ALLOCATION["curve_nodes"],
        help=f"points of each predicted curve for curve-aware (default: {_ALLOCATION['curve_nodes']})",
    )
    parser.add_argument(
        "--site",
        metavar="YAML",
        help="the site's electrical tree (feeds > PDUs > racks > nodes, limits in kW; "
        "docs/grid.md), as cluster-control reads it: every level held besides the budget; "
        "each job's node from a node column of CURVES",
    )
    parser.add_argument(
        "-o",
        "--output",
        help="write job,power_w,throughput[,cap_w] here and the totals to "
        "OUTPUT.totals.json (default: CSV on stdout)",
    )


def read_curves(path: str):
    """The curve points, a CSV or parquet table as pandas types it, except a CSV's job ids
    (``job``, a runs table's ``group``, a jobs table's ``clock_group``) and node names
    (``node``), read as text: ``01`` and ``1`` are two jobs, and ``007`` keeps its zeros.
    A clear error when the file is missing or unreadable. Bad values are named by line in
    ``allocate_table`` (``source=``)."""
    import pandas as pd

    from wattflex.ingest.reader import (
        ID_COLUMNS,
        check_input_file,
        check_single_values,
        ids_as_text,
        strip_columns,
    )

    check_input_file(path)
    if path.endswith((".parquet", ".pq")):
        try:
            points = pd.read_parquet(path)
        except (OSError, ValueError) as exc:
            raise ValueError(
                f"{path}: not a readable parquet file ({(str(exc) or repr(exc)).splitlines()[0]})"
            ) from None
    else:
        try:
            points = pd.read_csv(path, dtype=dict.fromkeys(ID_COLUMNS, str))
        except (pd.errors.ParserError, UnicodeDecodeError, pd.errors.EmptyDataError) as exc:
            raise ValueError(f"{path}: not a readable CSV ({exc})") from None
    points = strip_columns(points, path)
    ids_as_text(points)  # a parquet's integer ids too
    check_single_values(points, path)
    return points


def run(args: argparse.Namespace) -> int:
    """Allocate the cut across the curve table's jobs and print (or write, with its provenance
    sidecar and totals) the per-job caps. Returns the exit status, 0.

    Raises UserError for a bad curve table, site file or output path (one line, nothing written).
    """
    from wattflex.allocation.allocator import allocate_table
    from wattflex.commands._outputs import check_outputs
    from wattflex.provenance import csv_files, json_file, provenance, write_together

    if args.output:  # never write over the input, a link, a folder or a device
        check_outputs(
            [args.output, f"{args.output}.meta.json", f"{args.output}.totals.json"], [args.curves]
        )
    site = read_site_option(args.site) if args.site else None
    points = read_curves(args.curves)
    out, totals = allocate_table(
        points,
        args.policy,
        cut=args.cut,
        budget_w=args.budget_w,
        moe_ft_share=args.moe_ft_share,
        curve_nodes=args.curve_nodes,
        source=args.curves,
        log=lambda msg: print(msg, file=sys.stderr),
        site=site,
    )
    kept = (
        totals["total_throughput"] / totals["uncapped_throughput"]
        if totals["uncapped_throughput"]
        else float("nan")
    )
    best = (
        totals["oracle_throughput"] / totals["uncapped_throughput"]
        if totals["uncapped_throughput"]
        else float("nan")
    )
    print(
        f"{totals['n_jobs']} jobs, budget {totals['budget_w']:.1f} W ({totals['cut']:.1%} below "
        f"{totals['uncapped_power_w']:.1f} W uncapped): {args.policy} keeps {kept:.2%} of throughput "
        f"(oracle {best:.2%}), {totals['total_power_w']:.1f} W allocated",
        file=sys.stderr,
    )
    for name, level in totals.get("levels", {}).items():
        print(
            f"  {name}: {level['load_w']:.1f} W of its {level['limit_w']:.1f} W limit",
            file=sys.stderr,
        )
    if not args.output:
        out.to_csv(sys.stdout, index=False)
        return 0
    params = {k: v for k, v in vars(args).items() if not k.startswith("_")}
    prov = provenance(params=params, inputs=[args.curves])
    # the table, its sidecar and its totals appear together or not at all
    write_together(
        [
            *csv_files(out, args.output, prov, policy=args.policy),
            json_file({"totals": totals}, f"{args.output}.totals.json", prov),
        ]
    )
    print(f"wrote {args.output} and {args.output}.totals.json", file=sys.stderr)
    return 0
