"""`sweep: staircase | adaptive` through real Snakemake: one run per group, per-cap summaries
in the runs.parquet contract, PFI downstream unchanged."""

import re

import numpy as np
import pytest
import yaml

from wattflex.provenance import read_json, read_parquet

from .conftest import snakemake


def sweep_config(tmp_path, tiny_config, mode, n_groups=3):
    cfg = yaml.safe_load(tiny_config.read_text())
    cfg.update(campaign=f"tiny-{mode}", sweep=mode, groups=cfg["groups"][:n_groups])
    path = tmp_path / f"{mode}.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


def test_dry_run_plans_one_run_per_group_and_no_separate_runs(tmp_path, tiny_config):
    proc = snakemake(
        "-n",
        "--cores",
        "2",
        "--configfile",
        str(sweep_config(tmp_path, tiny_config, "adaptive")),
        cwd=tmp_path,
    )
    jobs = dict(re.findall(r"^(\w+)\s+(\d+)$", proc.stdout, re.M))
    assert jobs["run_staircase"] == "3" and jobs["summarize_staircase"] == "12"
    # Nor the separate runs' per-group summary jobs (rules/runs.smk: summaries_<group>).
    assert "run_at_cap" not in jobs and not any(r.startswith("summaries_") for r in jobs)
    assert jobs["collect_runs"] == "1" and jobs["compute_pfi"] == "1" and "core_figures" in jobs


@pytest.mark.slow
def test_staircase_campaign_to_pfi(tmp_path, tiny_config):
    snakemake(
        "results/tiny-staircase/pfi.parquet",
        "--cores",
        "2",
        "--configfile",
        str(sweep_config(tmp_path, tiny_config, "staircase", n_groups=2)),
        cwd=tmp_path,
    )
    out = tmp_path / "results" / "tiny-staircase"
    runs = read_parquet(out / "runs.parquet")
    assert len(runs) == 2 * 4 and (runs["repeat"] == 0).all()  # repeats belong to separate sweeps
    assert set(runs["sweep_mode"]) == {"staircase"} and set(runs["aggregate"]) == {"mean"}
    assert set(runs["backend"]) == {"emulated"}
    assert (runs["power_per_gpu_w"] <= runs["cap_w"] * 1.01).all()
    pfi = read_parquet(out / "pfi.parquet")
    assert len(pfi) == 2 and np.isfinite(pfi["pfi_ratio"]).all() and (pfi["pfi_ratio"] > 1).all()
    for gid in pfi["group"]:
        run = read_json(out / "runs" / gid / "staircase" / "run.json")
        assert (
            run["limit_restored_w"] == 700 and run["duration_s"] < 4 * 420
        )  # one run, shorter than 4
        assert (out / "runs" / gid / "staircase" / "cap700" / "telemetry.parquet").is_file()
