"""``knob: clock`` through the real workflow: a clock group beside a cap group, emulated,
to runs.parquet, the PFI table and the flexibility statement's knob menu (real Snakemake)."""

import pytest
import yaml

from wattflex.provenance import read_csv, read_json, read_parquet

from .conftest import snakemake


@pytest.mark.slow
def test_a_clock_group_runs_at_its_clocks_and_gets_a_clock_pfi(tmp_path, tiny_config):
    cfg = yaml.safe_load(tiny_config.read_text())
    caps = {**cfg["groups"][0], "caps": [500, 700]}
    clk = {k: v for k, v in cfg["groups"][0].items() if k not in ("caps", "cap_grid")}
    clk.update(id="clk-x8", knob="clock", clocks=[990, 1590, 1980])
    cfg.update(groups=[caps, clk], repeats=[])
    config = tmp_path / "config.yaml"
    config.write_text(yaml.safe_dump(cfg))
    snakemake(
        "results/tiny/pfi.parquet",
        "results/tiny/statement/knobs.csv",
        "--cores",
        "2",
        "--configfile",
        str(config),
        cwd=tmp_path,
    )
    run = read_json(tmp_path / "results/tiny/runs/clk-x8/clk990/run.json")
    assert run["knob"] == "clock" and run["clock_mhz"] == 990 and run["cap_w"] == 700
    runs = read_parquet(tmp_path / "results/tiny/runs.parquet")
    clocks = runs[runs["group"] == "clk-x8"].sort_values("clock_mhz")
    assert list(clocks["run_id"]) == ["clk990", "clk1590", "clk1980"] and set(clocks["knob"]) == {
        "clock"
    }
    assert (
        clocks["power_w"].is_monotonic_increasing and clocks["tokens_per_s"].is_monotonic_increasing
    )
    assert runs[runs["group"] == caps["id"]]["clock_mhz"].isna().all()
    pfi = read_parquet(tmp_path / "results/tiny/pfi.parquet").set_index("group")
    assert pfi.loc["clk-x8", "knob"] == "clock" and pfi.loc["clk-x8", "uncapped_cap_w"] == 1980
    assert pfi.loc["clk-x8", "pfi_ratio"] > 0 and pfi.loc[caps["id"], "knob"] == "cap"
    assert pfi.loc[caps["id"], "pfi_ratio"] > 0
    # the flexibility statement's knob menu takes the clock group's curve as its job's clock lock
    page = (tmp_path / "results/tiny/statement/statement.md").read_text()
    assert f"clock-lock curves (knob: clock groups) for {caps['id']} from clk-x8" in page
    knobs = read_csv(tmp_path / "results/tiny/statement/knobs.csv")
    assert "caps + clock" in set(knobs["strategy"])
    jobs = read_csv(tmp_path / "results/tiny/statement/knob_jobs.csv")
    assert jobs["job"].str.endswith(f":{caps['id']}").all()  # the clock group is no job of its own
    assert jobs["why"].str.contains("clock ").all()
    assert not jobs["why"].str.contains("clock unavailable").any()
