"""Allocation on the real Zeus / Perseus curves: equal weight vs PFI-aware vs oracle.

PFI-aware uses the *measured* robust PFI (no telemetry predictor exists for these traces:
they carry no DCGM metrics). Every job's throughput is normalised to its own uncapped
throughput because the traces' units differ between jobs. Random mix only (no
pretraining/fine-tuning labels). Needs the ingest campaigns first:

    snakemake --cores all --configfile config/zeus-nsdi23.yaml
    snakemake --cores all --configfile config/perseus-sosp24.yaml
    python benchmarks/allocation_real_curves.py            # prints and saves a table
"""

import sys
from pathlib import Path

import numpy as np
import pandas as pd

from wattflex.allocation.curves import Curves, curves_from_runs
from wattflex.allocation.simulate import (
    GroupTable,
    SimulationConfig,
    evaluate_policies,
    sample_workloads,
    summarize,
)
from wattflex.provenance import read_parquet

REPO = Path(__file__).resolve().parents[1]
POLICIES = ["equal-weight", "pfi-aware", "oracle"]


def study(results: Path) -> tuple[str, pd.DataFrame]:
    runs, pfi = (
        read_parquet(results / "runs.parquet"),
        read_parquet(results / "pfi.parquet").set_index("group"),
    )
    keep = pfi.index[pfi["robust_status"] == "ok"]
    runs = runs[runs["group"].isin(keep)]
    names, c = curves_from_runs(runs)
    curves = Curves(c.power_w, c.throughput / c.uncapped_throughput[:, None], c.cap_w)
    groups = pd.DataFrame(
        {
            "group": names,
            "task": "",
            "cluster": "dense",
            "gpus": runs.groupby("group")["gpus"].first().reindex(names).to_numpy(),
            "pfi_measured": pfi["pfi_ratio"].reindex(names).to_numpy(float),
            "pfi": pfi["pfi_robust"].reindex(names).to_numpy(float),
            "dram_copy_product": np.nan,
        }
    )
    cfg = SimulationConfig(
        n_workloads=500,
        jobs_per_workload=100,
        cuts=[0.1, 0.2, 0.3, 0.4],
        mixes=["random"],
        policies=POLICIES,
    )
    index = sample_workloads(
        groups,
        "random",
        cfg.n_workloads,
        cfg.jobs_per_workload,
        np.random.default_rng(cfg.seed),
        0.2,
    )
    out = evaluate_policies(
        GroupTable(groups, curves, "ingest"), index, cfg.cuts, cfg, policies=POLICIES
    )
    out["mix"] = "random"
    s = summarize(out)
    s["retained_pct"] = 100 * s["retained_fraction_mean"]
    head = f"{results.name}: {len(names)} groups with a robust PFI (of {len(pfi)}); 500 workloads x 100 jobs, random mix"
    return head, s[["cut", "policy", "retained_pct", "gap_closed", "frac_workloads_ge_equal"]]


def main() -> None:
    dirs = [Path(a) for a in sys.argv[1:]] or [
        REPO / "results" / c for c in ("zeus-nsdi23", "perseus-sosp24")
    ]
    text = [
        "# Allocation on measured curves (Zeus NSDI'23, Perseus SOSP'24)",
        "",
        "Command: `python benchmarks/allocation_real_curves.py` (after the two ingest campaigns)",
        "",
    ]
    for d in dirs:
        head, table = study(d)
        text += [
            f"## {head}",
            "",
            "```",
            table.to_string(index=False, float_format=lambda v: f"{v:.3f}"),
            "```",
            "",
        ]
    out = "\n".join(text)
    print(out)
    (REPO / "benchmarks" / "results" / "allocation_real_curves.md").write_text(out + "\n")


if __name__ == "__main__":
    main()
