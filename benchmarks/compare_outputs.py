"""Are the default run's outputs byte-identical across commits? (a refactor's check)

Usage: python benchmarks/compare_outputs.py REV [REV ...] [--cores N]   (REV: a commit or `tree`)

Each REV: a fresh copy of its workflow (benchmarks/checkouts.py) and a fresh working directory,
the default config, `snakemake --cores N`. Prints the sha256 prefix of runs.csv, pfi.csv and
allocation/headline.csv per REV, and, for every REV after the first, how many of all the CSVs
under results/ differ from the REV before it (a file only one of them has counts; their names on
stderr).
"""

from __future__ import annotations

import argparse
import hashlib
import sys
import tempfile
from pathlib import Path

from checkouts import describe, snakemake, workflow_copy

NAMED = ("runs.csv", "pfi.csv", "allocation/headline.csv")


def csv_hashes(work: Path) -> dict[str, str]:
    results = work / "results"
    return {
        str(f.relative_to(results)): hashlib.sha256(f.read_bytes()).hexdigest()
        for f in sorted(results.rglob("*.csv"))
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("revs", nargs="+")
    ap.add_argument("--cores", type=int, default=2)
    args = ap.parse_args(argv)
    rows, before = [], None
    with tempfile.TemporaryDirectory(prefix="wattflex_compare_") as tmp:
        for k, rev in enumerate(args.revs):
            root = Path(tmp) / f"{k}"
            wf = workflow_copy(rev, root)
            seconds, _, _ = snakemake(
                wf, root / "work", wf / "config" / "config.yaml", "--cores", str(args.cores), "-q"
            )
            hashes = csv_hashes(root / "work")
            named = [
                next((h[:12] for f, h in hashes.items() if f.endswith("/" + n)), "-") for n in NAMED
            ]
            if before is None:
                differ = "-"
            else:
                changed = sorted(
                    f for f in set(before) | set(hashes) if before.get(f) != hashes.get(f)
                )
                differ = len(changed)
                for f in changed:  # which, on stderr: the table keeps one row per REV
                    print(f"{rev}: differs: {f}", file=sys.stderr, flush=True)
            before = hashes
            rows.append((describe(rev), seconds, len(hashes), *named, differ))
            print(f"{rev}: {seconds:.0f} s, {len(hashes)} CSVs", file=sys.stderr, flush=True)
    print(
        "| workflow | run (s) | CSVs | "
        + " | ".join(NAMED)
        + " | CSVs differing from the row above |"
    )
    print("| --- | ---: | ---: | " + " | ".join("---" for _ in NAMED) + " | ---: |")
    for desc, seconds, n, *named, differ in rows:
        print(f"| {desc} | {seconds:.0f} | {n} | " + " | ".join(named) + f" | {differ} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
