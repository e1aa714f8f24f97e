import re

import numpy as np
import pytest

from wattflex.provenance import read_parquet, read_parquet_meta

from .conftest import REPO, snakemake


def planned_jobs(stdout: str) -> dict[str, int]:
    """Parse the job-count table of `snakemake -n` into {rule: count}."""
    counts = {}
    for line in stdout.splitlines():
        m = re.match(r"^(\w+)\s+(\d+)$", line.strip())
        if m and m.group(1) != "total":
            counts[m.group(1)] = int(m.group(2))
    return counts


def test_dry_run_of_full_default_grid_plans_every_run(tmp_path, default_config):
    from wattflex.config import expand_runs

    proc = snakemake(
        "-n", "--cores", "2", "--configfile", str(REPO / "config" / "config.yaml"), cwd=tmp_path
    )
    jobs = planned_jobs(proc.stdout)
    n_runs = len(expand_runs(default_config))
    assert (
        jobs["run_at_cap"] == n_runs == 210
    )  # Table 4 grid; dense-ft-llama70b-x16 has 3 caps (Table 6)
    # One summary job per sweep group (rules/runs.smk), none per run.
    summaries = {rule: n for rule, n in jobs.items() if rule.startswith("summaries_")}
    assert len(summaries) == len(default_config["groups"]) == 35 and set(summaries.values()) == {1}
    assert jobs["compute_pfi"] == 1 and jobs["collect_runs"] == 1


@pytest.mark.slow
def test_tiny_campaign_end_to_end(tiny_run):
    runs = read_parquet(tiny_run / "runs.parquet")
    assert len(runs) == 6 + 4 + 4 + 1  # the first group on six caps, two on four, one repeat
    assert set(runs["backend"]) == {"emulated"}
    pfi = read_parquet(tiny_run / "pfi.parquet")
    assert len(pfi) == 3
    ok = pfi[pfi["status"] == "ok"]
    assert len(ok) >= 2
    assert np.isfinite(ok["pfi_ratio"]).all() and (ok["ci95_low"] <= ok["pfi_ratio"]).all()
    meta = read_parquet_meta(tiny_run / "pfi.parquet")
    assert meta["provenance"]["backend"] == "emulated"
    for png in (
        "fig2_power_tokens_over_time",
        "curves_normalized",
        "pfi_by_cluster",
        "clocks_vs_cap",
    ):
        assert (tiny_run / "figures" / f"{png}.png").stat().st_size > 10_000
    assert (tiny_run / "tables" / "table6_pfi.csv").is_file()


@pytest.mark.slow
def test_rerun_is_a_no_op(tiny_campaign):
    assert tiny_campaign.plan() == {}


def test_bad_config_fails_before_any_job(tmp_path, tiny_config):
    bad = tmp_path / "bad.yaml"
    bad.write_text(tiny_config.read_text().replace("model: gpt-oss-20b", "model: gpt-99"))
    proc = snakemake("-n", "--configfile", str(bad), cwd=tmp_path, check=False)
    assert proc.returncode != 0
    assert "groups[1].model: unknown model 'gpt-99'" in proc.stdout + proc.stderr


def test_snakemake_lint_is_clean(tmp_path):
    proc = snakemake(
        "--lint", "--configfile", str(REPO / "config" / "config.yaml"), cwd=tmp_path, check=False
    )
    assert "Congratulations, your workflow is in a good condition" in proc.stdout + proc.stderr, (
        proc.stdout + proc.stderr
    )
