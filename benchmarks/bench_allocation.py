"""How the allocation oracle scales, and how long the paper's full simulation takes.

Usage: python benchmarks/bench_allocation.py [--config config/config.yaml] [--quick] [--milp-max-jobs N]
       python benchmarks/bench_allocation.py --cli-scale [--quick]

Curves: the campaign's headline groups on the emulated H200 (the emulator's model at
each cap, no Snakemake), with 0.5 % seeded noise on power and throughput as a measured
sweep would have (which makes a few curves non-concave); PFI from those curves
(``pfi.pfi_ratio``) and a predicted PFI from a one-feature OLS on the DRAM copy product.

1. Oracle scaling, at a 30 % cut, with and without the certified fast path
   (``oracle(method="milp")``, the MILP every time, against ``method="auto"``, the rounded hull
   solution with a certified gap), with the path each took and the proven gap:
   - workloads of 100, 1,000 and 10,000 jobs drawn from the emulated groups (what the
     simulation does: the hull greedy certifies almost every workload);
   - 100, 1,000 and 10,000 jobs, every one a distinct random non-concave curve (6 points),
     and a budget the greedy cannot certify: the worst case for the exact fallback (dive +
     Lagrangian domain fixing + MILP; skipped above ``--milp-max-jobs``, default 10,000,
     which takes ~130 s); the plain MILP is the reference up to 1,000 jobs;
   - 10,000 and 100,000 distinct random concave curves (the greedy alone is exact; the
     plain MILP, an LP here, is the reference at 10,000).
2. The full simulation: 2 mixes x 9 cuts x 500 workloads x 100 jobs x 7 policies (the
   issue's "under a minute on 2 cores"), then everything ``simulate`` does (+ SLA tiers and
   20 out-of-sample splits).
Writes benchmarks/results/allocation.md and allocation.csv.

3. ``--cli-scale`` (alone): the ``wattflex allocate`` command end to end (a subprocess: read
   the CSV, check the points, build the curves, allocate, the oracle for comparison, write
   the CSV to stdout) on generated 1,000 / 5,000 / 33,000-job CSVs, every policy, 30 % cut.
   Two kinds of jobs: "sweep" (6 caps, concave-ish power law with 1 % noise on power and
   0.5 % on throughput, per-job pfi/gpus/cluster/dram_copy_product) and "random"
   (monotone random non-concave 6-point curves). Writes benchmarks/results/allocate_cli_scale.md.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "workflow_scripts"))

from wattflex.allocation import oracle as orc
from wattflex.allocation import simulate as al
from wattflex.allocation.curves import is_concave
from wattflex.config import groups, load_config
from wattflex.gpus import GPUS
from wattflex.pfi import pfi_ratio
from wattflex.runs.emulator import step as em

OUT = REPO / "benchmarks" / "results"


def emulated_campaign(
    cfg: dict, noise: float = 0.005, seed: int = 0
) -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame]:
    """runs / pfi / predictions tables for the headline groups from the emulator's model."""
    rng = np.random.default_rng(seed)
    rows, per_group = [], []
    for g in groups(cfg):
        if g["set"] != "headline":
            continue
        job = em.JobSpec.from_config(g, cfg["_catalog"][g["model"]])
        gpu = GPUS[g["gpu"]]
        leak = em.gpu_leakages(seed + len(per_group), job.gpus)
        pts = []
        for cap in g["caps"]:
            r = em.job_at_cap(job, gpu, cap, leak)
            p, t = (
                r.power_w * (1 + rng.normal(0, noise)),
                r.tokens_per_s * (1 + rng.normal(0, noise)),
            )
            pts.append((p, t))
            rows.append(
                {
                    "group": g["id"],
                    "cap_w": cap,
                    "set": "headline",
                    "task": g["task"],
                    "cluster": g["cluster"],
                    "gpus": job.gpus,
                    "backend": "emulated",
                    "power_w": p,
                    "tokens_per_s": t,
                }
            )
        top = r.per_gpu  # the uncapped run's telemetry
        dcp = float(np.mean([o.dram_active for o in top]) * np.mean([o.mem_copy_util for o in top]))
        per_group.append(
            {"group": g["id"], "pfi_ratio": pfi_ratio(*zip(*pts)), "dram_copy_product": dcp}
        )
    runs, table = pd.DataFrame(rows), pd.DataFrame(per_group)
    slope, intercept = al.fit_pfi_ols(
        table["dram_copy_product"].to_numpy(), table["pfi_ratio"].to_numpy()
    )
    preds = table.assign(pfi_pred=intercept + slope * table["dram_copy_product"])
    return runs, table[["group", "pfi_ratio"]], preds


