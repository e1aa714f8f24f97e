"""Wall time and imported modules of ``wattflex --help``, for one or more library trees.

    python benchmarks/bench_cli_help.py [--runs 15] [TREE ...]

Each TREE is a directory holding ``workflow_scripts/wattflex`` (a checkout, or a ``git
archive`` of an older commit); the default is this checkout. ``--help`` imports every command
module, so this is what the lightness rule in ``wattflex.cli`` costs or saves. Prints a
markdown table: median and min wall time of a fresh interpreter running ``--help``, modules
in ``sys.modules`` after it, how many are wattflex's, and which heavy libraries got imported.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

HEAVY = ("numpy", "pandas", "scipy", "sklearn", "matplotlib", "torch", "pyarrow", "snakemake")

PROBE = """
import contextlib, io, json, sys
from wattflex.cli import main
with contextlib.redirect_stdout(io.StringIO()):
    try:
        main(["--help"])
    except SystemExit:
        pass
mods = sorted(sys.modules)
print(json.dumps({"n": len(mods), "wattflex": sum(m.startswith("wattflex") for m in mods),
                  "heavy": [h for h in %r if h in sys.modules]}))
""" % (HEAVY,)  # noqa: UP031 (a program text: %r is its literal)


def _env(tree: Path) -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(tree / "workflow_scripts")}


def measure(tree: Path, runs: int) -> dict:
    env = _env(tree)
    walls = []
    for _ in range(runs):
        t0 = time.perf_counter()
        subprocess.run(
            [sys.executable, "-m", "wattflex.cli", "--help"],
            env=env,
            check=True,
            stdout=subprocess.DEVNULL,
        )
        walls.append(time.perf_counter() - t0)
    info = json.loads(
        subprocess.run(
            [sys.executable, "-c", PROBE], env=env, check=True, capture_output=True, text=True
        ).stdout
    )
    return {"median_s": statistics.median(walls), "min_s": min(walls), **info}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("trees", nargs="*", type=Path, default=[Path(__file__).resolve().parents[1]])
    ap.add_argument("--runs", type=int, default=15)
    args = ap.parse_args()
    print("| tree | median s | min s | modules | wattflex modules | heavy libraries |")
    print("|---|---|---|---|---|---|")
    for tree in args.trees:
        r = measure(tree.resolve(), args.runs)
        print(
            f"| {tree} | {r['median_s']:.3f} | {r['min_s']:.3f} | {r['n']} | {r['wattflex']} | "
            f"{', '.join(r['heavy']) or 'none'} |"
        )


if __name__ == "__main__":
    main()
