"""The knob menu on the default campaign: deep events that caps alone cannot meet.

Usage: python benchmarks/bench_knobs.py [--config config/config.yaml] [--jobs 100] [--seed 0]

Site: ``--jobs`` jobs drawn from the campaign's headline groups (the production mix of
``allocation``: pretraining with probability ``pretraining_fraction``), each with
- its cap curve: the emulator's model at every cap of the group, with the 0.5 % noise of
  ``bench_allocation.emulated_campaign`` (the same curves the allocation benchmark uses);
- its clock curve: the DVFS model at locked SM clocks (``wattflex.runs.emulator.clock_knob``);
- pause at idle power (``gpus * GPUSpec.idle_w``);
- requeue: restart = the resource plan's start-up (``wattflex.runs.plan``: build + first step),
  the checkpoint write time from the plan, and the age of its last checkpoint drawn uniform in
  ``[0, CHECKPOINT_INTERVAL_S)``.
Events: 1 h, 10 min notice (and one without notice), depths 30-80 % of the site's uncapped
GPU power. For each: tokens lost by caps only (infeasible past the floors), pause only
(the cheapest set of pauses), caps + clock, and the chosen mix of every knob, with the
MILP's time. Writes benchmarks/results/knobs.md.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "benchmarks"))
sys.path.insert(0, str(REPO / "workflow_scripts"))

from bench_allocation import emulated_campaign  # noqa: E402

from wattflex.allocation import knobs as kn  # noqa: E402
from wattflex.allocation.curves import curves_from_runs  # noqa: E402
from wattflex.allocation.simulate import sample_workloads  # noqa: E402
from wattflex.config import groups, load_config  # noqa: E402
from wattflex.gpus import GPUS  # noqa: E402
from wattflex.runs.emulator import step as em  # noqa: E402
from wattflex.runs.emulator.clock_knob import clock_curve  # noqa: E402
from wattflex.runs.plan import plan_campaign  # noqa: E402

OUT = REPO / "benchmarks" / "results" / "knobs.md"
# Assumed (no campaign measures it): a production job checkpoints every 30 minutes; the
# age of its last checkpoint at the event is uniform over that interval.
CHECKPOINT_INTERVAL_S = 1800.0
DEPTHS = (0.3, 0.5, 0.6, 0.7, 0.75, 0.8)
STRATEGIES = {
    "caps only": ("cap",),
    "pause only": ("pause",),
    "requeue only": ("requeue",),
    "caps + clock": ("cap", "clock"),
    "chosen mix": kn.KNOBS,
}


def site_jobs(cfg: dict, n: int, seed: int) -> list[kn.Job]:
    runs, _, _ = emulated_campaign(cfg, seed=seed)
    names, curves = curves_from_runs(runs)
    resolved = [g for g in groups(cfg) if g["set"] == "headline"]
    by_id = {g["id"]: g for g in resolved}
    plans = {p.group: p for p in plan_campaign(cfg, resolved)}
    meta = pd.DataFrame({"group": names, "task": [by_id[g]["task"] for g in names]})
    rng = np.random.default_rng(seed)
    index = sample_workloads(
        meta, "production", 1, n, rng, cfg["allocation"]["production"]["pretraining_fraction"]
    )[0]
    clock_of = {}
    jobs = []
    for k, gi in enumerate(index):
        g = by_id[names[gi]]
        gpu = GPUS[g["gpu"]]
        if gi not in clock_of:
            spec = em.JobSpec.from_config(g, cfg["_catalog"][g["model"]])
            leak = em.gpu_leakages(seed + int(gi), spec.gpus)
            _, P, T = clock_curve(spec, gpu, leak)
            clock_of[gi] = kn.clock_on_cap((curves.power_w[gi], curves.throughput[gi]), (P, T))
        plan = plans[g["id"]]
        jobs.append(
            kn.Job(
                f"{k:03d}:{g['id']}",
                (curves.power_w[gi], curves.throughput[gi]),
                idle_w=g["gpus"] * gpu.idle_w,
                restart_s=plan.startup_s,
                checkpoint_write_s=plan.checkpoint_write_s,
                since_checkpoint_s=float(rng.uniform(0, CHECKPOINT_INTERVAL_S)),
                clock=clock_of[gi],
            )
        )
    return jobs


def study(
    jobs: list[kn.Job], duration_s: float, notice_s: float
) -> tuple[pd.DataFrame, dict[float, kn.Choice]]:
    site = sum(j.ceiling_w for j in jobs)
    rows, mixes = [], {}
    for depth in DEPTHS:
        event = kn.Event(depth * site, duration_s, notice_s)
        row = {"depth": f"{depth:.0%}", "shed_kw": depth * site / 1e3}
        for name, knobs in STRATEGIES.items():
            t0 = time.perf_counter()
            c = kn.choose(jobs, event, knobs)
            row[f"{name} Mtok"] = c.tokens_lost / 1e6 if c.feasible else "infeasible"
            if name == "chosen mix":
                row["mix s"] = time.perf_counter() - t0
                row["mix knobs"] = ", ".join(f"{k} {v}" for k, v in sorted(c.counts().items()))
                mixes[depth] = c
        rows.append(row)
    return pd.DataFrame(rows), mixes


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--config", default=str(REPO / "config" / "config.yaml"))
    ap.add_argument("--jobs", type=int, default=100)
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    cfg = load_config(a.config)
    jobs = site_jobs(cfg, a.jobs, a.seed)
    site = sum(j.ceiling_w for j in jobs)
    floors = sum(j.cap[0][0] for j in jobs)
    fmt = lambda v: f"{v:.3f}" if isinstance(v, float) else str(v)  # noqa: E731
    text = [
        "# The knob menu on the default campaign: deep events",
        "",
        f"Command: `python benchmarks/bench_knobs.py --jobs {a.jobs} --seed {a.seed}` "
        "(module docstring: curves, restart times, checkpoint ages)",
        "",
        f"Site: {a.jobs} jobs (production mix of the headline groups, emulated H200), "
        f"{site / 1e3:.1f} kW uncapped GPU power; the caps' floors sum to {floors / 1e3:.1f} kW, "
        f"so caps alone cannot cut deeper than {1 - floors / site:.1%}. Tokens lost in millions "
        "over the event; `infeasible`: the knobs cannot reach the target.",
        "",
    ]
    for duration, notice in ((3600.0, 600.0), (3600.0, 0.0)):
        table, mixes = study(jobs, duration, notice)
        text += [
            f"## {duration / 3600:g} h event, {notice / 60:g} min notice",
            "",
            "```",
            table.to_string(index=False, formatters={c: fmt for c in table.columns}),
            "```",
            "",
        ]
    deep = max(d for d in mixes if mixes[d].feasible)
    c = mixes[deep]
    shown = c.table.sort_values(["knob", "job"]).groupby("knob", sort=True).head(3)
    text += [
        f"### Which job took which knob and why ({deep:.0%} cut, 1 h, no notice; 3 jobs per knob)",
        "",
        "Prices in tokens per kWh shed at each knob's deepest point; `*` marks the one taken.",
        "",
        "```",
        shown[["job", "knob", "shed_kw", "tokens_lost", "why"]].to_string(
            index=False,
            formatters={"shed_kw": "{:.2f}".format, "tokens_lost": "{:,.0f}".format},
            max_colwidth=200,
        ),
        "```",
        "",
    ]
    out = "\n".join(text)
    print(out)
    OUT.write_text(out + "\n")


if __name__ == "__main__":
    main()
