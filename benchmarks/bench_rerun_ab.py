"""Short reruns of two workflow versions, interleaved: a plot-setting change and a no-op dry run.

Usage: python benchmarks/bench_rerun_ab.py [--before REV] [--after REV|tree] [--rounds N] [--cores N] [--out MD]

A shared machine's speed drifts by 2x within an hour, so two benchmark runs made one after the
other compare the machine as much as the code. Here both versions (default: the commit before
this script's issue-15 follow-up, d70115f, and HEAD) run the default campaign in full once, each
in its own fresh copy, then take turns, round after round: change `figures.dpi` and rerun
(timed), change it back (untimed), `snakemake -n` with nothing to do (timed). Prints the
median and range of each, and their ratio, and writes benchmarks/results/rerun_ab.md.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from pathlib import Path

import yaml
from bench_incremental import cell, executor_plugins, speed_probe
from checkouts import REPO, describe, snakemake, workflow_copy


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--before", default="d70115f")
    ap.add_argument("--after", default="HEAD", help="a commit or `tree` (the working tree)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--cores", default="2")
    ap.add_argument(
        "--out",
        default="benchmarks/results/rerun_ab.md",
        help="the Markdown result, under the repository",
    )
    args = ap.parse_args()
    probe_before = speed_probe()
    times: dict[str, dict[str, list[float]]] = {}
    with tempfile.TemporaryDirectory(prefix="wattflex-ab-") as tmp:
        sides = {}
        for name, ref in (("before", args.before), ("after", args.after)):
            workflow = workflow_copy(ref, Path(tmp) / name)
            cfg = yaml.safe_load((workflow / "config" / "config.yaml").read_text())
            base, dpi = Path(tmp) / f"{name}-base.yaml", Path(tmp) / f"{name}-dpi.yaml"
            base.write_text(yaml.safe_dump(cfg, sort_keys=False))
            changed = {
                **cfg,
                "figures": {
                    **cfg.get("figures", {}),
                    "dpi": int(cfg.get("figures", {}).get("dpi", 110)) + 10,
                },
            }
            dpi.write_text(yaml.safe_dump(changed, sort_keys=False))
            work = Path(tmp) / name / "work"
            dt, n, _ = snakemake(workflow, work, base, "--cores", args.cores)
            print(f"{name} ({describe(ref)}): full run {dt:.1f} s, {n} jobs", flush=True)
            sides[name] = (workflow, work, base, dpi)
            times[name] = {"plot": [], "noop": []}
        for r in range(args.rounds):
            for name, (workflow, work, base, dpi) in sides.items():
                dt, _, _ = snakemake(workflow, work, dpi, "--cores", args.cores)
                times[name]["plot"].append(dt)
                snakemake(workflow, work, base, "--cores", args.cores)  # back, untimed
                dt, _, _ = snakemake(workflow, work, base, "-n")
                times[name]["noop"].append(dt)
                print(
                    f"round {r + 1} {name}: plot {times[name]['plot'][-1]:.1f} s, no-op {dt:.2f} s",
                    flush=True,
                )
    probe_after = speed_probe()
    rows = ["| what | before | after | after / before |", "| --- | ---: | ---: | ---: |"]
    for key, label in (
        ("plot", "rerun after a plot setting (`figures.dpi`)"),
        ("noop", "no-op `snakemake -n`"),
    ):
        b, a = times["before"][key], times["after"][key]
        rows.append(
            f"| {label} | {cell(b)} | {cell(a)} | {statistics.median(a) / statistics.median(b):.2f} |"
        )
    table = "\n".join(rows)
    print(table)
    out = REPO / args.out
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(
        f"# Short reruns, two versions interleaved ({time.strftime('%Y-%m-%d %H:%M')}, {os.cpu_count()} cores, "
        f"--cores {args.cores})\n\nCommand: `python benchmarks/bench_rerun_ab.py --before {args.before} "
        f"--after {args.after} --rounds {args.rounds} --out {args.out}`\n\nBefore: {describe(args.before)}; after: {describe(args.after)}. "
        f"Snakemake executor plugins installed: {', '.join(executor_plugins()) or 'none'}.\n\n"
        f"Machine speed probe (`import pandas, matplotlib.pyplot` in a fresh interpreter, min of 3): "
        f"{probe_before:.2f} s before, {probe_after:.2f} s after. Times: median (min-max) of {args.rounds} rounds, s.\n\n"
        f"{table}\n"
    )


if __name__ == "__main__":
    main()
