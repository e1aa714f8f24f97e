"""``wattflex ingest FORMAT PATH -o runs.parquet``: measured sweeps -> the runs table.

The same reader the workflow uses for ``source: ingest`` campaigns (``wattflex.ingest.sources``):
a sweep table (CSV/parquet with ``group, cap_w, power_w, throughput``), the Zeus NSDI'23
or Perseus SOSP'24 trace files, or a manifest of DCGM exporter / ``dcgmi dmon`` captures
with step logs. Bad rows are reported by file and line; ``--on-bad-rows skip`` leaves them
out and writes them to ``--rejected``. ``--pfi`` also writes the PFI table (published and
robust PFI, status per group).
"""

from __future__ import annotations

import argparse
from pathlib import Path

NAME = "ingest"
HELP = (
    "Read measured sweeps (sweep table, Zeus/Perseus traces, DCGM captures) into runs.parquet rows"
)
FORMATS = ("sweep-table", "zeus-nsdi23", "perseus-sosp24", "dcgm-runs")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """``wattflex ingest``'s options on ``parser``: the format and path, the runs table to write, the
    bad-row policy and the optional rejected-rows and PFI tables.
    """
    parser.add_argument("format", choices=FORMATS, help="what PATH holds")
    parser.add_argument(
        "path", type=Path, help="a file, or a folder of them (dcgm-runs: the manifest CSV)"
    )
    parser.add_argument(
        "-o", "--output", type=Path, required=True, help="runs table (.parquet or .csv)"
    )
    parser.add_argument(
        "--on-bad-rows",
        choices=("error", "skip"),
        default="error",
        help="error (default): stop on any bad row; skip: leave bad rows out, list them",
    )
    parser.add_argument("--rejected", type=Path, help="CSV of the rows left out (where, reason)")
    parser.add_argument(
        "--throughput-unit", help="unit of a sweep table's throughput column (for the record)"
    )
    parser.add_argument(
        "--telemetry-format",
        choices=("dcgm-exporter", "dcgmi-dmon"),
        help="dcgm-runs: capture format where the manifest has no telemetry_format column",
    )
    parser.add_argument(
        "--pfi", type=Path, help="also write the PFI table (CSV) of the ingested runs"
    )


def run(args: argparse.Namespace) -> int:
    """Read the measured sweeps into a runs table (and the optional rejected-rows and PFI tables),
    each with its provenance; the outputs are checked before anything is written. Returns the
    exit status, 0.

    Raises UserError (via the ingest errors) for unreadable input or bad rows under
    ``--on-bad-rows error``.
    """
    from wattflex.commands._outputs import check_outputs
    from wattflex.ingest.sources import ingest
    from wattflex.provenance import provenance, write_csv, write_parquet

    outputs = [args.output] + [
        f"{p}.meta.json"
        for p in (args.output, args.rejected, args.pfi)
        if p is not None and p.suffix.lower() not in (".parquet", ".pq")
    ]
    outputs += [args.rejected, args.pfi]
    inputs = [args.path] + (
        sorted(p for p in args.path.rglob("*") if p.is_file()) if args.path.is_dir() else []
    )
    check_outputs(outputs, inputs)
    result = ingest(
        args.format,
        args.path,
        on_bad_rows=args.on_bad_rows,
        throughput_unit=args.throughput_unit,
        telemetry_format=args.telemetry_format,
    )
    check_outputs(outputs, result.inputs)  # a manifest's capture files may lie elsewhere
    runs = result.runs
    prov = provenance(
        params=vars(args), inputs=result.inputs, backend="ingest", ingest_format=args.format
    )
    if args.output.suffix.lower() in (".parquet", ".pq"):
        write_parquet(runs, args.output, prov)
    else:
        write_csv(runs, args.output, prov)
    if args.rejected is not None:
        write_csv(result.rejected, args.rejected, prov)
    print(
        f"wrote {len(runs)} run(s) of {runs['group'].nunique()} group(s) to {args.output}; "
        f"{len(result.rejected)} row(s) rejected"
    )
    for where, reason in result.rejected.head(20).itertuples(index=False):
        print(f"  rejected {where}: {reason}")
    for note in result.notes:
        print(f"  note: {note}")
    if args.pfi is not None:
        from wattflex.pfi import pfi_table

        table = pfi_table(
            runs,
            throughput_col="tokens_per_s",
            power_sem_col="power_w_sem",
            throughput_sem_col="tokens_per_s_sem",
        )
        write_csv(table, args.pfi, prov)
        counts = ", ".join(f"{k} {v}" for k, v in table["status"].value_counts().items())
        print(f"wrote the PFI of {len(table)} group(s) to {args.pfi} (status: {counts})")
    return 0
