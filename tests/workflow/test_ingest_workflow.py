"""The two shipped real campaigns (Zeus NSDI'23, Perseus SOSP'24) end to end through
Snakemake: ingest -> runs.parquet -> pfi.parquet -> ingest report and figures."""

import re

import pandas as pd
import pytest

from wattflex.pfi import STATUSES
from wattflex.provenance import read_parquet, read_parquet_meta, read_png_meta

from .conftest import REPO, snakemake

CAMPAIGNS = {  # campaign -> (data folder, raw file glob)
    "zeus-nsdi23": ("zeus-nsdi23", "summary_power_*.csv"),
    "perseus-sosp24": ("perseus-sosp24", "power_limit_sweeps_*.csv"),
}


@pytest.fixture(scope="module", params=list(CAMPAIGNS))
def campaign_run(request, tmp_path_factory, resources):
    name = request.param
    data = resources / "external" / CAMPAIGNS[name][0]
    work = tmp_path_factory.mktemp(name)
    snakemake("--cores", "2", "--configfile", str(REPO / "config" / f"{name}.yaml"), cwd=work)
    raw = pd.concat(
        [pd.read_csv(f) for f in sorted(data.glob(CAMPAIGNS[name][1]))], ignore_index=True
    )
    return name, work, work / "results" / name, raw


@pytest.mark.slow
def test_real_campaign_end_to_end(campaign_run):
    name, _, results, raw = campaign_run
    runs = read_parquet(results / "runs.parquet")
    assert len(runs) == len(raw) and set(runs["backend"]) == {"ingest"}
    assert read_parquet_meta(results / "runs.parquet")["provenance"]["backend"] == "ingest"
    pfi = read_parquet(results / "pfi.parquet")
    assert sorted(pfi["group"]) == sorted(runs["group"].unique())
    assert set(pfi["status"]) <= set(STATUSES)
    # the robust PFI is defined where the ratio is meaningful and equals it on clean sweeps
    ok = pfi[pfi["status"] == "ok"]
    assert (ok["robust_status"] == "ok").all()
    assert (abs(ok["pfi_robust"] - ok["pfi_ratio"]) <= 0.25 * ok["pfi_ratio"]).all()
    report = (results / "ingest_report.md").read_text()
    counts = dict(re.findall(r"\*\*([a-z -]+): (\d+)\*\*", report))
    assert sum(map(int, counts.values())) == len(pfi)
    assert int(counts.get("ok", 0)) == len(ok)
    assert "| telemetry-PFI correlations and PFI predictor | skipped |" in report
    table = pd.read_csv(results / "tables" / "pfi_groups.csv")
    assert len(table) == len(pfi)
    for png in ("curves_normalized", "curves_raw", "pfi_robust_vs_ratio"):
        assert (results / "figures" / f"{png}.png").stat().st_size > 10_000
        # each figure says what made it, like every other campaign's figures
        assert (
            read_png_meta(results / "figures" / f"{png}.png")["provenance"]["backend"] == "ingest"
        )
    # stages whose inputs ingested data lacks are not scheduled at all
    assert not (results / "predictor").exists() and not (results / "stats").exists()


@pytest.mark.slow
def test_real_campaign_rerun_is_a_no_op(campaign_run):
    name, work, _, _ = campaign_run
    proc = snakemake(
        "-n", "--cores", "2", "--configfile", str(REPO / "config" / f"{name}.yaml"), cwd=work
    )
    assert "Nothing to be done" in proc.stdout + proc.stderr


def test_missing_data_folder_is_a_clear_error(tmp_path):
    proc = snakemake(
        "-n",
        "--configfile",
        str(REPO / "config" / "zeus-nsdi23.yaml"),
        "--config",
        "ingest={path: /nonexistent/zeus}",
        cwd=tmp_path,
        check=False,
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0
    assert (
        "config error at ingest.path" in out
        and "/nonexistent/zeus" in out
        and "does not exist" in out
    )


def test_ingest_campaign_needs_an_ingest_section(tmp_path):
    cfg = tmp_path / "c.yaml"
    cfg.write_text("campaign: mine\nsource: ingest\n")
    proc = snakemake("-n", "--configfile", str(cfg), cwd=tmp_path, check=False)
    assert proc.returncode != 0 and "'ingest' is a required property" in proc.stdout + proc.stderr


@pytest.mark.slow
def test_an_ingest_campaign_with_a_bad_file_logs_one_line(tmp_path):
    """An ingest campaign with a bad file stops (non-zero) and its rule log names the file and line,
    no traceback."""
    data = tmp_path / "data"
    data.mkdir()
    good = (REPO / "tests" / "data" / "ingest_sweep.csv").read_text().splitlines()
    bad = good[:3] + [good[3].replace(",", ",abc,", 1)] + good[4:]  # one line with an extra field
    (data / "sweep.csv").write_text("\n".join(bad) + "\n")
    cfg = tmp_path / "c.yaml"
    cfg.write_text(
        f"campaign: mine\nsource: ingest\ningest: {{format: sweep-table, path: {data}, on_bad_rows: error}}\n"
    )
    proc = snakemake("--cores", "1", "--configfile", str(cfg), cwd=tmp_path, check=False)
    assert proc.returncode != 0, (proc.stdout + proc.stderr)[-2000:]
    log = (tmp_path / "logs" / "mine" / "ingest_runs.log").read_text()
    assert "Traceback" not in log and "sweep.csv line 4: 15 fields, the header has 14" in log, log
    assert "ingest_runs: error: " in proc.stderr, proc.stderr[-2000:]
