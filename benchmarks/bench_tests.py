"""Wall time of the test suites (targets: unit suite <= 90 s, whole suite <= 10 min on 2 cores).

Runs each tier as CI does (pytest, xdist workers as in the README's test command) and prints one
row per run: tier, workers, tests passed/failed/skipped, wall s, CPU s (user + system of pytest
and everything it started), and the 1-minute load average before and after (the machine may
be shared: a wall time means little without it). It runs pytest without PYTHONDONTWRITEBYTECODE,
as CI does: with it set, every worker and every Snakemake rule script compiles the library and
the test modules from source again (the fast tier's collection alone: 12.7 s of CPU per worker
instead of 8.2 s, measured 2026-12-02 on the 2-core machine).

    python benchmarks/bench_tests.py                       # unit, then the rest, 4 workers
    python benchmarks/bench_tests.py --tiers unit --workers 0 4   # 0: no xdist
    python benchmarks/bench_tests.py --tiers integration conformance
"""

from __future__ import annotations

import argparse
import os
import re
import resource
import shlex
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd

REPO = Path(__file__).resolve().parents[1]
# the suites (tests/tiers.py); "rest" is how the README runs the last two: in one session
TIERS = {
    "unit": "unit",
    "integration": "integration",
    "conformance": "conformance",
    "rest": "integration or conformance",
}


def run_tier(marker: str, workers: int, extra: list[str]) -> dict:
    cmd = [
        sys.executable,
        "-m",
        "pytest",
        "-q",
        "-p",
        "no:cacheprovider",
        "-m",
        marker,
        *(["-n", str(workers), "--dist", "loadgroup"] if workers else []),
        *extra,
    ]
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    load0, t0 = os.getloadavg()[0], time.monotonic()
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, env=env)
    wall = time.monotonic() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    counts = {
        k: int(n)
        for n, k in re.findall(
            r"(\d+) (passed|failed|skipped|error)",
            proc.stdout.splitlines()[-1] if proc.stdout.strip() else "",
        )
    }
    return {
        "marker": marker,
        "workers": workers,
        "passed": counts.get("passed", 0),
        "failed": counts.get("failed", 0) + counts.get("error", 0),
        "skipped": counts.get("skipped", 0),
        "wall_s": round(wall, 1),
        "cpu_s": round(after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime, 1),
        "load_before": round(load0, 2),
        "load_after": round(os.getloadavg()[0], 2),
        "exit": proc.returncode,
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tiers", nargs="+", choices=list(TIERS), default=["unit", "rest"])
    ap.add_argument(
        "--workers", nargs="+", type=int, default=[4], help="xdist workers per run (0: no xdist)"
    )
    ap.add_argument("--extra", default="", help="more pytest arguments, one shell-quoted string")
    args = ap.parse_args(argv)
    rows = [
        run_tier(TIERS[t], w, shlex.split(args.extra)) for t in args.tiers for w in args.workers
    ]
    print(pd.DataFrame(rows).to_string(index=False))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