def random_nonconcave(
    rng: np.random.Generator, n: int, K: int = 6
) -> tuple[np.ndarray, np.ndarray]:
    widths = rng.uniform(50, 400, (n, K - 1))
    P = np.concatenate([rng.uniform(100, 800, (n, 1)), np.zeros((n, K - 1))], 1)
    P[:, 1:] = P[:, :1] + np.cumsum(widths, 1)
    T = np.concatenate([rng.uniform(0, 300, (n, 1)), np.zeros((n, K - 1))], 1)
    T[:, 1:] = T[:, :1] + np.cumsum(rng.uniform(-0.5, 5.0, (n, K - 1)) * widths, 1)
    return P, T


def cli_scale_csv(path: Path, n: int, kind: str, seed: int = 0) -> None:
    """A ``wattflex allocate`` input of ``n`` jobs x 6 points (see the module docstring)."""
    rng = np.random.default_rng(seed)
    caps = np.array([200, 300, 400, 500, 600, 700.0])
    if kind == "sweep":
        gpus = rng.choice([1, 2, 4, 8], n)
        P = caps[None, :] * gpus[:, None] * rng.uniform(0.8, 1.0, (n, 1))
        P = np.sort(P * (1 + 0.01 * rng.standard_normal((n, 6))), 1)
        T = rng.uniform(100, 1000, (n, 1)) * (P / P[:, -1:]) ** rng.uniform(0.3, 1, (n, 1))
        T = np.sort(T * (1 + 0.005 * rng.standard_normal((n, 6))), 1)
    else:
        gpus = np.ones(n, int)
        widths = rng.uniform(50, 400, (n, 5))
        P = rng.uniform(100, 800, (n, 1)) + np.concatenate(
            [np.zeros((n, 1)), np.cumsum(widths, 1)], 1
        )
        T = rng.uniform(50, 300, (n, 1)) + np.concatenate(
            [np.zeros((n, 1)), np.cumsum(rng.uniform(0.0, 5.0, (n, 5)) * widths, 1)], 1
        )
    per_job = lambda v: np.repeat(v, 6)  # noqa: E731
    pd.DataFrame(
        {
            "job": per_job([f"{kind}{i}" for i in range(n)]),
            "power_w": P.ravel(),
            "throughput": T.ravel(),
            "cap_w": np.tile(caps, n),
            "gpus": per_job(gpus),
            "pfi": per_job(rng.uniform(1.0, 2.5, n)),
            "pfi_measured": per_job(rng.uniform(1.0, 2.5, n)),
            "cluster": per_job(rng.choice(["dense", "moe-ft"], n)),
            "dram_copy_product": per_job(rng.uniform(0.0, 1.0, n)),
        }
    ).to_csv(path, index=False)


