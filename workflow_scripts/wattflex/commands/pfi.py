"""``wattflex pfi SWEEPS.csv -o OUT.csv``: the PFI of anyone's measured power-cap sweeps.

Input (CSV or parquet): one row per run with ``group, cap_w, power_w, throughput``
(throughput in any unit; extra columns are carried through when constant within a group).
In each group the highest ``cap_w`` is the uncapped reference. SEM columns, when present
(``power_w_sem`` and ``throughput_sem`` by default, or named with the options), give the
Monte Carlo CIs. Output: one row per group, ``group, n_caps, pfi_ratio, pfi_area,
pfi_elasticity, ci95_low, ci95_high, status`` first, then the robust PFI and diagnostics
(see ``wattflex.pfi``), with a provenance sidecar ``OUT.csv.meta.json``.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from wattflex.commands import finite_float
from wattflex.errors import UserError
from wattflex.pfi_tolerances import POWER_TOL, REL_TOL
from wattflex.schema import section_defaults

_PFI = section_defaults("pfi")  # the campaign's pfi: defaults (wattflex.pfi.pfi_table's)

NAME = "pfi"
HELP = "Power Flexibility Index (published + robust, with CI and diagnostics) of power-cap sweeps"
REQUIRED = ("group", "cap_w", "power_w", "throughput")
DEFAULT_SEM_COLS = ("power_w_sem", "throughput_sem")
SUMMARY_COLS = [
    "group",
    "n_caps",
    "pfi_ratio",
    "pfi_area",
    "pfi_elasticity",
    "ci95_low",
    "ci95_high",
    "status",
    "pfi_robust",
    "robust_status",
]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """``wattflex pfi``'s options on ``parser``: the sweep table, the output, the Monte Carlo
    resamples and seed, and the SEM columns.
    """
    parser.add_argument("sweeps", type=Path, help="sweep table (.csv, or .parquet/.pq)")
    parser.add_argument(
        "-o",
        "--output",
        type=Path,
        help="output CSV (with provenance sidecar); omitted: print a summary",
    )
    parser.add_argument(
        "--mc-samples",
        type=int,
        default=_PFI["mc_samples"],
        help=f"Monte Carlo resamples for the CIs (default {_PFI['mc_samples']}; 0 = none)",
    )
    parser.add_argument(
        "--seed", type=int, default=_PFI["seed"], help=f"random seed (default {_PFI['seed']})"
    )
    parser.add_argument(
        "--power-sem-col",
        help=f"column with the SEM of power_w (default {DEFAULT_SEM_COLS[0]} if present)",
    )
    parser.add_argument(
        "--throughput-sem-col",
        help=f"column with the SEM of throughput (default {DEFAULT_SEM_COLS[1]} if present)",
    )
    parser.add_argument(
        "--uncapped-cap-w",
        type=finite_float(min=0, strict=True),
        help="cap of an uncapped run (e.g. 700 on H200); groups below it are "
        "flagged missing_uncapped",
    )
    parser.add_argument(
        "--rel-tol",
        type=finite_float(min=0, max=1),
        help=f"relative noise level used where no SEM is given, 0 to 1 (default {REL_TOL:g})",
    )
    parser.add_argument(
        "--power-tol",
        type=finite_float(min=0, max=1),
        help="a cap binds if realised per-GPU power is within this fraction of it, 0 to 1 "
        f"(default {POWER_TOL:g})",
    )


def read_sweeps(path: Path):
    """The sweep table, read by the shared reader (``wattflex.ingest.reader``) so that each
    row keeps its file and line (``_where``); a missing column or no rows raise UserError."""
    from wattflex.ingest.reader import read_typed_table

    df = read_typed_table(path)
    columns = [c for c in df.columns if c != "_where"]
    missing = [c for c in REQUIRED if c not in columns]
    if missing:
        raise UserError(
            f"{path}: missing column(s) {', '.join(missing)} "
            f"(need {', '.join(REQUIRED)}; found {', '.join(columns)})"
        )
    df = df[~df[columns].isna().all(axis=1)]
    if df.empty:
        raise UserError(f"{path}: no data rows")
    return df


def run(args: argparse.Namespace) -> int:
    """Compute the PFI of every group of the sweep table and write it (with provenance) or print a
    summary. Returns the exit status, 0.

    Raises UserError for missing or non-numeric columns, one SEM column without the other, or a
    negative ``--mc-samples``.
    """
    from wattflex.commands._outputs import check_outputs
    from wattflex.ingest.reader import check_cells
    from wattflex.pfi import pfi_table
    from wattflex.provenance import provenance, write_csv

    if args.output is not None:
        check_outputs([args.output, f"{args.output}.meta.json"], [args.sweeps])
    df = read_sweeps(args.sweeps)
    sem_cols = [args.power_sem_col, args.throughput_sem_col]
    if sem_cols == [None, None] and all(c in df.columns for c in DEFAULT_SEM_COLS):
        sem_cols = list(DEFAULT_SEM_COLS)
    if (sem_cols[0] is None) != (sem_cols[1] is None):
        raise UserError("give both --power-sem-col and --throughput-sem-col, or neither")
    absent = [c for c in sem_cols if c is not None and c not in df.columns]
    if absent:
        raise UserError(f"{args.sweeps}: missing column(s) {', '.join(absent)}")
    if args.mc_samples < 0:
        raise UserError("--mc-samples must be >= 0")
    numeric = ["cap_w", "power_w", "throughput"] + [c for c in sem_cols if c is not None]
    if "gpus" in df.columns:
        numeric.append("gpus")
    check_cells(df, numeric=numeric, required=REQUIRED)  # every bad row, by file and line

    params = dict(
        power_sem_col=sem_cols[0],
        throughput_sem_col=sem_cols[1],
        uncapped_cap_w=args.uncapped_cap_w,
        mc_samples=args.mc_samples,
        seed=args.seed,
        rel_tol=REL_TOL if args.rel_tol is None else args.rel_tol,
        power_tol=POWER_TOL if args.power_tol is None else args.power_tol,
    )
    dropped = dropped_rows(df, sem_cols)
    if len(dropped) == len(df):  # as ingest: nothing left to compute is an error, not NaN rows
        from wattflex.ingest.reader import describe_bad_rows

        raise UserError(
            f"{args.sweeps}: no valid row: " + " ".join(describe_bad_rows(dropped).split())
        )
    # A cap the ingest rules refuse (kW, mW) leaves its row out here too (status invalid_values).
    df.loc[
        df["_where"].isin({d["where"] for d in dropped if "cap_w = " in d["reason"]}), "cap_w"
    ] = float("nan")
    # a line on stderr every few seconds on a long table (stdout may be the summary or a pipe)
    table = pfi_table(
        df.drop(columns="_where"), **params, progress=lambda msg: print(msg, file=sys.stderr)
    )
    counts = table["status"].value_counts()
    summary = ", ".join(f"{k} {v}" for k, v in counts.items())
    if args.output is None:
        import pandas as pd

        with pd.option_context(
            "display.width", 200, "display.max_rows", None, "display.float_format", "{:.3f}".format
        ):
            print(table[SUMMARY_COLS].to_string(index=False))
    else:
        write_csv(
            table,
            args.output,
            provenance(params=params, inputs=[args.sweeps]),
            command="wattflex pfi",
        )
        print(f"wrote {len(table)} group(s) to {args.output} (status: {summary})")
    if dropped:
        from wattflex.ingest.reader import describe_bad_rows

        print(f"note: left out {describe_bad_rows(dropped, ' of the PFI (status invalid_values)')}")
    return 0


def dropped_rows(df, sem_cols) -> list[dict]:
    """The rows ``pfi_table`` leaves out (status ``invalid_values``), by file and line and why:
    the rules ingest rejects rows by (``wattflex.ingest.reader.value_problems``)."""
    from wattflex.ingest.reader import value_problems

    return [
        {"where": where, "reason": "; ".join(r)}
        for where, r in zip(df["_where"], value_problems(df, sem_cols))
        if r
    ]
