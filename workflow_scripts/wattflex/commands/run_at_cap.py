"""``wattflex run-at-cap SPEC.json OUTDIR``: one run at one power cap, without Snakemake.

SPEC.json is the spec the workflow's ``run_at_cap`` rule builds (campaign, run_id, cap_w,
repeat, seed, backend, group, model_facts, run, and for ``backend: cuda`` a ``cuda``
section; see ``wattflex.runs.real_run``). OUTDIR receives telemetry.parquet, steps.parquet and
run.json. ``--cap-w`` overrides the spec's cap. A termination signal restores the GPU
power limits and exits with status 128+signal.
"""

from __future__ import annotations

import argparse
import json
import logging
from pathlib import Path

from wattflex.errors import UserError

NAME = "run-at-cap"
HELP = "Run one training job at one power cap (emulated or real GPUs) and write its telemetry"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("spec", type=Path, help="run spec (JSON)")
    parser.add_argument("outdir", type=Path, help="output directory")
    parser.add_argument("--cap-w", type=float, help="power cap per GPU in W (overrides the spec)")


def run(args: argparse.Namespace) -> int:
    # Lazy, like every heavy import of a command (wattflex.cli): --help must not load the run stack.
    from wattflex.runs.devices.caps import CapSignal

    try:
        spec = json.loads(args.spec.read_text())
    except (OSError, ValueError) as exc:
        raise UserError(f"{args.spec}: cannot read the spec ({exc})") from exc
    if args.cap_w is not None:
        spec["cap_w"] = args.cap_w
    missing = [k for k in ("backend", "cap_w", "group") if k not in spec]
    if missing:
        raise UserError(f"{args.spec}: missing {', '.join(missing)}")
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    try:
        try:
            from wattflex.runs.runner import run_at_cap
        except ImportError:
            if spec["backend"] != "cuda":
                raise UserError(f"backend {spec['backend']!r} needs wattflex.runs.runner, missing from this install")
            from wattflex.runs.real_run import run_real as run_at_cap
        run_at_cap(spec, args.outdir)
    except CapSignal as sig:
        return int(sig.code)
    print(f"{args.outdir}: telemetry.parquet, steps.parquet, run.json")
    return 0
