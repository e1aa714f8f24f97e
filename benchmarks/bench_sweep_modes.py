"""PFI from one-run sweeps (staircase, adaptive) against separate runs, on every emulated group.

Usage: python benchmarks/bench_sweep_modes.py [--config config/config.yaml] [--groups ID ...] [--seeds N]

For each group of the campaign (emulated backend, all sets):
- separate: one emulated run per cap (no repeats), each summarised with the campaign's
  protocol, PFI with its Monte Carlo CI (``pfi.pfi_table``) -- the paper's method;
- staircase / adaptive: one emulated run (``sweep.emulated.run_sweep``), per-cap rows from
  ``steady.cap_rows``, the same ``pfi_table``;
- truth: PFI of the emulator's noise-free model power and throughput at each cap (what an
  infinitely long, noise-free sweep would give), to show how far each mode is from it.
GPU-hours: separate = caps x (run duration + overhead) x GPUs; one-run modes = (their run
duration + one overhead) x GPUs; overhead = ``tables.run_overhead_s`` (launch, load, teardown).
Library calls in-process, no Snakemake. Writes benchmarks/results/sweep_modes.md and .csv.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd
from scipy import stats

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "workflow_scripts"))

from wattflex.config import groups, load_config, run_spec
from wattflex.pfi import pfi_ratio, pfi_table
from wattflex.provenance import provenance, write_csv
from wattflex.run_ids import run_id
from wattflex.runs.emulator.device import run_emulated
from wattflex.runs.sweep.algorithm import sweep_spec
from wattflex.runs.sweep.emulated import run_sweep
from wattflex.runs.sweep.steady import cap_rows
from wattflex.telemetry import SummaryProtocol, summarize_run

MODES = ("staircase", "adaptive")


def group_pfis(cfg: dict, g: dict, protocol: SummaryProtocol) -> dict:
    """Separate / staircase / adaptive / truth PFI and GPU-hours of one group."""
    pfi_cfg = cfg.get("pfi", {})
    overhead = float(cfg.get("tables", {}).get("run_overhead_s", 300))
    duration = float(cfg.get("run", {}).get("duration_s", 1800))
    kw = dict(
        throughput_col="tokens_per_s",
        power_sem_col="power_w_sem",
        throughput_sem_col="tokens_per_s_sem",
        mc_samples=int(pfi_cfg.get("mc_samples", 10_000)),
        ci=float(pfi_cfg.get("ci", 0.95)),
        seed=int(pfi_cfg.get("seed", 0)),
    )
    out = {
        "group": g["id"],
        "set": g["set"],
        "cluster": g["cluster"],
        "gpus": g["gpus"],
        "n_caps": len(g["caps"]),
    }

    rows, truth_p, truth_t = [], [], []
    for cap in g["caps"]:
        tel, steps, facts = run_emulated(run_spec(cfg, g["id"], run_id(cap, 0)))
        rows.append(
            {
                "group": g["id"],
                "cap_w": cap,
                "gpus": g["gpus"],
                **summarize_run(tel, steps, protocol),
            }
        )
        truth_p.append(facts["model_power_w"][0])
        truth_t.append(facts["model_tokens_per_s"][0])
    sep = pfi_table(pd.DataFrame(rows), **kw).iloc[0]
    out.update(
        pfi_separate=sep["pfi_ratio"],
        ci_low=sep["ci95_low"],
        ci_high=sep["ci95_high"],
        pfi_truth=pfi_ratio(truth_p, truth_t),
        gpu_h_separate=len(g["caps"]) * (duration + overhead) * g["gpus"] / 3600,
    )

    for mode in MODES:
        t0 = time.perf_counter()
        tel, steps, record = run_sweep(sweep_spec(cfg, g["id"], mode))
        per_cap = cap_rows(tel, steps, record, protocol)
        table = pd.DataFrame(
            [{"group": g["id"], "cap_w": c, "gpus": g["gpus"], **r} for c, r in per_cap.items()]
        )
        res = pfi_table(table, **kw).iloc[0]
        out.update(
            {
                f"pfi_{mode}": res["pfi_ratio"],
                f"ci_low_{mode}": res["ci95_low"],
                f"ci_high_{mode}": res["ci95_high"],
                f"run_s_{mode}": record["duration_s"],
                f"stop_{mode}": record["stop_reason"],
                f"visits_{mode}": len(record["visits"]),
                f"all_ok_{mode}": all(v["reason"] == "ok" for v in record["visits"]),
                f"gpu_h_{mode}": (record["duration_s"] + overhead) * g["gpus"] / 3600,
                f"wall_s_{mode}": time.perf_counter() - t0,
            }
        )
    return out


def summarize(df: pd.DataFrame) -> pd.DataFrame:
    """One row per mode: errors vs separate runs and vs truth, CI coverage, rank agreement
    (Spearman within each seed, averaged), cost (GPU-hours per seed)."""
    rows = []
    n_seeds = df["seed"].nunique()
    half_sep = (df["ci_high"] - df["ci_low"]) / 2
    for mode in ("truth", "separate") + MODES:
        pfi = df[f"pfi_{mode}"]
        d_sep, rel_truth = pfi - df["pfi_separate"], (pfi - df["pfi_truth"]).abs() / df["pfi_truth"]
        inside = (pfi >= df["ci_low"]) & (pfi <= df["ci_high"])
        # Two noisy estimates: is their difference inside the 95 % CI of a difference?
        own = (df[f"ci_high_{mode}"] - df[f"ci_low_{mode}"]) / 2 if mode in MODES else 0.0
        combined = d_sep.abs() <= np.sqrt(half_sep**2 + own**2)
        rho = lambda other: np.mean(
            [
                stats.spearmanr(part[f"pfi_{mode}"], part[other]).statistic
                for _, part in df.groupby("seed")
            ]
        )
        cost = df[f"gpu_h_{mode}"] if mode != "truth" else pd.Series(np.nan, index=df.index)
        saving = df["gpu_h_separate"] / cost
        rows.append(
            {
                "mode": mode,
                "median abs dPFI vs separate": d_sep.abs().median(),
                "median rel dPFI vs separate": (d_sep.abs() / df["pfi_separate"]).median(),
                "inside separate CI": inside.mean(),
                "inside combined CI": combined.mean() if mode != "separate" else 1.0,
                "Spearman vs separate": rho("pfi_separate"),
                "median rel err vs truth": rel_truth.median(),
                "p90 rel err vs truth": rel_truth.quantile(0.9),
                "Spearman vs truth": rho("pfi_truth"),
                "GPU-hours per campaign": cost.sum(min_count=1) / n_seeds,
                "saving (total)": df["gpu_h_separate"].sum() / cost.sum(min_count=1),
                "saving (median group)": saving.median(),
                "groups >= 10x": (saving >= 10).mean(),
            }
        )
    return pd.DataFrame(rows)


def markdown(df: pd.DataFrame, summary: pd.DataFrame, cfg: dict, wall_s: float) -> str:
    def fmt(x):
        return f"{x:.3f}" if isinstance(x, float) else str(x)

    def table(d: pd.DataFrame) -> str:
        head = "| " + " | ".join(d.columns) + " |\n|" + "---|" * len(d.columns) + "\n"
        return head + "\n".join(
            "| " + " | ".join(fmt(v) for v in r) + " |" for r in d.itertuples(index=False)
        )

    per_group = df[df["seed"] == df["seed"].min()][
        [
            "group",
            "gpus",
            "n_caps",
            "pfi_truth",
            "pfi_separate",
            "ci_low",
            "ci_high",
            "pfi_staircase",
            "pfi_adaptive",
            "gpu_h_separate",
            "gpu_h_staircase",
            "gpu_h_adaptive",
            "stop_adaptive",
        ]
    ]
    crit = cfg.get("staircase", {})
    return (
        "# Sweep modes: one-run staircase / adaptive vs separate runs (EMULATED H200/H100)\n\n"
        f"All values from the emulated backend; campaign `{cfg['campaign']}`, {df['group'].nunique()} groups x "
        f"{df['seed'].nunique()} seed(s) (campaign seed + 0..n-1: new silicon, new noise, new truth), "
        f"summary protocol `{cfg.get('summary', {}).get('aggregate', 'top10')}`, staircase settings "
        f"{crit or 'defaults'}. Separate runs: one {cfg['run']['duration_s']:g}-s run per cap (no repeats); "
        f"GPU-hours include {cfg.get('tables', {}).get('run_overhead_s', 300):g} s overhead per run. "
        f"`truth`: PFI of the emulator's noise-free model at each cap. Benchmark wall time {wall_s:.0f} s.\n\n"
        "## Summary (all seeds)\n\n"
        + table(summary)
        + "\n\n## Per group (first seed)\n\n"
        + table(per_group)
        + "\n"
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", default=str(REPO / "config" / "config.yaml"))
    ap.add_argument("--groups", nargs="*", help="only these group ids")
    ap.add_argument("--out", default=str(REPO / "benchmarks" / "results" / "sweep_modes"))
    ap.add_argument("--seeds", type=int, default=1, help="repeat with campaign seed + 0..N-1")
    args = ap.parse_args()
    base = load_config(args.config)
    if base["backend"] != "emulated":
        sys.exit("this benchmark runs the emulated backend; set backend: emulated")
    protocol = SummaryProtocol.from_config(base.get("summary"))
    todo = [g for g in groups(base) if not args.groups or g["id"] in args.groups]
    t0 = time.perf_counter()
    rows = []
    for k in range(args.seeds):
        cfg = {**base, "seed": int(base.get("seed", 0)) + k}
        for g in todo:
            rows.append({"seed": cfg["seed"], **group_pfis(cfg, g, protocol)})
            r = rows[-1]
            print(
                f"{k} {g['id']:42s} truth {r['pfi_truth']:.3f} sep {r['pfi_separate']:.3f} [{r['ci_low']:.3f}, "
                f"{r['ci_high']:.3f}] stair {r['pfi_staircase']:.3f} adapt {r['pfi_adaptive']:.3f} "
                f"({r['stop_adaptive']}) GPU-h {r['gpu_h_separate']:.1f}/{r['gpu_h_staircase']:.2f}/"
                f"{r['gpu_h_adaptive']:.2f}",
                flush=True,
            )
    df = pd.DataFrame(rows)
    summary = summarize(df)
    wall = time.perf_counter() - t0
    with pd.option_context("display.width", 200, "display.max_columns", 20):
        print(summary.round(3).to_string(index=False))
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".md").write_text(markdown(df, summary, base, wall))
    write_csv(
        df,
        out.with_suffix(".csv"),
        provenance(
            params={"config": args.config, "groups": args.groups, "seeds": args.seeds},
            backend="emulated",
        ),
        benchmark="sweep_modes",
    )
    print(f"wrote {out.with_suffix('.md')} ({wall:.0f} s)")


if __name__ == "__main__":
    main()
