"""Time incremental reruns against the full default run (issue 8).

Usage: python benchmarks/bench_incremental.py [--cores N] [--configfile CONFIG] [--with-allocation]

In a fresh temporary directory, on a snapshot of the committed workflow (`git archive HEAD`,
so uncommitted or later edits to the checkout do not leak in): run the default workflow in full, then make one change at a time
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
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
WORKFLOW_PARTS = ("Snakefile", "rules", "workflow_scripts", "config", "envs", "resources")


def allocation_wired(workflow: Path = REPO) -> bool:
    return 'include: "rules/allocation.smk"' in (workflow / "Snakefile").read_text()


def snapshot(dst: Path, with_allocation: bool) -> Path:
    """The committed workflow and library (the allocation stage wired in if asked)."""
    dst.mkdir(parents=True)
    parts = [p for p in WORKFLOW_PARTS if (REPO / p).exists()]
    archive = subprocess.run(["git", "-C", str(REPO), "archive", "HEAD", *parts], capture_output=True, check=True)
    subprocess.run(["tar", "-x", "-C", str(dst)], input=archive.stdout, check=True)
    if with_allocation and not allocation_wired(dst) and (dst / "rules" / "allocation.smk").is_file():
        snakefile, common = dst / "Snakefile", dst / "rules" / "common.smk"
        snakefile.write_text(snakefile.read_text().replace(
            'include: "rules/report.smk"', 'include: "rules/allocation.smk"\ninclude: "rules/report.smk"', 1))
        common.write_text(common.read_text().replace(
            '"analysis_figures", "report"]', '"analysis_figures", "simulate_allocation", "allocation_figures", "report"]', 1))
    return dst


def snakemake(workflow: Path, work: Path, config: Path, cores: str, check: bool = True) -> tuple[float, int, str]:
    """(wall seconds, jobs run, output) of one `snakemake` invocation; a failure exits unless
    ``check`` is False, when the output starts with FAILED and names the failing rules."""
    cmd = [sys.executable, "-m", "snakemake", "-s", str(workflow / "Snakefile"), "-d", str(work),
           "--configfile", str(config), "--cores", cores]
    env = {**os.environ, "PYTHONPATH": str(workflow / "workflow_scripts")}
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, cwd=workflow, capture_output=True, text=True, env=env)
    dt = time.perf_counter() - t0
    out = proc.stdout + proc.stderr
    if proc.returncode:
        if check:
            sys.exit(f"failed: {' '.join(cmd)}\n{out[-4000:]}")
        out = "FAILED in " + ", ".join(sorted(set(re.findall(r"^Error in rule (\w+):", out, re.M)))) + "\n" + out
    m = re.search(r"^total\s+(\d+)$", out, re.M)
    return dt, int(m.group(1)) if m else 0, out


def jobs_by_rule(out: str) -> str:
    table = out[out.index("Job stats:"):] if "Job stats:" in out else ""
    rules = []
    for line in table.splitlines()[3:]:
        m = re.match(r"^(\w+)\s+(\d+)$", line.strip())
        if not m or m.group(1) == "total":
            break
        if m.group(1) != "all":
            rules.append(f"{m.group(1)}" + (f" x{m.group(2)}" if m.group(2) != "1" else ""))
    return ", ".join(rules) or "nothing"


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
    ap.add_argument("--configfile", default=str(REPO / "config" / "config.yaml"))
    ap.add_argument("--with-allocation", action="store_true",
                    help="wire rules/allocation.smk into the snapshot if the Snakefile does not include it yet")
    args = ap.parse_args()
    base_cfg = yaml.safe_load(Path(args.configfile).read_text())
    rows = []
    with tempfile.TemporaryDirectory(prefix="wattflex-bench-") as tmp:
        workflow = snapshot(Path(tmp) / "workflow", args.with_allocation)
        work, config = Path(tmp) / "work", Path(tmp) / "config.yaml"
        wired = allocation_wired(workflow)
        patched = wired and not allocation_wired()
        work.mkdir()
        config.write_text(yaml.safe_dump(base_cfg, sort_keys=False))
        dt, n, out = snakemake(workflow, work, config, args.cores)
        rows.append(("full default run", n, dt, "every stage"))
        for label, override in changes(base_cfg, wired):
            cfg = yaml.safe_load(yaml.safe_dump(base_cfg))
            for key, value in override.items():
                cfg[key] = {**cfg.get(key, {}), **value}
            config.write_text(yaml.safe_dump(cfg, sort_keys=False))
            dt, n, out = snakemake(workflow, work, config, args.cores, check=False)
            failed = out.splitlines()[0] + "; planned: " if out.startswith("FAILED") else ""
            rows.append((label, n, dt, failed + jobs_by_rule(out)))
            config.write_text(yaml.safe_dump(base_cfg, sort_keys=False))
            snakemake(workflow, work, config, args.cores)  # back to the default, untimed
        dt, n, out = snakemake(workflow, work, config, args.cores)
        rows.append(("no change (up-to-date check)", n, dt, jobs_by_rule(out)))
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
        f"{' --with-allocation' if args.with_allocation else ''}`\n\n"
        f"{table}\n{note}")


if __name__ == "__main__":
    main()
