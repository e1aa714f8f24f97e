"""Time incremental reruns against the full default run.

Usage: python benchmarks/bench_incremental.py [--cores N] [--configfile CONFIG] [--ref REV|tree]
           [--repeats N] [--with-allocation]

In a fresh temporary directory, on a snapshot of the workflow (benchmarks/checkouts.py): by
default the committed HEAD (`git archive HEAD`, so uncommitted or later edits to the checkout
do not leak in); `--ref REV` another commit (e.g. `--ref 20fe11c`, the first landing, for a
before/after), `--ref tree` the working tree as it is. Run the default workflow in full, then make one change at a time
to a copy of the config and rerun, timing each and counting the jobs Snakemake ran. The
changes: an allocation setting (if the allocation stage is wired into the Snakefile;
--with-allocation wires rules/allocation.smk into the snapshot when the checkout has not
yet), the predictor's feature set and a plot setting; each is reverted before the next, and
the run that reverts it is not timed. Each change is timed --repeats times (default 3) and the
no-change runs (`snakemake -n`, then `snakemake`) at least 5 times; the table gives the median
and the range, beside a machine-speed probe taken before and after, since a shared machine's
speed drifts. Prints a table and writes it to benchmarks/results/incremental.md.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from importlib import metadata
from pathlib import Path

import yaml
from checkouts import REPO, describe, jobs_by_rule, per_group_summaries, snakemake, workflow_copy


def allocation_wired(workflow: Path = REPO) -> bool:
    return 'include: "rules/allocation.smk"' in (workflow / "Snakefile").read_text()


def snapshot(root: Path, ref: str, with_allocation: bool) -> tuple[Path, bool]:
    """The workflow and library of ``ref``, and whether the allocation stage had to be wired in
    (only if asked)."""
    dst = workflow_copy(ref, root)
    patch = (
        with_allocation
        and not allocation_wired(dst)
        and (dst / "rules" / "allocation.smk").is_file()
    )
    if patch:
        snakefile, common = dst / "Snakefile", dst / "rules" / "common.smk"
        snakefile.write_text(
            snakefile.read_text().replace(
                'include: "rules/report.smk"',
                'include: "rules/allocation.smk"\ninclude: "rules/report.smk"',
                1,
            )
        )
        common.write_text(
            common.read_text().replace(
                '"analysis_figures", "report"]',
                '"analysis_figures", "simulate_allocation", "allocation_figures", "report"]',
                1,
            )
        )
    return dst, patch


def which_jobs(out: str) -> str:
    counts = per_group_summaries(jobs_by_rule(out))
    return ", ".join(r + (f" x{n}" if n != 1 else "") for r, n in counts.items()) or "nothing"


def changes(cfg: dict, with_allocation: bool) -> list[tuple[str, dict]]:
    """(label, config overrides) of each incremental change, made on top of ``cfg``."""
    out = []
    if with_allocation:
        cuts = list(cfg.get("allocation", {}).get("cuts", [0.0, 0.1, 0.2, 0.3, 0.4]))
        out.append(
            (
                "change an allocation setting (`allocation.cuts`: drop the largest cut)",
                {"allocation": {"cuts": cuts[:-1]}},
            )
        )
    feats = cfg.get("predictor", {}).get("features", "dram_copy_product")
    out.append(
        (
            "change the predictor's features (`predictor.features`)",
            {"predictor": {"features": feats + "+arithmetic_intensity"}},
        )
    )
    out.append(
        (
            "change a plot setting (`figures.dpi`)",
            {"figures": {"dpi": int(cfg.get("figures", {}).get("dpi", 110)) + 10}},
        )
    )
    return out


def speed_probe(repeats: int = 3) -> float:
    """Seconds to import pandas and matplotlib.pyplot in a fresh interpreter (min of
    ``repeats``): how fast this machine is right now, since a shared machine's speed drifts by
    2x within an hour. Every figure job pays about this much before it draws."""
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        subprocess.run([sys.executable, "-c", "import pandas, matplotlib.pyplot"], check=True)
        best = min(best, time.perf_counter() - t0)
    return best


def executor_plugins() -> list[str]:
    """Installed Snakemake executor plugins: Snakemake imports every one at each start (the
    SLURM plugin imports pandas, ~0.3 s)."""
    return sorted(
        {
            d.metadata["Name"]
            for d in metadata.distributions()
            if (d.metadata["Name"] or "").lower().startswith("snakemake-executor-plugin-")
        }
    )


def timed(
    workflow: Path,
    work: Path,
    config: Path,
    cores: str,
    repeats: int,
    revert: Path | None,
    *extra: str,
) -> tuple[list[float], int, str]:
    """Wall times of ``repeats`` identical runs with ``config``; after each, a run with
    ``revert`` (untimed) brings the results back, so every timed run does the same work."""
    times, n, out = [], 0, ""
    for _ in range(repeats):
        dt, n, out = snakemake(workflow, work, config, "--cores", cores, *extra, check=False)
        times.append(dt)
        if revert is not None:
            snakemake(workflow, work, revert, "--cores", cores)
    return times, n, out


def cell(times: list[float]) -> str:
    med = statistics.median(times)
    return f"{med:.1f}" if len(times) == 1 else f"{med:.1f} ({min(times):.1f}-{max(times):.1f})"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cores", default=str(os.cpu_count()))
    ap.add_argument("--configfile", help="default: the timed workflow's own config/config.yaml")
    ap.add_argument(
        "--ref", default="HEAD", help="the workflow to time: a commit (default HEAD) or `tree`"
    )
    ap.add_argument(
        "--repeats",
        type=int,
        default=3,
        help="timed runs of each change (the table gives the median, min-max); default 3",
    )
    ap.add_argument(
        "--with-allocation",
        action="store_true",
        help="wire rules/allocation.smk into the snapshot if the Snakefile does not include it yet",
    )
    args = ap.parse_args()
    rows = []
    probe_before = speed_probe()
    print(f"speed probe: {probe_before:.2f} s", flush=True)
    with tempfile.TemporaryDirectory(prefix="wattflex-bench-") as tmp:
        workflow, patched = snapshot(Path(tmp) / "checkout", args.ref, args.with_allocation)
        base_cfg = yaml.safe_load(
            Path(args.configfile or workflow / "config" / "config.yaml").read_text()
        )
        work, config, base = Path(tmp) / "work", Path(tmp) / "config.yaml", Path(tmp) / "base.yaml"
        wired = allocation_wired(workflow)
        work.mkdir()
        base.write_text(yaml.safe_dump(base_cfg, sort_keys=False))
        dt, n, out = snakemake(workflow, work, base, "--cores", args.cores)
        rows.append(("full default run", n, [dt], "every stage"))
        print(f"full run: {dt:.1f} s, {n} jobs", flush=True)
        for label, override in changes(base_cfg, wired):
            cfg = yaml.safe_load(yaml.safe_dump(base_cfg))
            for key, value in override.items():
                cfg[key] = {**cfg.get(key, {}), **value}
            config.write_text(yaml.safe_dump(cfg, sort_keys=False))
            times, n, out = timed(workflow, work, config, args.cores, args.repeats, base)
            failed = out.splitlines()[0] + "; planned: " if out.startswith("FAILED") else ""
            rows.append((label, n, times, failed + which_jobs(out)))
            print(f"{label}: {cell(times)} s", flush=True)
        # Nothing to do: the dry run a user types to see what would run (`snakemake -n`), and
        # the real call; more repeats, as each is short and the noise is not.
        for label, extra in (
            ("no change, dry run (`snakemake -n`)", ("-n",)),
            ("no change, `snakemake`", ()),
        ):
            times, n, out = timed(
                workflow, work, base, args.cores, max(5, args.repeats), None, *extra
            )
            rows.append((label, 0 if extra else n, times, which_jobs(out)))
            print(f"{label}: {cell(times)} s", flush=True)
    probe_after = speed_probe()
    full = rows[0][2][0]
    lines = [
        "| what | jobs | wall time (s): median (min-max) | vs full run | jobs run |",
        "| --- | ---: | ---: | ---: | --- |",
    ]
    lines += [
        f"| {w} | {n} | {cell(t)} | {statistics.median(t) / full:.1%} | {which} |"
        for w, n, t, which in rows
    ]
    table = "\n".join(lines)
    print(table)
    note = (
        "\nThe allocation stage was not yet included by the checkout's Snakefile: this run wired "
        "rules/allocation.smk into the snapshot (--with-allocation), as the final workflow does.\n"
        if patched
        else ""
        if wired
        else "\nThe allocation stage was not wired into the Snakefile when this ran, so its row is "
        "missing; the predictor and plot rows stand in for it.\n"
    )
    out_dir = REPO / "benchmarks" / "results"
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "incremental.md").write_text(
        f"# Incremental reruns vs the full default run ({time.strftime('%Y-%m-%d %H:%M')}, {os.cpu_count()} cores, "
        f"--cores {args.cores})\n\nCommand: `python benchmarks/bench_incremental.py --cores {args.cores}"
        f"{' --ref ' + args.ref if args.ref != 'HEAD' else ''}{' --with-allocation' if args.with_allocation else ''}"
        f"{' --repeats ' + str(args.repeats) if args.repeats != 3 else ''}`"
        f"\n\nWorkflow: {describe(args.ref)}. Snakemake executor plugins installed: "
        f"{', '.join(executor_plugins()) or 'none'}.\n\n"
        f"Machine speed probe (`import pandas, matplotlib.pyplot` in a fresh interpreter, min of 3): "
        f"{probe_before:.2f} s before, {probe_after:.2f} s after.\n\n"
        f"{table}\n{note}"
    )


if __name__ == "__main__":
    main()
