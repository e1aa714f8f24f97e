"""How the allocation oracle scales, and how long the paper's full simulation takes.

Usage: python benchmarks/bench_allocation.py [--config config/config.yaml] [--quick]

Curves: the campaign's headline groups on the emulated H200 (the emulator's model at
each cap, no Snakemake), with 0.5 % seeded noise on power and throughput as a measured
sweep would have (which makes a few curves non-concave); PFI from those curves
(``pfi.pfi_ratio``) and a predicted PFI from a one-feature OLS on the DRAM copy product.

1. Oracle scaling, at a 30 % cut: workloads of 100, 1,000 and 10,000 jobs
   - drawn from the emulated groups (what the simulation does: the hull greedy certifies
     almost every workload; the MILP fallback merges copies of a group);
   - every job a distinct random non-concave curve (6 points) and a budget the greedy
     cannot certify: the worst case for the exact fallback (dive + Lagrangian domain
     fixing + MILP); the plain MILP is the reference up to 1,000 jobs.
2. The full simulation: 2 mixes x 9 cuts x 500 workloads x 100 jobs x 7 policies (the
   issue's "under a minute on 2 cores"), then everything ``simulate`` does (+ SLA tiers and
   20 out-of-sample splits).
Writes benchmarks/results/allocation.md and allocation.csv.
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

from wattflex.allocation import simulate as al
from wattflex.allocation.curves import is_concave
from wattflex.gpus import GPUS
from wattflex.runs import emulator as em
from wattflex.allocation import oracle as orc
from wattflex.config import groups, load_config
from wattflex.analysis.pfi import pfi_ratio

OUT = REPO / "benchmarks" / "results"


def emulated_campaign(cfg: dict, noise: float = 0.005, seed: int = 0) -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame]:
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
            p, t = r.power_w * (1 + rng.normal(0, noise)), r.tokens_per_s * (1 + rng.normal(0, noise))
            pts.append((p, t))
            rows.append({"group": g["id"], "cap_w": cap, "set": "headline", "task": g["task"],
                         "cluster": g["cluster"], "gpus": job.gpus, "backend": "emulated",
                         "power_w": p, "tokens_per_s": t})
        top = r.per_gpu  # the uncapped run's telemetry
        dcp = float(np.mean([o.dram_active for o in top]) * np.mean([o.mem_copy_util for o in top]))
        per_group.append({"group": g["id"], "pfi_ratio": pfi_ratio(*zip(*pts)), "dram_copy_product": dcp})
    runs, table = pd.DataFrame(rows), pd.DataFrame(per_group)
    slope, intercept = al.fit_pfi_ols(table["dram_copy_product"].to_numpy(), table["pfi_ratio"].to_numpy())
    preds = table.assign(pfi_pred=intercept + slope * table["dram_copy_product"])
    return runs, table[["group", "pfi_ratio"]], preds


def random_nonconcave(rng: np.random.Generator, n: int, K: int = 6) -> tuple[np.ndarray, np.ndarray]:
    widths = rng.uniform(50, 400, (n, K - 1))
    P = np.concatenate([rng.uniform(100, 800, (n, 1)), np.zeros((n, K - 1))], 1)
    P[:, 1:] = P[:, :1] + np.cumsum(widths, 1)
    T = np.concatenate([rng.uniform(0, 300, (n, 1)), np.zeros((n, K - 1))], 1)
    T[:, 1:] = T[:, :1] + np.cumsum(rng.uniform(-0.5, 5.0, (n, K - 1)) * widths, 1)
    return P, T


def timed(fn, *args, **kw):
    wall, cpu = time.perf_counter(), time.process_time()
    out = fn(*args, **kw)
    return out, time.perf_counter() - wall, time.process_time() - cpu


def oracle_scaling(table: al.GroupTable, sizes: list[int], workloads: dict[int, int], cut: float,
                   reference_up_to: int) -> list[dict]:
    rows = []
    rng = np.random.default_rng(1)
    for n in sizes:
        idx = rng.integers(0, len(table.groups), (workloads[n], n))
        c = table.curves.take(idx)
        budget = (1 - cut) * c.ceiling_w.sum(-1)
        sol, wall, cpu = timed(orc.oracle, c.power_w, c.throughput, budget)
        rows.append({"jobs_per_workload": n, "curves": "emulated groups (25)", "workloads": len(idx),
                     "wall_s_per_workload": wall / len(idx), "cpu_s_per_workload": cpu / len(idx),
                     "milp_fallback_fraction": float((~sol.certified).mean()),
                     "hull_bound_gap_rel": float(np.max((sol.bound - sol.throughput.sum(-1)) / sol.bound)),
                     "proven_gap_rel": float(np.max(sol.gap / sol.bound)), "diff_to_plain_milp": np.nan})
    for n in sizes:
        for _ in range(100):  # an instance the greedy cannot certify (the exact fallback runs)
            P, T = random_nonconcave(rng, n)
            budget = rng.uniform(0.6, 0.9) * P[:, -1].sum()
            if not orc.hull_greedy(P[None], T[None], np.array([budget])).certified[0]:
                break
        greedy = orc.hull_greedy(P[None], T[None], np.array([budget]))
        sol, wall, cpu = timed(orc.oracle, P[None], T[None], np.array([budget]))
        diff = np.nan
        if n <= reference_up_to:
            ref = orc.milp_oracle(P, T, budget)
            diff = float(sol.throughput.sum() - ref.throughput.sum())
        rows.append({"jobs_per_workload": n, "curves": "distinct random non-concave", "workloads": 1,
                     "wall_s_per_workload": wall, "cpu_s_per_workload": cpu,
                     "milp_fallback_fraction": float((~sol.certified).mean()),
                     "hull_bound_gap_rel": float((greedy.bound[0] - sol.throughput.sum()) / greedy.bound[0]),
                     "proven_gap_rel": float(sol.gap[0] / sol.bound[0]), "diff_to_plain_milp": diff})
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", default=str(REPO / "config" / "config.yaml"))
    ap.add_argument("--quick", action="store_true", help="smaller sizes (a smoke test of this script)")
    args = ap.parse_args()
    cfg_all = load_config(args.config)
    runs, pfi_table, preds = emulated_campaign(cfg_all)
    cfg = al.SimulationConfig.from_dict(cfg_all.get("allocation", {}))
    if args.quick:
        cfg.n_workloads, cfg.oos_splits = 50, 2
    table = al.group_table(runs, pfi_table, preds, cfg)
    sizes = [100, 1000] if args.quick else [100, 1000, 10000]
    scaling = pd.DataFrame(oracle_scaling(table, sizes, {100: 200, 1000: 20, 10000: 4}, 0.30,
                                          reference_up_to=1000))

    rng = np.random.default_rng(cfg.seed)
    indices = {mix: al.sample_workloads(table.groups, mix, cfg.n_workloads, cfg.jobs_per_workload, rng,
                                        cfg.pretraining_fraction) for mix in cfg.mixes}
    wall = cpu = 0.0
    for index in indices.values():
        _, w, c = timed(al.evaluate_policies, table, index, cfg.cuts, cfg)
        wall, cpu = wall + w, cpu + c
    out, full_wall, full_cpu = timed(al.simulate, table, cfg)
    head = out["headline"].set_index("policy")
    sim = pd.DataFrame([
        {"what": f"main simulation: {len(cfg.mixes)} mixes x {len(cfg.cuts)} cuts x {cfg.n_workloads} workloads "
                 f"x {cfg.jobs_per_workload} jobs x {len(cfg.policies)} policies", "wall_s": wall, "cpu_s": cpu},
        {"what": f"simulate(): main + SLA tiers + {cfg.oos_splits} out-of-sample splits", "wall_s": full_wall,
         "cpu_s": full_cpu},
    ])
    concave = is_concave(table.curves)
    lines = [
        "# Allocation oracle and simulation benchmark", "",
        f"Machine: {os.cpu_count()} CPUs visible (shared); numpy {np.__version__}. Curves: "
        f"{len(table.groups)} emulated headline groups + 0.5 % noise ({int(concave.sum())} concave). "
        "Cut 30 % for the oracle rows.", "",
        "## Oracle scaling", "",
        scaling.to_markdown(index=False, floatfmt=".4g"), "",
        "`hull_bound_gap_rel`: the hull relaxation's bound minus the oracle's value, relative (0 where the "
        "greedy's certificate holds). `proven_gap_rel`: what is left unproven (0 = exact optimum; > 0 only if "
        "the MILP hit its 120 s limit). `diff_to_plain_milp`: oracle minus the MILP without domain fixing "
        "(tokens/s; blank where that reference was not run).", "",
        "## Simulation", "",
        sim.to_markdown(index=False, floatfmt=".1f"), "",
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
        pd.concat([scaling.assign(section="oracle_scaling"), sim.assign(section="simulation")]).to_csv(
            OUT / "allocation.csv", index=False)
        print(f"wrote {OUT / 'allocation.md'} and {OUT / 'allocation.csv'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
