"""``wattflex predict``: PFI of jobs that were never swept, from their uncapped telemetry."""

from __future__ import annotations

import argparse
import sys

from wattflex.errors import UserError

NAME = "predict"
HELP = "Predict PFI from a telemetry summary (one row per job) with a fitted predictor model.json"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """``wattflex predict``'s options on ``parser``: the telemetry table, the fitted model and the
    output.
    """
    parser.add_argument(
        "telemetry",
        help="CSV or parquet, one row per job: the uncapped run's steady-state "
        "means (e.g. dram_active 0-1, mem_copy_util %%)",
    )
    parser.add_argument(
        "--model", required=True, help="model.json written by the fit_predictor rule"
    )
    parser.add_argument("-o", "--output", help="write CSV here (default: print it)")


def load_model(path: str) -> dict:
    """A predictor model.json, or one line naming the file and what is wrong with it."""
    import json

    from wattflex.ingest.reader import read_input_text
    from wattflex.pfi_model import model_number_problem
    from wattflex.provenance import check_schema_version

    text = read_input_text(path, "--model")  # not a file, or too big: says so
    try:
        doc = json.loads(text)
    except (UnicodeDecodeError, ValueError) as exc:
        raise UserError(
            f"{path}: not a JSON file ({str(exc).splitlines()[0]}); --model wants the model.json "
            "written by the fit_predictor rule"
        ) from None
    if not isinstance(doc, dict):
        raise UserError(
            f"{path}: not a wattflex predictor model (a JSON {type(doc).__name__}, not an object)"
        )
    check_schema_version(doc.get("schema_version"), path)
    if doc.get("status") == "not_fitted":
        raise UserError(
            f"{path}: the predictor in this model file was not fitted: {doc.get('reason', 'no reason recorded')}"
        )
    missing = [k for k in ("features", "coefficients", "intercept") if k not in doc]
    if missing:
        raise UserError(
            f"{path}: not a wattflex predictor model (no {', '.join(map(repr, missing))}); "
            "--model wants the model.json written by the fit_predictor rule"
        )
    feats, coefs = doc["features"], doc["coefficients"]
    if not isinstance(feats, list) or not all(isinstance(f, str) and f for f in feats):
        raise UserError(
            f'{path}: features: {feats!r} is not a list of feature names (e.g. ["dram_copy_product"])'
        )
    if not isinstance(coefs, dict) or any(f not in coefs for f in feats):
        raise UserError(
            f"{path}: not a wattflex predictor model (features and coefficients do not match)"
        )
    numbers = {"intercept": doc["intercept"], **{f"coefficients.{f}": coefs[f] for f in feats}}
    for field, v in numbers.items():
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            raise UserError(f"{path}: {field}: {v!r} is not a number")
    problem = model_number_problem(doc)
    if problem:
        raise UserError(
            f"{path}: {problem}; a fitted model's coefficients and intercept are finite numbers"
        )
    return doc


def run(args: argparse.Namespace) -> int:
    """Predict each job's PFI from its uncapped telemetry with the fitted model; print the table or
    write it with provenance. Returns the exit status, 0.

    Raises UserError for non-numeric or out-of-range inputs, by file and line.
    """
    from wattflex.analysis.predictor import feature_inputs, input_problems
    from wattflex.commands._outputs import check_outputs
    from wattflex.ingest.reader import check_cells, describe_bad_rows, read_typed_table
    from wattflex.pfi_model import add_features, predict
    from wattflex.provenance import provenance, write_csv

    if args.output:
        check_outputs([args.output, f"{args.output}.meta.json"], [args.telemetry, args.model])
    model = load_model(args.model)
    jobs = read_typed_table(args.telemetry)
    columns = [c for c in feature_inputs(model["features"]) if c in jobs]
    check_cells(jobs, numeric=columns)  # a value that is not a number: named by file and line
    bad = [
        {"where": jobs["_where"].iloc[i], "reason": why} for i, why in input_problems(jobs, columns)
    ]
    if bad:
        raise UserError(f"{args.telemetry}: " + describe_bad_rows(bad))
    jobs = jobs.drop(columns="_where")
    out = add_features(jobs)
    out["pfi_pred"] = predict(model, jobs)
    if not args.output:
        out.to_csv(sys.stdout, index=False)
        return 0
    write_csv(
        out,
        args.output,
        provenance(params={"model": args.model}, inputs=[args.telemetry, args.model]),
        model_features=model["features"],
    )
    print(
        f"predicted PFI for {len(out)} job(s) with features {'+'.join(model['features'])}; wrote {args.output}"
    )
    return 0