def cli_scale(quick: bool) -> int:
    """Time ``wattflex allocate`` per policy and size (module docstring, item 3)."""
    import subprocess
    import tempfile

    from wattflex.policies import POLICIES

    exe = Path(sys.executable).with_name("wattflex")
    cmd = [str(exe)] if exe.exists() else [sys.executable, "-m", "wattflex.cli"]
    sizes = [1000, 5000] if quick else [1000, 5000, 33000]
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for kind in ("sweep", "random"):
            for n in sizes:
                path = Path(tmp) / f"{kind}{n}.csv"
                cli_scale_csv(path, n, kind)
                for policy in POLICIES:
                    t = time.perf_counter()
                    r = subprocess.run(
                        [*cmd, "allocate", str(path), "--cut", "0.3", "--policy", policy],
                        capture_output=True,
                        text=True,
                    )
                    wall = time.perf_counter() - t
                    last = r.stderr.strip().splitlines()[-1] if r.stderr.strip() else ""
                    rows.append(
                        {
                            "curves": kind,
                            "jobs": n,
                            "policy": policy,
                            "exit": r.returncode,
                            "wall_s": wall,
                            "stdout_rows": max(len(r.stdout.splitlines()) - 1, 0),
                            "kept": last.split(" keeps ")[1].split(" of")[0]
                            if " keeps " in last
                            else last[:60],
                        }
                    )
                    print(f"{kind} {n} {policy}: {wall:.2f} s", file=sys.stderr)
    table = pd.DataFrame(rows)
    lines = [
        "# `wattflex allocate` at scale",
        "",
        f"Command: `python benchmarks/bench_allocation.py --cli-scale{' --quick' if quick else ''}` "
        f"(each row: `wattflex allocate JOBS.csv --cut 0.3 --policy POLICY`, a fresh process, CSV on stdout). "
        f"Machine: {os.cpu_count()} CPUs visible (shared); numpy {np.__version__}.",
        "",
        "With an O(n^2) job reordering in `curves_from_points` the same command took 4 s at "
        "1,000 jobs, 93 s at 5,000 and more than 600 s at 33,000 (target <= 10 s).",
        "",
        table.to_markdown(index=False, floatfmt=".2f"),
        "",
        f"Slowest: {table['wall_s'].max():.2f} s.",
        "",
        "The oracle runs for every policy (as the comparison). When the hull greedy cannot certify the "
        "optimum (the marginal job sits on a non-concave bridge) it rounds the hull solution and keeps it "
        f"when the proven relative gap is at most {orc.GAP_TOL:g}; only otherwise does its MILP "
        "(HiGHS) run, which depends on the budget and the curves, not on the job count.",
    ]
    text = "\n".join(lines) + "\n"
    print(text)
    if not quick:
        OUT.mkdir(parents=True, exist_ok=True)
        (OUT / "allocate_cli_scale.md").write_text(text)
        print(f"wrote {OUT / 'allocate_cli_scale.md'}")
    return 0


def timed(fn, *args, **kw):
    wall, cpu = time.perf_counter(), time.process_time()
    out = fn(*args, **kw)
    return out, time.perf_counter() - wall, time.process_time() - cpu


def random_concave(rng: np.random.Generator, n: int, K: int = 6) -> tuple[np.ndarray, np.ndarray]:
    """``random_nonconcave`` with each job's slopes sorted in decreasing order (concave)."""
    widths = rng.uniform(50, 400, (n, K - 1))
    P = rng.uniform(100, 800, (n, 1)) + np.concatenate([np.zeros((n, 1)), np.cumsum(widths, 1)], 1)
    slopes = -np.sort(-rng.uniform(0.05, 5.0, (n, K - 1)), 1)
    T = rng.uniform(0, 300, (n, 1)) + np.concatenate(
        [np.zeros((n, 1)), np.cumsum(slopes * widths, 1)], 1
    )
    return P, T


def scaling_row(
    curves: str,
    P: np.ndarray,
    T: np.ndarray,
    budget: np.ndarray,
    method: str,
    reference: orc.Solution | None = None,
) -> tuple[dict, orc.Solution]:
    """One oracle run over workloads (W, n, K), timed, with its path and certified gap."""
    sol, wall, cpu = timed(orc.oracle, P, T, budget, method=method)
    value = sol.throughput.sum(-1)
    greedy = orc.hull_greedy(P, T, budget)
    return {
        "curves": curves,
        "jobs_per_workload": P.shape[-2],
        "workloads": len(P),
        "method": {"milp": "before: milp", "auto": "after: auto"}[method],
        "wall_s_per_workload": wall / len(P),
        "cpu_s_per_workload": cpu / len(P),
        "path": ", ".join(f"{m} {c}" for m, c in zip(*np.unique(sol.method, return_counts=True))),
        "milp_fallback_fraction": float((~sol.certified).mean()),
        "hull_bound_gap_rel": float(np.max((greedy.bound - value) / np.abs(greedy.bound))),
        "proven_gap_rel": float(np.max(sol.gap_rel)),
        "diff_to_before_rel": np.nan
        if reference is None
        else float(np.max((reference.throughput.sum(-1) - value) / np.abs(reference.bound))),
        "diff_to_plain_milp": np.nan,
        "plain_milp_wall_s": np.nan,
    }, sol


