"""``wattflex stats``: Kruskal–Wallis and Dunn–Holm on any table of per-group values."""

from __future__ import annotations

import argparse
import sys

from wattflex.commands import name_list
from wattflex.errors import UserError
from wattflex.schema import section_defaults

_STATS = section_defaults("stats")  # the campaign's stats: defaults (kruskal_dunn's)

NAME = "stats"
HELP = "Kruskal-Wallis across clusters, then Dunn's test (Holm) on every pair, from a PFI table"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """``wattflex stats``'s options on ``parser``: the table, its value and group columns, the
    cluster order, the p-value adjustment, alpha and the output.
    """
    parser.add_argument("table", help="CSV or parquet with one row per group (e.g. a PFI table)")
    parser.add_argument(
        "--value-col", default="pfi_ratio", help="numeric column to compare (default: pfi_ratio)"
    )
    parser.add_argument(
        "--group-col", default="cluster", help="column naming each row's cluster (default: cluster)"
    )
    parser.add_argument(
        "--order",
        default=",".join(_STATS["cluster_order"]),
        help="comma-separated cluster order for the pairs (others follow; default: %(default)s)",
    )
    parser.add_argument(
        "--p-adjust",
        default=_STATS["p_adjust"],
        help="multiple-comparison method of statsmodels (default: %(default)s)",
    )
    parser.add_argument(
        "--alpha",
        type=float,
        default=_STATS["alpha"],
        help="significance level (default: %(default)s)",
    )
    parser.add_argument("-o", "--output", help="write the JSON here (default: print it)")


def check_values(table, value_col: str, path: str, id_col: str = "group") -> None:
    """Refuse non-finite values (``inf`` would be ranked as the largest) and, where the
    table names its rows in ``id_col``, a row name given twice (one row per group), each
    by file and line."""
    import numpy as np

    from wattflex.ingest.reader import describe_bad_rows

    bad = []
    if value_col in table:
        values = table[value_col].to_numpy(float)
        bad += [
            {
                "where": table["_where"].iloc[i],
                "reason": f"{value_col} {values[i]:g} is not a finite number",
            }
            for i in np.flatnonzero(np.isinf(values))
        ]
    if bad:
        raise UserError(f"{path}: " + describe_bad_rows(bad))
    if id_col in table and id_col != value_col:
        named = table[table[id_col].notna()]
        dup = named[named[id_col].duplicated(keep=False)]
        if len(dup):
            first = dup.groupby(id_col, sort=False)["_where"].apply(list)
            lines = [f"  {name!r}: {', '.join(w)}" for name, w in first.head(10).items()]
            raise UserError(
                f"{path}: {len(first)} {id_col} name(s) on more than one row "
                "(one row per group):\n" + "\n".join(lines)
            )


def _fmt(x: float | None, spec: str) -> str:
    return "undefined" if x is None else format(x, spec)


def run(args: argparse.Namespace) -> int:
    """Run Kruskal–Wallis across the groups and Dunn's pairwise tests (p adjusted), print the result
    or write it as JSON with provenance. Returns the exit status, 0.

    Raises UserError for alpha outside (0, 1), an unknown adjustment, non-numeric values, or a
    table too small to test.
    """
    from wattflex.analysis.stats import check_p_adjust, kruskal_dunn
    from wattflex.commands._outputs import check_outputs
    from wattflex.ingest.reader import check_cells, read_typed_table
    from wattflex.provenance import provenance, strict_json, write_json

    if not 0 < args.alpha < 1:
        raise UserError(
            f"--alpha {args.alpha:g} is not a significance level in (0, 1) (e.g. 0.05, not 5)"
        )
    try:
        check_p_adjust(args.p_adjust, "--p-adjust")
    except ValueError as exc:
        raise UserError(str(exc)) from None
    if args.output:
        check_outputs([args.output], [args.table])
    table = read_typed_table(args.table)
    check_cells(
        table, numeric=[args.value_col]
    )  # a value that is not a number: named by file and line
    check_values(table, args.value_col, args.table)
    result = kruskal_dunn(
        table.drop(columns="_where"),
        value_col=args.value_col,
        group_col=args.group_col,
        order=name_list(args.order),
        p_adjust=args.p_adjust,
        alpha=args.alpha,
    )
    if (
        result.get("status") == "not_tested"
    ):  # the workflow records it and goes on; asked for, it is an error
        raise UserError(f"{args.table}: {result['reason']} (--group-col {args.group_col})")
    result["input"] = str(args.table)
    if not args.output:
        sys.stdout.write(strict_json(result, indent=2))
        print()
        return 0
    params = {k: v for k, v in vars(args).items() if not k.startswith("_")}
    write_json(result, args.output, provenance(params=params, inputs=[args.table]))
    kw = result["kruskal"]
    if kw["H"] is None:
        print(f"Kruskal-Wallis (df {kw['df']}, n {kw['n']}): {kw.get('note', 'undefined')}")
    else:
        print(f"Kruskal-Wallis H = {kw['H']:.3f} (df {kw['df']}, n {kw['n']}), p = {kw['p']:.4g}")
    for d in result["dunn"] if kw["H"] is not None else []:
        print(
            f"  {d['a']} vs {d['b']} (n {d['n_a']}|{d['n_b']}): z = {_fmt(d['z'], '+.3f')}, "
            f"p = {_fmt(d['p_raw'], '.4g')}, p_{args.p_adjust} = {_fmt(d['p_holm'], '.4g')}"
            f"{' *' if d['significant'] else ''}"
        )
    if any(t["across_groups"] for t in result["ties"]):
        print(f"  note: {len(result['ties'])} tied value(s), some across clusters (see 'ties')")
    print(f"wrote {args.output}")
    return 0
