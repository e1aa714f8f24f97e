"""``wattflex predict``: PFI of jobs that were never swept, from their uncapped telemetry."""

from __future__ import annotations

import argparse
import sys

NAME = "predict"
HELP = "Predict PFI from a telemetry summary (one row per job) with a fitted predictor model.json"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("telemetry", help="CSV or parquet, one row per job: the uncapped run's steady-state "
                                          "means (e.g. dram_active 0-1, mem_copy_util %%)")
    parser.add_argument("--model", required=True, help="model.json written by the fit_predictor rule")
    parser.add_argument("-o", "--output", help="write CSV here (default: print it)")


def run(args: argparse.Namespace) -> int:
    from wattflex.analysis.predictor import add_features, predict
    from wattflex.provenance import provenance, read_json, write_csv
    from wattflex.commands.stats import read_table

    model = read_json(args.model)
    jobs = read_table(args.telemetry)
    out = add_features(jobs)
    out["pfi_pred"] = predict(model, jobs)
    if not args.output:
        out.to_csv(sys.stdout, index=False)
        return 0
    write_csv(out, args.output, provenance(params={"model": args.model}, inputs=[args.telemetry, args.model]),
              model_features=model["features"])
    print(f"predicted PFI for {len(out)} job(s) with features {'+'.join(model['features'])}; wrote {args.output}")
    return 0
