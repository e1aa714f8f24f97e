"""The nested-limit oracle's time at 10,000 jobs under 3 levels (feeds > PDUs > racks) and the
site budget.

Usage: python benchmarks/bench_topology.py [--jobs 10000] [--repeats 3] [--no-milp]

Curves: distinct random 6-point curves (floor 100..300 W, 5 segments of 20..200 W), concave
(slopes sorted) or not (slopes in any order). Tree: 4 feeds, 16 PDUs, 160 racks (parents
drawn at random), every job in a random rack; each group's limit a random 20..100 % of its
jobs' range above their floors; the site budget 70 % of what the limits allow. Rows:

- ``nested greedy``: :func:`wattflex.allocation.nested.nested_oracle` on concave curves (the
  polymatroid greedy, exact); checked against the MILP of the same problem (an LP here,
  scipy HiGHS) for value (relative difference) and for every level's limit;
- ``nested oracle, non-concave``: the greedy on the hulls, then the rounding
  (:func:`wattflex.allocation.nested.freeze_round`), then (its gap above 1e-6) the MILP with
  one row per group (HiGHS, 120 s limit); and the same with ``gap_tol=1e-4`` (the rounding
  kept);
- ``flat oracle (site only)``: :func:`wattflex.allocation.oracle.oracle` on the budget alone,
  for the time it took before and how many racks it overloads.

Writes benchmarks/results/topology_oracle.md.
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "workflow_scripts"))

from wattflex.allocation.nested import Laminar, nested_oracle, nested_water_fill, random_laminar  # noqa: E402
from wattflex.allocation.oracle import milp_oracle, oracle  # noqa: E402

OUT = Path(__file__).resolve().parent / "results" / "topology_oracle.md"


def curves(
    rng: np.random.Generator, n: int, K: int, concave: bool
) -> tuple[np.ndarray, np.ndarray]:
    floor = rng.uniform(100, 300, n)
    width = rng.uniform(20, 200, (n, K - 1))
    P = np.concatenate([floor[:, None], floor[:, None] + np.cumsum(width, -1)], -1)
    slopes = rng.uniform(0.0, 2.0, (n, K - 1))
    if concave:
        slopes = -np.sort(-slopes, axis=-1)
    T = np.concatenate([np.zeros((n, 1)), np.cumsum(slopes * width, -1)], -1)
    return P, T


def timed(fn, repeats: int):
    best, out = np.inf, None
    for _ in range(repeats):
        t0 = time.perf_counter()
        out = fn()
        best = min(best, time.perf_counter() - t0)
    return best, out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--jobs", type=int, default=10_000)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument(
        "--no-milp", action="store_true", help="skip the non-concave row and the LP check"
    )
    args = ap.parse_args()
    rng = np.random.default_rng(39)
    n = args.jobs
    rows = []
    for concave in (True, False):
        if not concave and args.no_milp:
            continue
        P, T = curves(rng, n, 6, concave)
        fam = random_laminar(rng, n, [4, 16, 160], ceiling_w=P[:, -1], floor_w=P[:, 0])
        fam = Laminar(
            fam.parent, fam.limit_w, fam.leaf, tuple(f"g{k}" for k in range(len(fam.parent)))
        )
        most = nested_water_fill(np.inf, P[:, 0], P[:, -1], np.ones(n), fam).sum()
        budget = P[:, 0].sum() + 0.7 * (most - P[:, 0].sum())
        t, sol = timed(lambda: nested_oracle(P, T, budget, fam), args.repeats if concave else 1)
        over = fam.violations(sol.power_w)
        check = ""
        if concave and not args.no_milp:
            groups = [(m, float(lim)) for m, lim in zip(fam.members(), fam.limit_w)]
            t_lp, ref = timed(lambda: milp_oracle(P, T, budget, groups=groups, leaf=fam.leaf), 1)
            rel = abs(float(sol.throughput.sum()) - float(ref.throughput.sum())) / float(
                ref.throughput.sum()
            )
            check = f"vs HiGHS LP ({t_lp:.2f} s): rel. diff {rel:.1e}"
        rows.append(
            (
                f"nested {'greedy, concave' if concave else 'oracle, non-concave'}",
                n,
                len(fam.parent),
                t,
                str(sol.method),
                float(sol.gap_rel),
                len(over),
                float(sol.power_w.sum() / budget),
                check,
            )
        )
        if not concave:  # the rounding alone, kept at a looser gap
            t, sol = timed(lambda: nested_oracle(P, T, budget, fam, gap_tol=1e-4), 1)
            rows.append(
                (
                    "nested oracle, non-concave, gap_tol 1e-4",
                    n,
                    len(fam.parent),
                    t,
                    str(sol.method),
                    float(sol.gap_rel),
                    len(fam.violations(sol.power_w)),
                    float(sol.power_w.sum() / budget),
                    "freeze_round, no MILP",
                )
            )
        tf, flat = timed(lambda: oracle(P, T, budget), args.repeats if concave else 1)
        rows.append(
            (
                f"flat oracle (site only), {'concave' if concave else 'non-concave'}",
                n,
                1,
                tf,
                str(flat.method),
                float(flat.gap_rel),
                len(fam.violations(flat.power_w)),
                float(flat.power_w.sum() / budget),
                "levels ignored",
            )
        )
    lines = [
        "# Nested-limit oracle at 10,000 jobs x 3 levels",
        "",
        f"`python benchmarks/bench_topology.py --jobs {n}` on {platform.processor() or platform.machine()}, "
        f"{os.cpu_count()} CPU(s), numpy {np.__version__}; best of {args.repeats} (the MILP row: one run).",
        "",
        "Tree: 4 feeds > 16 PDUs > 160 racks (+ the site budget), limits 20-100 % of each group's range; "
        "the budget 70 % of what the limits allow.",
        "",
        "| case | jobs | groups | time (s) | path | proven gap (rel.) | groups over limit | power / budget | check |",
        "|---|---:|---:|---:|---|---:|---:|---:|---|",
    ]
    for name, jobs, groups, t, method, gap, over, frac, check in rows:
        lines.append(
            f"| {name} | {jobs:,} | {groups} | {t:.3f} | {method} | {gap:.1e} | {over} | {frac:.6f} | {check} |"
        )
    text = "\n".join(lines) + "\n"
    print(text)
    if n == 10_000:
        OUT.write_text(text)


if __name__ == "__main__":
    main()
