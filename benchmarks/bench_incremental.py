"""Time incremental reruns against the full default run (issue 8).

Usage: python benchmarks/bench_incremental.py [--cores N] [--configfile CONFIG] [--ref REV|tree]
           [--with-allocation]

In a fresh temporary directory, on a snapshot of the workflow (benchmarks/checkouts.py): by
default the committed HEAD (`git archive HEAD`, so uncommitted or later edits to the checkout
do not leak in); `--ref REV` another commit (e.g. `--ref 20fe11c`, the first landing, for a
before/after), `--ref tree` the working tree as it is. Run the default workflow in full, then make one change at a time
to a copy of the config and rerun, timing each and counting the jobs Snakemake ran. The
changes: an allocation setting (if the allocation stage is wired into the Snakefile;
--with-allocation wires rules/allocation.smk into the snapshot when the checkout has not
yet), the predictor's feature set and a plot setting; each is reverted before the next, and
the run that reverts it is not timed. Prints a table and writes it to
benchmarks/results/incremental.md. Existing results are not touched.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path

import yaml

from checkouts import REPO, describe, jobs_by_rule, per_group_summaries, snakemake, workflow_copy


def allocation_wired(workflow: Path = REPO) -> bool:
    return 'include: "rules/allocation.smk"' in (workflow / "Snakefile").read_text()


def snapshot(root: Path, ref: str, with_allocation: bool) -> tuple[Path, bool]:
    """The workflow and library of ``ref``, and whether the allocation stage had to be wired in
    (only if asked)."""
    dst = workflow_copy(ref, root)
    patch = with_allocation and not allocation_wired(dst) and (dst / "rules" / "allocation.smk").is_file()
    if patch:
        snakefile, common = dst / "Snakefile", dst / "rules" / "common.smk"
        snakefile.write_text(snakefile.read_text().replace(
            'include: "rules/report.smk"', 'include: "rules/allocation.smk"\ninclude: "rules/report.smk"', 1))
        common.write_text(common.read_text().replace(
            '"analysis_figures", "report"]', '"analysis_figures", "simulate_allocation", "allocation_figures", "report"]', 1))
    return dst, patch


def which_jobs(out: str) -> str:
    counts = per_group_summaries(jobs_by_rule(out))
    return ", ".join(r + (f" x{n}" if n != 1 else "") for r, n in counts.items()) or "nothing"


def changes(cfg: dict, with_allocation: bool) -> list[tuple[str, dict]]:
    """(label, config overrides) of each incremental change, made on top of ``cfg``."""
    out = []
    if with_allocation:
        cuts = list(cfg.get("allocation", {}).get("cuts", [0.0, 0.1, 0.2, 0.3, 0.4]))
        out.append(("change an allocation setting (`allocation.cuts`: drop the largest cut)",
                    {"allocation": {"cuts": cuts[:-1]}}))
    feats = cfg.get("predictor", {}).get("features", "dram_copy_product")
    out.append(("change the predictor's features (`predictor.features`)",
                {"predictor": {"features": feats + "+arithmetic_intensity"}}))
    out.append(("change a plot setting (`figures.dpi`)",
                {"figures": {"dpi": int(cfg.get("figures", {}).get("dpi", 110)) + 10}}))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cores", default=str(os.cpu_count()))
    ap.add_argument("--configfile", help="default: the timed workflow's own config/config.yaml")
    ap.add_argument("--ref", default="HEAD", help="the workflow to time: a commit (default HEAD) or `tree`")
    ap.add_argument("--with-allocation", action="store_true",
                    help="wire rules/allocation.smk into the snapshot if the Snakefile does not include it yet")
    args = ap.parse_args()
    rows = []
    with tempfile.TemporaryDirectory(prefix="wattflex-bench-") as tmp:
        workflow, patched = snapshot(Path(tmp) / "checkout", args.ref, args.with_allocation)
        base_cfg = yaml.safe_load(Path(args.configfile or workflow / "config" / "config.yaml").read_text())
        work, config = Path(tmp) / "work", Path(tmp) / "config.yaml"
        wired = allocation_wired(workflow)
        work.mkdir()
        config.write_text(yaml.safe_dump(base_cfg, sort_keys=False))
        dt, n, out = snakemake(workflow, work, config, "--cores", args.cores)
        rows.append(("full default run", n, dt, "every stage"))
        for label, override in changes(base_cfg, wired):
            cfg = yaml.safe_load(yaml.safe_dump(base_cfg))
            for key, value in override.items():
                cfg[key] = {**cfg.get(key, {}), **value}
            config.write_text(yaml.safe_dump(cfg, sort_keys=False))
            dt, n, out = snakemake(workflow, work, config, "--cores", args.cores, check=False)
            failed = out.splitlines()[0] + "; planned: " if out.startswith("FAILED") else ""
            rows.append((label, n, dt, failed + which_jobs(out)))
            config.write_text(yaml.safe_dump(base_cfg, sort_keys=False))
            snakemake(workflow, work, config, "--cores", args.cores)  # back to the default, untimed
        dt, n, out = snakemake(workflow, work, config, "--cores", args.cores)
        rows.append(("no change (up-to-date check)", n, dt, which_jobs(out)))
    full = rows[0][2]
    lines = ["| what | jobs | wall time (s) | vs full run | jobs run |", "| --- | ---: | ---: | ---: | --- |"]
    lines += [f"| {w} | {n} | {dt:.1f} | {dt / full:.1%} | {which} |" for w, n, dt, which in rows]
    table = "\n".join(lines)
    print(table)
    note = ("\nThe allocation stage was not yet included by the checkout's Snakefile: this run wired "
            "rules/allocation.smk into the snapshot (--with-allocation), as the final workflow does.\n" if patched else
            "" if wired else "\nThe allocation stage was not wired into the Snakefile when this ran, so its row is "
            "missing; the predictor and plot rows stand in for it.\n")
    out_dir = REPO / "benchmarks" / "results"
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "incremental.md").write_text(
        f"# Incremental reruns vs the full default run ({time.strftime('%Y-%m-%d')}, {os.cpu_count()} cores, "
        f"--cores {args.cores})\n\nCommand: `python benchmarks/bench_incremental.py --cores {args.cores}"
        f"{' --ref ' + args.ref if args.ref != 'HEAD' else ''}{' --with-allocation' if args.with_allocation else ''}`"
        f"\n\nWorkflow: {describe(args.ref)}.\n\n"
        f"{table}\n{note}")


if __name__ == "__main__":
    main()
