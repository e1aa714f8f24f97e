"""Time the full default workflow: the first landing (commit 20fe11c) and HEAD back to back.

Usage: python benchmarks/bench_workflow.py [--cores 2] [--ref 20fe11c] [--head tree|REV]
           [--noop-repeats 3] [--only-head]

Each side is a fresh copy of its workflow (benchmarks/checkouts.py: `git archive` of the
first landing with `../shared` linked beside it; for HEAD the working tree as it is,
uncommitted edits included, or `--head REV`), run with its own library in a fresh working
directory: `snakemake -n` (planning the full grid), the full default run, then `snakemake -n`
again, a no-op, `--noop-repeats` times (median). Prints a table with the ratio HEAD / first
landing, whether runs.csv and pfi.csv came out byte-identical, and the jobs of each rule;
writes it to benchmarks/results/workflow.md. Existing results are never touched.
Run it on a quiet machine: both sides take minutes and share its cores.
"""

from __future__ import annotations

import argparse
import filecmp
import os
import statistics
import tempfile
import time
from pathlib import Path

import yaml
from checkouts import (
    FIRST_LANDING,
    REPO,
    describe,
    jobs_by_rule,
    per_group_summaries,
    snakemake,
    workflow_copy,
)


def measure(ref: str, root: Path, cores: str, noop_repeats: int) -> dict:
    """Plan, full run and no-op timings of the workflow ``ref`` (a commit, or ``tree``)."""
    workflow = workflow_copy(ref, root)
    work, config = root / "work", workflow / "config" / "config.yaml"
    plan_s, planned, plan_out = snakemake(workflow, work, config, "-n", "--cores", cores)
    full_s, ran, _ = snakemake(workflow, work, config, "--cores", cores, "-q")
    noops = [snakemake(workflow, work, config, "-n", "--cores", cores) for _ in range(noop_repeats)]
    assert all(n == 0 for _, n, _ in noops), f"{ref}: a rerun right after the full run planned jobs"
    return {
        "ref": ref,
        "what": describe(ref),
        "plan_s": plan_s,
        "jobs": planned,
        "full_s": full_s,
        "noop_s": statistics.median(dt for dt, _, _ in noops),
        "rules": per_group_summaries(jobs_by_rule(plan_out)),
        "results": work / "results" / yaml.safe_load(config.read_text())["campaign"],
    }


def identical(a: dict, b: dict, name: str) -> str:
    fa, fb = a["results"] / name, b["results"] / name
    if not (fa.is_file() and fb.is_file()):
        return "missing"
    return "identical" if filecmp.cmp(fa, fb, shallow=False) else "differ"


def table(rows: list[dict]) -> str:
    ref = rows[0]
    lines = [
        "| workflow | jobs | full run (s) | `snakemake -n`, fresh (s) | `snakemake -n`, no-op (s) |",
        "| --- | ---: | ---: | ---: | ---: |",
    ]
    lines += [
        f"| {r['what']} | {r['jobs']} | {r['full_s']:.1f} | {r['plan_s']:.1f} | {r['noop_s']:.1f} |"
        for r in rows
    ]
    if len(rows) == 2:
        head = rows[1]
        lines.append(
            f"| ratio HEAD / first landing | {head['jobs'] / ref['jobs']:.2f} | {head['full_s'] / ref['full_s']:.2f} "
            f"| {head['plan_s'] / ref['plan_s']:.2f} | {head['noop_s'] / ref['noop_s']:.2f} |"
        )
        lines.append("")
        lines.append(
            f"runs.csv: {identical(ref, head, 'runs.csv')}; pfi.csv: {identical(ref, head, 'pfi.csv')} "
            "(HEAD vs first landing, byte for byte)"
        )
    lines.append("")
    lines.append("Jobs per rule:")
    lines.append("")
    for r in rows:
        lines.append(f"- {r['what']}: " + ", ".join(f"{k} {v}" for k, v in r["rules"].items()))
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cores", default="2")
    ap.add_argument(
        "--ref", default=FIRST_LANDING, help="the baseline commit (default: the first landing)"
    )
    ap.add_argument(
        "--head",
        default="tree",
        help="`tree` (the working tree, uncommitted edits too) or a commit",
    )
    ap.add_argument("--noop-repeats", type=int, default=3)
    ap.add_argument("--only-head", action="store_true", help="skip the baseline (no ratio)")
    args = ap.parse_args()
    rows = []
    with tempfile.TemporaryDirectory(prefix="wattflex-bench-workflow-") as tmp:
        for i, ref in enumerate(([] if args.only_head else [args.ref]) + [args.head]):
            rows.append(measure(ref, Path(tmp) / f"side{i}", args.cores, args.noop_repeats))
            print(
                f"{rows[-1]['what']}: {rows[-1]['full_s']:.1f} s, {rows[-1]['jobs']} jobs",
                flush=True,
            )
        text = table(rows)
    print(text)
    out_dir = REPO / "benchmarks" / "results"
    out_dir.mkdir(parents=True, exist_ok=True)
    cmd = " ".join(
        ["python benchmarks/bench_workflow.py", "--cores", args.cores]
        + (["--only-head"] if args.only_head else [])
        + (["--ref", args.ref] if args.ref != FIRST_LANDING else [])
        + (["--head", args.head] if args.head != "tree" else [])
    )
    (out_dir / "workflow.md").write_text(
        f"# Default workflow: first landing vs HEAD ({time.strftime('%Y-%m-%d')}, {os.cpu_count()} cores, "
        f"--cores {args.cores})\n\nCommand: `{cmd}`\n\nEach side: a fresh copy of its workflow and a fresh "
        f"working directory, run one after the other on the same machine.\n\n{text}\n"
    )


if __name__ == "__main__":
    main()
