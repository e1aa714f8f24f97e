"""Time the default workflow: `snakemake -n` on the full grid, and the full default run.

Usage: python benchmarks/bench_workflow.py [--full] [--cores N]
Prints a table (and writes it to benchmarks/results/workflow.md). The full run executes in
a fresh temporary working directory, so existing results are not touched.
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

REPO = Path(__file__).resolve().parents[1]


def timed(cmd: list[str], cwd: Path) -> tuple[float, str]:
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True)
    dt = time.perf_counter() - t0
    if proc.returncode:
        sys.exit(f"failed: {' '.join(cmd)}\n{proc.stderr[-3000:]}")
    return dt, proc.stdout + proc.stderr


def job_total(text: str) -> int:
    m = re.search(r"^total\s+(\d+)$", text, re.M)
    return int(m.group(1)) if m else -1


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--full", action="store_true", help="also time the full default run (minutes)")
    ap.add_argument("--cores", default=str(os.cpu_count()))
    args = ap.parse_args()
    base = [sys.executable, "-m", "snakemake", "-s", str(REPO / "Snakefile"),
            "--configfile", str(REPO / "config" / "config.yaml")]
    rows = []
    with tempfile.TemporaryDirectory() as work:
        dt, out = timed([*base, "-d", work, "-n", "--cores", args.cores], Path(work))
        planned = job_total(out)
        rows.append(("snakemake -n (default grid)", planned, dt))
        if args.full:
            dt, out = timed([*base, "-d", work, "--cores", args.cores, "-q"], Path(work))
            rows.append((f"full default run ({args.cores} cores)", planned, dt))
            dt, out = timed([*base, "-d", work, "-n", "--cores", args.cores], Path(work))
            rows.append(("snakemake -n after the full run (no-op)", 0, dt))
    lines = ["| what | jobs | wall time (s) |", "| --- | ---: | ---: |"]
    lines += [f"| {w} | {n} | {dt:.1f} |" for w, n, dt in rows]
    table = "\n".join(lines)
    print(table)
    out_dir = REPO / "benchmarks" / "results"
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "workflow.md").write_text(f"# Default workflow timings ({time.strftime('%Y-%m-%d')}, {os.cpu_count()} cores)\n\n"
                                         f"Command: `python benchmarks/bench_workflow.py {'--full ' if args.full else ''}--cores {args.cores}`\n\n{table}\n")


if __name__ == "__main__":
    main()
