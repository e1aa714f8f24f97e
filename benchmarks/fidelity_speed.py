"""CPU time of the fidelity computation (wattflex.analysis.fidelity) on the default campaign's
groups, part by part, on one core. Needs the default campaign's runs.parquet and pfi.parquet:

    snakemake --cores 2                               # or any run of config/config.yaml
    python benchmarks/fidelity_speed.py [results/paper-h200-emulated]

Prints a table and writes it to benchmarks/results/fidelity_speed.csv. CPU time
(``time.process_time``), so other processes on the machine inflate it less than wall time.
"""

import gc
import sys
import time
from pathlib import Path

import pandas as pd

from wattflex.analysis import calibration as cal
from wattflex.analysis import fidelity as fid
from wattflex.analysis import public_sweeps as ps
from wattflex.config import groups, load_config
from wattflex.provenance import read_parquet

REPO = Path(__file__).resolve().parents[1]


def timed(label, fn, rows):
    cpu, wall = time.process_time(), time.perf_counter()
    out = fn()
    rows.append(
        {"part": label, "cpu_s": time.process_time() - cpu, "wall_s": time.perf_counter() - wall}
    )
    return out


def main(results: Path) -> pd.DataFrame:
    cfg = load_config(REPO / "config" / "config.yaml")
    jobs = {g["id"]: {"group": g, "model_facts": cfg["_catalog"][g["model"]]} for g in groups(cfg)}
    runs, pfi = read_parquet(results / "runs.parquet"), read_parquet(results / "pfi.parquet")
    paper = str(REPO / "resources" / "paper" / "tables")
    gc.freeze()  # as the rule script does (statsmodels' Holm runs gc.collect per call)
    models = fid.group_models(jobs, runs)
    meta = fid.group_meta(models, fid.published_pfi(models, paper))
    rows: list[dict] = []
    timed(f"noise-free model ({len(models)} groups)", lambda: fid.noise_free_pfi(models), rows)
    timed("one noise-seed draw", lambda: fid.seed_pfi(models, cfg["campaign"], 1), rows)
    timed(
        "metrics incl. Kruskal-Wallis/Dunn, one set",
        lambda: fid.metrics(pfi.set_index("group")["pfi_ratio"], meta),
        rows,
    )
    timed(
        f"sensitivity, every group ({len(fid.perturbations())} perturbations: constants and HBM power)",
        lambda: fid.sensitivity_runs(models, meta),
        rows,
    )
    timed(
        f"fidelity() total, {fid.DEFAULT_SEEDS} seeds",
        lambda: fid.fidelity(
            models, pfi.set_index("group")["pfi_ratio"], cfg["campaign"], cfg["seed"], paper
        ),
        rows,
    )
    timed(
        f"leave-one-table-out ({len(cal.FIT_SETS)} anchor refits, {len(cal.ANCHOR_GRID_MHZ)}-point grid)",
        lambda: cal.leave_one_table_out(models, paper),
        rows,
    )
    timed(
        "public sweeps (Perseus A100 leave one job out, SM-clock profiles)",
        lambda: ps.perseus_a100_rows(
            ps.PERSEUS / "power_limit_sweeps_A100.csv",
            sorted(ps.PERSEUS.glob("sm_frequency_profile_*.csv")),
        ),
        rows,
    )
    return pd.DataFrame(rows)


if __name__ == "__main__":
    table = main(
        Path(sys.argv[1]) if len(sys.argv) > 1 else REPO / "results" / "paper-h200-emulated"
    )
    print(table.round(2).to_string(index=False))
    out = REPO / "benchmarks" / "results" / "fidelity_speed.csv"
    out.parent.mkdir(parents=True, exist_ok=True)
    table.to_csv(out, index=False)
