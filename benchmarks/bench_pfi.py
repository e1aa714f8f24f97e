"""How long ``wattflex pfi`` takes on large sweep tables.

Usage: python benchmarks/bench_pfi.py [--groups 1000,5000] [--before DIR] [--mc-samples N] [--out FILE]

Each run is the ``wattflex pfi TABLE -o OUT.csv`` command end to end in a subprocess (read
the CSV, check every row, the PFI of every group with 10,000 Monte Carlo resamples, write the
CSV and its sidecar). Tables: N groups of 4 caps (200, 400, 600, 700 W per GPU, 8 GPUs), a
power-law throughput loss with 0.5 % seeded noise and SEM columns, so every part of the
analysis runs (isotonic fit, binding test, both CIs). ``--before DIR``: also run the library
in DIR (its ``workflow_scripts``: e.g. ``git archive <commit> workflow_scripts | tar -x -C DIR``),
interleaved with this checkout's, and check both give the same point estimates (exactly).
``--mc-samples 0``: no CIs, so the time is the point estimates, notes and ``per_cap`` JSON.
Prints a table and writes it to ``benchmarks/results/pfi_scale.md`` (or ``--out``).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pandas as pd

REPO = Path(__file__).resolve().parents[1]


def sweep_table(n_groups: int, seed: int = 0) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    caps = np.array([200.0, 400.0, 600.0, 700.0])
    k = np.repeat(rng.uniform(0.3, 1.0, n_groups), caps.size)
    cap = np.tile(caps, n_groups)
    throughput = 100 * (1 - k * (1 - cap / 700) ** 1.5) * rng.normal(1, 0.005, cap.size)
    return pd.DataFrame(
        {
            "group": np.repeat([f"g{i}" for i in range(n_groups)], caps.size),
            "cap_w": cap,
            "power_w": 8 * cap * rng.uniform(0.93, 0.99, cap.size),
            "throughput": throughput,
            "power_w_sem": 5.0,
            "throughput_sem": 0.3,
            "gpus": 8,
        }
    )


TEXT_COLUMNS = ["group", "status", "robust_status"]
NUMBER_COLUMNS = [
    "n_caps",
    "pfi_ratio",
    "pfi_area",
    "pfi_elasticity",
    "pfi_robust",
    "n_binding",
    "uncapped_cap_w",
    "uncapped_power_w",
    "uncapped_throughput",
]


def same_points(a: pd.DataFrame, b: pd.DataFrame) -> bool:
    """Same groups and statuses, every point estimate (the per_cap JSON numbers included) equal
    to rtol 1e-12: the point estimates are computed across groups (other summation orders,
    closed-form least squares). The CIs are not compared: with one random stream shared by the
    groups of a size, they are other Monte Carlo draws of the same intervals."""

    def numbers(per_cap: str) -> list[float]:
        return [
            float(v) if v is not None else np.nan
            for point in json.loads(per_cap)
            for v in point.values()
            if not isinstance(v, (list, bool))
        ]

    if len(a) != len(b) or not all(a[c].equals(b[c]) for c in TEXT_COLUMNS):
        return False
    close = lambda x, y: np.allclose(x, y, rtol=1e-12, atol=0, equal_nan=True)  # noqa: E731
    return all(close(a[c].to_numpy(float), b[c].to_numpy(float)) for c in NUMBER_COLUMNS) and all(
        len(x := numbers(u)) == len(y := numbers(v)) and close(x, y)
        for u, v in zip(a.per_cap, b.per_cap)
    )


def time_pfi(lib: Path, table: Path, out: Path, mc_samples: int = 10_000) -> tuple[float, float]:
    """Wall and CPU seconds (user + system) of one ``wattflex pfi``: on a shared machine the
    wall time follows the load, the CPU time much less."""
    env = {**os.environ, "PYTHONPATH": str(lib / "workflow_scripts")}
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    subprocess.run(
        [
            sys.executable,
            "-m",
            "wattflex.cli",
            "pfi",
            str(table),
            "-o",
            str(out),
            "--mc-samples",
            str(mc_samples),
        ],
        check=True,
        env=env,
        capture_output=True,
        text=True,
    )
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--groups", default="1000,5000", help="comma-separated group counts")
    ap.add_argument("--before", type=Path, help="checkout of the earlier version to compare with")
    ap.add_argument(
        "--mc-samples", type=int, default=10_000, help="Monte Carlo resamples (0: no CIs)"
    )
    ap.add_argument("--out", type=Path, default=REPO / "benchmarks" / "results" / "pfi_scale.md")
    args = ap.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for n in [int(x) for x in args.groups.split(",")]:
            table = Path(tmp) / f"sweeps_{n}.csv"
            sweep_table(n).to_csv(table, index=False)
            now, now_cpu = time_pfi(REPO, table, Path(tmp) / "now.csv", args.mc_samples)
            row = {
                "groups": n,
                "rows": 4 * n,
                "now_s": now,
                "now_cpu_s": now_cpu,
                "now_ms_per_group": 1000 * now / n,
                "load_1min": os.getloadavg()[0],
            }
            if args.before is not None:
                before, before_cpu = time_pfi(
                    args.before, table, Path(tmp) / "before.csv", args.mc_samples
                )
                same = same_points(
                    pd.read_csv(Path(tmp) / "now.csv"), pd.read_csv(Path(tmp) / "before.csv")
                )
                row.update(
                    before_s=before,
                    before_cpu_s=before_cpu,
                    now_over_before_cpu=now_cpu / before_cpu,
                    same_points=same,
                )
            rows.append(row)
            print(row, flush=True)
    df = pd.DataFrame(rows)
    text = (
        "# `wattflex pfi` at scale (benchmarks/bench_pfi.py)\n\n"
        f"Command: `python benchmarks/bench_pfi.py --groups {args.groups}"
        f"{' --before ' + str(args.before) if args.before else ''} --mc-samples {args.mc_samples}`; 4 caps per "
        f"group, {args.mc_samples:,} Monte Carlo "
        "resamples, end to end in a subprocess; shared 2-core machine (upper bounds).\n\n"
        + df.to_markdown(index=False, floatfmt=".3g")
        + "\n"
    )
    args.out.write_text(text)
    print(text)


if __name__ == "__main__":
    main()