def oracle_scaling(
    table: al.GroupTable,
    sizes: list[int],
    workloads: dict[int, int],
    cut: float,
    reference_up_to: int,
    milp_max_jobs: int,
    concave_sizes: list[int],
) -> list[dict]:
    """Before (``method="milp"``: the MILP every time) and after (``"auto"``) on the
    same workloads; the before run is skipped above ``milp_max_jobs`` jobs on workloads the
    greedy cannot certify (134 s at 10,000)."""
    rows = []
    rng = np.random.default_rng(1)

    def both(curves, P, T, budget, plain_milp=False):
        before = None
        if P.shape[-2] <= milp_max_jobs or curves != "distinct random non-concave":
            row, before = scaling_row(curves, P, T, budget, "milp")
            rows.append(row)
        row, after = scaling_row(curves, P, T, budget, "auto", before)
        if plain_milp:  # the MILP without domain fixing, on the one workload
            ref, wall, _ = timed(orc.milp_oracle, P[0], T[0], float(budget[0]))
            row["diff_to_plain_milp"] = float(after.throughput[0].sum() - ref.throughput.sum())
            row["plain_milp_wall_s"] = wall
        rows.append(row)

    for n in sizes:
        idx = rng.integers(0, len(table.groups), (workloads[n], n))
        c = table.curves.take(idx)
        both("emulated groups (25)", c.power_w, c.throughput, (1 - cut) * c.ceiling_w.sum(-1))
    for n in sizes:
        for _ in range(
            100
        ):  # an instance the greedy cannot certify (the rounding or the MILP runs)
            P, T = random_nonconcave(rng, n)
            budget = rng.uniform(0.6, 0.9) * P[:, -1].sum()
            if not orc.hull_greedy(P[None], T[None], np.array([budget])).certified[0]:
                break
        both(
            "distinct random non-concave",
            P[None],
            T[None],
            np.array([budget]),
            plain_milp=n <= reference_up_to,
        )
    for n in concave_sizes:  # the plain MILP is an LP here (no binaries): ~30 s at 10,000 jobs
        P, T = random_concave(rng, n)
        both(
            "distinct random concave",
            P[None],
            T[None],
            np.array([(1 - cut) * P[:, -1].sum()]),
            plain_milp=n <= 10 * reference_up_to,
        )
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", default=str(REPO / "config" / "config.yaml"))
    ap.add_argument(
        "--quick", action="store_true", help="smaller sizes (a smoke test of this script)"
    )
    ap.add_argument(
        "--milp-max-jobs",
        type=int,
        default=10000,
        help="largest uncertifiable non-concave workload the before (MILP) oracle is timed on",
    )
    ap.add_argument(
        "--cli-scale",
        action="store_true",
        help="only time `wattflex allocate` on 1k/5k/33k-job CSVs per policy (allocate_cli_scale.md)",
    )
    args = ap.parse_args()
    if args.cli_scale:
        return cli_scale(args.quick)
    cfg_all = load_config(args.config)
    runs, pfi_table, preds = emulated_campaign(cfg_all)
    cfg = al.SimulationConfig.from_dict(cfg_all.get("allocation", {}))
    if args.quick:
        cfg.n_workloads, cfg.oos_splits = 50, 2
    table = al.group_table(runs, pfi_table, preds, cfg)
    sizes = [100, 1000] if args.quick else [100, 1000, 10000]
    scaling = pd.DataFrame(
        oracle_scaling(
            table,
            sizes,
            {100: 200, 1000: 20, 10000: 4},
            0.30,
            reference_up_to=1000,
            milp_max_jobs=args.milp_max_jobs,
            concave_sizes=[10000] if args.quick else [10000, 100000],
        )
    )
    print(scaling.to_markdown(index=False, floatfmt=".4g"), file=sys.stderr)

    rng = np.random.default_rng(cfg.seed)
    indices = {
        mix: al.sample_workloads(
            table.groups, mix, cfg.n_workloads, cfg.jobs_per_workload, rng, cfg.pretraining_fraction
        )
        for mix in cfg.mixes
    }
    wall = cpu = 0.0
    for index in indices.values():
        _, w, c = timed(al.evaluate_policies, table, index, cfg.cuts, cfg)
        wall, cpu = wall + w, cpu + c
    out, full_wall, full_cpu = timed(al.simulate, table, cfg)
    head = out["headline"].set_index("policy")
    sim = pd.DataFrame(
        [
            {
                "what": f"main simulation: {len(cfg.mixes)} mixes x {len(cfg.cuts)} cuts x {cfg.n_workloads} workloads "
                f"x {cfg.jobs_per_workload} jobs x {len(cfg.policies)} policies",
                "wall_s": wall,
                "cpu_s": cpu,
            },
            {
                "what": f"simulate(): main + SLA tiers + {cfg.oos_splits} out-of-sample splits",
                "wall_s": full_wall,
                "cpu_s": full_cpu,
            },
        ]
    )
    concave = is_concave(table.curves)
    pairs = scaling.pivot_table(
        index=["curves", "jobs_per_workload"],
        columns="method",
        values="wall_s_per_workload",
        sort=False,
    )
    after = scaling[scaling["method"] == "after: auto"].set_index(["curves", "jobs_per_workload"])
    summary = pd.DataFrame(
        {"before_wall_s": pairs.get("before: milp"), "after_wall_s": pairs["after: auto"]}
    )
    summary["speedup"] = summary["before_wall_s"] / summary["after_wall_s"]
    summary["after_path"] = after["path"]
    summary["after_proven_gap_rel"] = after["proven_gap_rel"]
    milp_flag = "" if args.milp_max_jobs == 10000 else f" --milp-max-jobs {args.milp_max_jobs}"
    lines = [
        "# Allocation oracle and simulation benchmark",
        "",
        f"Machine: {os.cpu_count()} CPUs visible (shared); numpy {np.__version__}. Curves: "
        f"{len(table.groups)} emulated headline groups + 0.5 % noise ({int(concave.sum())} concave). "
        "Cut 30 % for the oracle rows.",
        "",
        "## Oracle scaling: the MILP every time and the certified fast path",
        "",
        f"Command: `python benchmarks/bench_allocation.py{milp_flag}`. "
        'Each row times `oracle.oracle` on the same workloads with `method="milp"` (before: the hull greedy, '
        "and the MILP with dive + Lagrangian domain fixing wherever the greedy's exact certificate fails) "
        'and `method="auto"` (after: where the exact certificate fails, the rounded hull solution is kept '
        f"when its proven relative gap is at most {orc.GAP_TOL:g}; the MILP only otherwise).",
        "",
        "Per workload, before -> after (wall seconds; the full table below):",
        "",
        summary.reset_index().to_markdown(index=False, floatfmt=".4g"),
        "",
        scaling.to_markdown(index=False, floatfmt=".4g"),
        "",
        "`path`: which path answered, per workload. `hull_bound_gap_rel`: (hull bound - value) / hull bound, "
        "the relaxation's bound against the value returned. `proven_gap_rel`: the returned certificate, "
        "(bound - value) / bound with the hull bound (hull-certified) or the MILP's dual bound (milp; HiGHS "
        "stops at a relative gap of 1e-10 on its objective, which leaves out the floors' throughput, so it can "
        "read ~1e-9 here); the largest over the workloads. `diff_to_before_rel`: (before's value - after's "
        "value) / bound, the most after gives up (<= proven_gap_rel). `diff_to_plain_milp`: after minus the "
        "MILP without domain fixing (`milp_oracle` on the whole workload; tokens/s; blank where that reference "
        "was not run), `plain_milp_wall_s` its time. Random curves: "
        "6 points, floors 100-800 W, segment widths 50-400 W, slopes -0.5-5 (non-concave) or 0.05-5 sorted "
        "(concave) tokens/s per W.",
        "",
        "## Simulation",
        "",
        sim.to_markdown(index=False, floatfmt=".1f"),
        "",
        f"Headline ({cfg.headline_mix}, {cfg.headline_cut:.0%} cut): PFI-aware recovers "
        f"{head.loc['pfi-aware', 'tokens_per_s_per_job_recovered']:+,.0f} tokens/s per job over equal weight, "
        f"{head.loc['pfi-aware', 'gap_closed']:.0%} of the gap (published +1,500, 63 %); curve-aware "
        f"{head.loc['curve-aware', 'gap_closed']:.0%}. Oracle MILP fallbacks: "
        f"{out['diagnostics']['oracle_milp_fraction'].iat[0]:.2%} of (workload, cut) pairs.",
    ]
    text = "\n".join(lines) + "\n"
    print(text)
    if not args.quick:
        OUT.mkdir(parents=True, exist_ok=True)
        (OUT / "allocation.md").write_text(text)
        pd.concat(
            [scaling.assign(section="oracle_scaling"), sim.assign(section="simulation")]
        ).to_csv(OUT / "allocation.csv", index=False)
        print(f"wrote {OUT / 'allocation.md'} and {OUT / 'allocation.csv'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
