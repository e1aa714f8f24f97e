"""``wattflex offer``: the flexibility a programme enrolment asks for, from PFI curves.

Reads the jobs' measured power -> throughput curves: a campaign's ``runs.parquet`` (one job
per sweep group; default: the campaign of ``--configfile``, ``results/<campaign>/runs.parquet``)
or a curve table ``job,power_w,throughput`` (``wattflex allocate``'s input). ``--job
GROUP=N`` says which jobs run (or are planned) and how many of each; default: one of each.
Prints, per job and in total, the kW sheddable while each job keeps at least 90 / 75 / 50 %
of its throughput (``--loss``), held for ``--hours``: kWh and tokens it costs; ``-o``
writes that table (CSV + sidecar). The figure of the curve behind it is the workflow's
``results/<campaign>/offer/offer.png`` (rule ``offer``; only ``wattflex.plots`` draws).

``--statement DIR`` writes the site's flexibility statement instead (``wattflex.ops.services.statement``,
what the workflow's rule ``flexibility_statement`` writes, without its figure): from a
``runs.parquet``, the ``statement:``, ``allocation:`` and ``control.cluster`` sections of
``--configfile``, and ``--mv`` for the response time and ramp rate: the control study's
``control/mv.csv`` or a real run's ``mv.json`` or ``mv_intervals.csv``
(``wattflex control`` / ``cluster-control --mv-out``; ``wattflex.ops.services.mv.read_mv_records``).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from wattflex.commands import RenamedOption, finite_float

HOURS_IN_A_YEAR = 8784  # a leap year: no enrolment is held longer, and kWh and tokens stay finite
NAME = "offer"
HELP = "kW the jobs can shed for how long at which throughput cost (a demand-response offer), from PFI curves"
MAX_COPIES = 100_000  # --job GROUP=N: one table row per copy; more is a typo, not a cluster


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """``wattflex offer``'s options on ``parser``: the curves (default: the campaign's runs), the
    jobs and their counts, the throughput losses, the hours held, the statement and the output.
    """
    parser.add_argument(
        "curves",
        nargs="?",
        help="runs.parquet of a campaign, or a CSV/parquet job,power_w,throughput "
        "(default: results/<campaign of --configfile>/runs.parquet)",
    )
    parser.add_argument(
        "--configfile",
        "--config",
        dest="config",
        action=RenamedOption,
        old=("--config",),
        default="config/config.yaml",
        help="config naming the default campaign (--config is the old spelling)",
    )
    parser.add_argument(
        "--job",
        action="append",
        default=[],
        metavar="GROUP[=N]",
        help="a job (sweep group or curve job id) that runs, N of them (repeat; default: one of each)",
    )
    parser.add_argument(
        "--loss",
        action="append",
        type=float,
        metavar="FRACTION",
        help="throughput loss levels, fractions (repeat; default 0.10 0.25 0.50)",
    )
    parser.add_argument(
        "--hours",
        type=finite_float(min=0, max=HOURS_IN_A_YEAR, strict=True),
        default=4.0,
        help=f"how long the offer is held, at most {HOURS_IN_A_YEAR} (a leap year; default 4 h)",
    )
    parser.add_argument(
        "-o", "--output", help="write the offer table here (CSV, with a .meta.json sidecar)"
    )
    parser.add_argument(
        "--statement",
        metavar="DIR",
        help="write the site's flexibility statement into DIR instead (needs a runs.parquet)",
    )
    parser.add_argument(
        "--mv",
        metavar="MV",
        help="--statement: M&V records of controlled events: the control study's control/mv.csv, "
        "or a real run's mv.json or mv_intervals.csv (wattflex control / cluster-control --mv-out)",
    )
    parser.add_argument(
        "--plan",
        metavar="PLAN.csv",
        help="--statement: the resource plan (tables/resource_plan.csv), "
        "for the knob menu's deep events",
    )


def default_curves(config: str) -> str:
    """The default curve table: ``results/<campaign>/runs.parquet`` of the campaign that ``config``
    names, as a path string.

    Raises UserError when the config cannot be read or that runs.parquet is not there yet.
    """
    from wattflex.config import load_config
    from wattflex.errors import UserError
    from wattflex.ingest.reader import MAX_DOC_BYTES, IngestError, check_input_file

    try:
        check_input_file(config, "--configfile", MAX_DOC_BYTES)
    except IngestError as exc:
        raise UserError(f"{exc}; or name the runs.parquet or curve table") from None
    campaign = load_config(config)["campaign"]
    path = Path("results") / campaign / "runs.parquet"
    if not path.is_file():
        raise UserError(
            f"{path}: not there (campaign {campaign!r} of {config}); run `snakemake --cores all "
            f"{path}` first, or name a curve table"
        )
    return str(path)


def job_points(points, jobs: list[str]):
    """``(job ids, power_w, throughput)`` of the chosen jobs, ``GROUP=N`` repeated N times."""
    from wattflex.errors import UserError

    if "group" in points.columns and "tokens_per_s" in points.columns:
        points = points.rename(columns={"group": "job", "tokens_per_s": "throughput"})
    missing = {"job", "power_w", "throughput"} - set(points.columns)
    if missing:
        raise UserError(
            f"curves: missing column(s) {', '.join(sorted(missing))} (need job,power_w,throughput "
            f"or a runs.parquet with group,power_w,tokens_per_s)"
        )
    points = points.assign(job=points["job"].astype(str))
    known = list(dict.fromkeys(points["job"]))
    chosen: list[tuple[str, int]] = []
    for spec in jobs or known:
        name, _, n = spec.partition("=")
        if name not in known:
            raise UserError(
                f"--job {spec!r}: no curve for {name!r} (known: {', '.join(known[:6])}"
                f"{', ...' if len(known) > 6 else ''})"
            )
        if n and not (n.isdigit() and 0 < int(n) <= MAX_COPIES):
            raise UserError(
                f"--job {spec!r}: N must be a whole number > 0 and at most {MAX_COPIES:,}"
            )
        chosen.append((name, int(n or 1)))
    return points, chosen


STATEMENT_FILES = {
    "shed": "shed.csv",
    "events": "events.csv",
    "calendar": "calendar.csv",
    "response": "response.csv",
    "notice": "notice.csv",
    "baselines": "baselines.csv",
    "baseline_days": "baseline_days.csv",
    "knobs": "knobs.csv",
    "knob_jobs": "knob_jobs.csv",
    "program": "openadr3_program.json",
    "report": "openadr3_report.json",
    "page": "statement.md",
}


def write_statement(args: argparse.Namespace, path: str) -> int:
    """``--statement DIR``: the flexibility statement of the runs at ``path``."""
    from wattflex.commands._outputs import check_outputs
    from wattflex.config import load_config
    from wattflex.errors import UserError
    from wattflex.ingest.reader import check_input_file
    from wattflex.ops.clustersim import ClusterConfig
    from wattflex.ops.services.mv import read_mv_records
    from wattflex.ops.services.statement import StatementSettings, build_statement, statement_files
    from wattflex.provenance import provenance, read_csv, read_parquet, write_together

    if not str(path).endswith(".parquet"):
        raise UserError(f"--statement needs a campaign's runs.parquet (got {path})")
    cfg = load_config(args.config)
    out = Path(args.statement)
    paths = {k: str(out / name) for k, name in STATEMENT_FILES.items()}
    inputs = [path] + [p for p in (args.mv, args.plan) if p]
    check_outputs([p for v in paths.values() for p in (v, f"{v}.meta.json")], inputs)
    for opt, given in (("--mv", args.mv), ("--plan", args.plan)):
        if given:
            check_input_file(given, opt)
    runs = read_parquet(path)
    missing = {"group", "cap_w", "power_w", "tokens_per_s", "gpus", "task"} - set(runs.columns)
    if missing:
        raise UserError(f"{path}: not a runs table (missing {', '.join(sorted(missing))})")
    settings = StatementSettings.from_config(cfg["statement"], cfg["allocation"])
    try:
        mv = read_mv_records(args.mv) if args.mv else None
    except ValueError as exc:
        raise UserError(f"--mv {exc}") from None
    stmt = build_statement(
        runs,
        mv,
        settings,
        ClusterConfig.from_dict(cfg["control"]["cluster"]),
        cfg["campaign"],
        cfg["allocation"]["groups_set"],
        read_csv(args.plan) if args.plan else None,
    )
    out.mkdir(parents=True, exist_ok=True)
    prov = provenance(
        params={"statement": cfg["statement"], "config": args.config},
        inputs=inputs,
        backend=stmt.backend,
    )
    write_together(statement_files(stmt, paths, prov))
    print("\n".join(stmt.lines))
    print(f"wrote {out}/ ({', '.join(STATEMENT_FILES.values())})", file=sys.stderr)
    return 0


def run(args: argparse.Namespace) -> int:
    """Print (and with ``-o`` write, with provenance) the kW each job set can shed at each
    throughput loss, held ``--hours``; or write the flexibility statement. Returns the exit
    status, 0.

    Raises UserError for a loss outside (0, 1), or curves where every job has a single point.
    """
    import numpy as np

    from wattflex.allocation.curves import check_points, curves_from_points
    from wattflex.commands._outputs import check_outputs
    from wattflex.commands.allocate import read_curves
    from wattflex.errors import UserError
    from wattflex.ops.services.offer import LOSSES, offer_table
    from wattflex.provenance import csv_files, provenance, write_together

    losses = tuple(args.loss) if args.loss else LOSSES
    if not all(0 < x < 1 for x in losses):
        percent = [x for x in losses if 1 < x <= 100]
        hint = f" (a percentage? {percent[0]:g}% is {percent[0] / 100:g})" if percent else ""
        raise UserError(
            f"--loss {', '.join(f'{x:g}' for x in losses)}: each must be a fraction in (0, 1)"
            + hint
        )
    path = args.curves or default_curves(args.config)
    if args.statement:
        return write_statement(args, path)
    check_outputs(
        [p for p in (args.output, args.output and f"{args.output}.meta.json") if p], [path]
    )
    points, chosen = job_points(read_curves(path), args.job)
    check_points(points[["job", "power_w", "throughput"]], source=path, single_ok=True)
    caps = points["cap_w"] if "cap_w" in points.columns else None  # a job at one cap cannot shed
    ids, curves = curves_from_points(points["job"], points["power_w"], points["throughput"], caps)
    flat = curves.floor_w >= curves.ceiling_w
    if flat.all():  # an offer of 0 kW whatever the loss: no number to give a grid operator
        raise UserError(
            f"{path}: every job has a single measured point ({', '.join(map(repr, ids[:3]))}"
            f"{', ...' if len(ids) > 3 else ''}): a job sheds power only along a curve of at "
            "least two caps; measure more caps (wattflex pfi's sweep) and offer again"
        )
    index = {j: i for i, j in enumerate(ids)}
    rows = np.array([index[name] for name, n in chosen for _ in range(n)])
    names = [name if n == 1 else f"{name}#{k + 1}" for name, n in chosen for k in range(n)]
    curves = curves.take(rows)
    table = offer_table(names, curves, losses, args.hours)
    backend = (
        ",".join(sorted(map(str, points["backend"].unique())))
        if "backend" in points.columns
        else "measured"
    )
    with __import__("pandas").option_context("display.width", 200, "display.max_columns", 20):
        print(f"offer from {path} ({backend}), {len(names)} job(s), held {args.hours:g} h")
        print(table.to_string(index=False, float_format=lambda v: f"{v:.4g}"))
    prov = provenance(
        params={k: v for k, v in vars(args).items() if not k.startswith("_")}, inputs=[path]
    )
    files = (
        csv_files(table, args.output, prov, hours=args.hours, losses=list(losses))
        if args.output
        else []
    )
    if files:
        write_together(files)
        print(f"wrote {args.output}", file=sys.stderr)
    return 0
