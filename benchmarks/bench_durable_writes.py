"""What durable writes cost: ``wattflex.provenance.write_csv`` (a CSV and its sidecar, each
fsynced, the folder fsynced before and after the renames, the CSV's sha256 in its sidecar) against
the same write with ``os.fsync`` made a no-op (what it cost before issue 47).

    python benchmarks/bench_durable_writes.py [--n 200] [--rows 50] [--dir DIR]

DIR (default: a temporary folder under the current one, the filesystem the workflow's results/
lie on) holds the files. Prints a markdown table: per write, median and 90th percentile wall
time, and the total for ``--n`` writes, with and without fsync.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np
import pandas as pd

from wattflex.provenance import write_csv


def _times(folder: Path, n: int, df: pd.DataFrame) -> list[float]:
    out = []
    for k in range(n):
        t = time.perf_counter()
        write_csv(df, folder / f"t{k % 10}.csv")
        out.append(time.perf_counter() - t)
    return out


def main() -> None:
    """Time ``--n`` writes with fsync and with fsync made a no-op; print the table."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=200)
    ap.add_argument("--rows", type=int, default=50)
    ap.add_argument("--dir", type=Path, default=Path.cwd())
    args = ap.parse_args()
    rng = np.random.default_rng(0)
    df = pd.DataFrame(rng.random((args.rows, 8)), columns=[f"c{i}" for i in range(8)])
    real_fsync = os.fsync
    rows = []
    with tempfile.TemporaryDirectory(dir=args.dir, prefix=".bench-durable-") as tmp:
        for label, fsync in (("fsync (now)", real_fsync), ("no fsync (before)", lambda fd: None)):
            os.fsync = fsync
            try:
                _times(Path(tmp), 5, df)  # warm: imports, provenance's cached versions
                times = _times(Path(tmp), args.n, df)
            finally:
                os.fsync = real_fsync
            q90 = statistics.quantiles(times, n=10)[-1]
            rows.append((label, statistics.median(times), q90, sum(times)))
    print(f"write_csv of a {args.rows}x8 table, {args.n} writes, in {args.dir}\n")
    print("| writes | median per write (ms) | p90 (ms) | total (s) |")
    print("| --- | --- | --- | --- |")
    for label, med, q90, total in rows:
        print(f"| {label} | {med * 1e3:.2f} | {q90 * 1e3:.2f} | {total:.2f} |")


if __name__ == "__main__":
    main()
