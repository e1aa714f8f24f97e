"""Ingest of measured sweeps: the generic sweep table, Zeus/Perseus adapters, DCGM run
manifests, validation by line number, the ingest report and the ``wattflex ingest`` command."""
import csv
import io

import numpy as np
import pandas as pd
import pytest

from wattflex.cli import main as cli_main
from wattflex.ingest.reader import (
    RUN_COLUMNS,
    IngestError,
    align_clocks,
    config_files,
    ingest,
    read_table,
    validate_sweep,
)
from wattflex.ingest.summary import stage_applicability, status_counts
from wattflex.analysis.pfi import pfi_table
from wattflex.provenance import read_parquet

from tests.conftest import REPO

DATA = REPO / "tests" / "data"


def line_of(path, prefix: str) -> int:
    """1-based line number of the first line of ``path`` starting with ``prefix``."""
    return next(i for i, line in enumerate(path.read_text().splitlines(), 1) if line.startswith(prefix))


def test_sweep_table_becomes_contract_rows_with_source_lines():
    path = DATA / "ingest_sweep.csv"
    runs = ingest("sweep-table", path).runs
    assert list(runs.columns[:len(RUN_COLUMNS)]) == RUN_COLUMNS
    data_lines = [ln for ln in path.read_text().splitlines()[1:] if ln.strip()]
    assert len(runs) == len(data_lines)  # the blank line holds no run; every other line is one
    assert set(runs["backend"]) == {"ingest"}
    row = runs[(runs["group"] == "llama8b-pt-x8") & (runs["cap_w"] == 300)].iloc[0]
    assert row["source_line"] == line_of(path, "llama8b-pt-x8,300")  # physical line, past the blank one
    assert row["run_id"] == "cap300" and row["gpus"] == 8
    assert row["power_per_gpu_w"] == pytest.approx(row["power_w"] / 8)
    assert runs.loc[runs["repeat"] == 1, "run_id"].tolist() == ["cap700_r1"]
    # cluster derived as for generated groups: dense -> dense, MoE + LoRA -> moe-ft
    assert runs.groupby("group")["cluster"].first().to_dict() == {"llama8b-pt-x8": "dense", "olmoe-ft-x4": "moe-ft"}
    assert runs["dram_active"].notna().all() and runs["sm_clock_mhz"].isna().all()


def test_bad_rows_are_reported_by_line_and_nothing_is_dropped_silently():
    path = DATA / "ingest_sweep_bad.csv"
    expected = {  # line -> what its reason must say
        "job-a,500": "outside 1-2000 W per GPU", "job-a,400": "throughput is not a number: 'n/a'",
        "job-a,300,0,2400": "duplicate run", "job-a,300,0,2405": "duplicate run",
        "job-b,700": "dram_active = 41 is outside 0-1", "job-b,500": "gpu_model 'A100' differs from 'H100'",
        "job c": "group 'job c'", "job-d,700": "6 fields, the header has 8",
        "job-d,-200": "cap_w is missing or not positive", "job-d,500": "over 1.5x the cap",
    }
    with pytest.raises(IngestError) as err:
        ingest("sweep-table", path)
    for prefix, reason in expected.items():
        assert f"line {line_of(path, prefix)}: " in str(err.value)
    result = ingest("sweep-table", path, on_bad_rows="skip")
    reasons = dict(result.rejected.itertuples(index=False))
    for prefix, reason in expected.items():
        assert reason in reasons[f"ingest_sweep_bad.csv line {line_of(path, prefix)}"]
    n_lines = len(path.read_text().splitlines()) - 1
    assert len(result.runs) + len(result.rejected) == n_lines
    assert sorted(result.runs["source_line"]) == [line_of(path, "job-a,700"), line_of(path, "job-b,600")]


def test_units_are_converted_or_refused():
    table = pd.DataFrame({"group": ["g", "g"], "cap_kw": ["0.7", "0.4"], "power_kw": ["5.0", "3.1"],
                          "tokens_per_s": ["100", "80"], "gpus": ["8", "8"]})
    runs = validate_sweep(table).runs
    assert runs["cap_w"].tolist() == [400.0, 700.0] and runs["power_w"].tolist() == [3100.0, 5000.0]
    assert set(runs["throughput_unit"]) == {"tokens/s"}
    # a job total given in kW under power_w: 0.6 W per GPU is no GPU's power
    bad = validate_sweep(table.rename(columns={"power_kw": "power_w", "cap_kw": "cap_w"}).assign(cap_w=["700", "400"]))
    assert bad.runs.empty and bad.rejected["reason"].str.contains("kW, mW or a wrong gpus").all()
    with pytest.raises(IngestError, match="both cap_kw and cap_w"):
        validate_sweep(table.assign(cap_w=["700", "400"]))


def test_empty_or_fractional_counts_are_bad_rows():
    table = pd.DataFrame({"group": ["g", "g", "g"], "cap_w": ["300", "200", "100"], "power_w": ["600", "380", "190"],
                          "throughput": ["10", "8", "5"], "gpus": ["2", "", "1.5"], "repeat": ["0", "0", ""]})
    reasons = validate_sweep(table).rejected.set_index("where")["reason"]
    assert reasons["table row 2"] == "gpus is empty"
    assert "gpus must be a whole number >= 1 (1.5)" in reasons["table row 3"] and "repeat is empty" in reasons["table row 3"]


def test_missing_columns_and_defaults():
    with pytest.raises(IngestError, match="lacks column.*throughput"):
        validate_sweep(pd.DataFrame({"group": ["g"], "cap_w": [300], "power_w": [250]}))
    table = pd.DataFrame({"group": ["g", "g"], "cap_w": [300, 200], "power_w": [250, 190], "throughput": [10, 8]})
    result = validate_sweep(table)
    assert set(result.runs["gpus"]) == {1} and any("every job is taken as 1 GPU" in n for n in result.notes)
    result = validate_sweep(table, defaults={"gpus": 1, "gpu_model": "L40S", "architecture": "dense"})
    assert set(result.runs["gpu_model"]) == {"L40S"} and set(result.runs["cluster"]) == {"dense"}


def test_parquet_rows_are_named_by_row_number(tmp_path):
    f = tmp_path / "sweeps.parquet"
    pd.DataFrame({"group": ["g", "g", "g"], "cap_w": [300.0, 200.0, 100.0], "power_w": [250.0, -1.0, 95.0],
                  "throughput": [10.0, 8.0, 5.0]}).to_parquet(f)
    result = ingest("sweep-table", f, on_bad_rows="skip")
    assert result.rejected["where"].tolist() == ["sweeps.parquet row 2"]
    assert len(result.runs) == 2


def test_read_table_counts_physical_lines_with_quoted_commas(tmp_path):
    f = tmp_path / "t.csv"
    f.write_text('a,b\n\n"x,y",1\n\n"z",2\n')
    df, bad = read_table(f)
    assert df["_where"].tolist() == ["t.csv line 3", "t.csv line 5"] and df["a"].tolist() == ["x,y", "z"]
    assert bad == []


def test_zeus_adapter():
    path = DATA / "ingest_zeus" / "summary_power_v100.csv"
    raw = pd.read_csv(path)
    runs = ingest("zeus-nsdi23", path.parent).runs
    assert len(runs) == len(raw) and runs["group"].nunique() == 2
    assert set(runs["gpu_model"]) == {"V100"} and set(runs["gpus"]) == {1}
    merged = runs.merge(raw, left_on=["cap_w", "power_w"], right_on=["power_limit", "average_power"])
    assert len(merged) == len(raw)
    assert np.allclose(merged["tokens_per_s"], 3600 / merged["time_per_epoch"])
    assert set(runs["throughput_unit"]) == {"epochs/h"}
    pfi = pfi_table(runs, throughput_col="tokens_per_s", mc_samples=0).set_index("group")
    # resnet50's 200 W epoch is faster than the uncapped one: Eq. 1 flagged, robust defined
    resnet = pfi.loc[pfi.index.str.contains("resnet50")].iloc[0]
    assert resnet["status"] == "capped_faster" and np.isfinite(resnet["pfi_robust"])


def test_zeus_bad_cells_name_the_source_column(tmp_path):
    src = (DATA / "ingest_zeus" / "summary_power_v100.csv").read_text().splitlines()
    src[3] = src[3].replace("7.626666666666667", "0")
    f = tmp_path / "summary_power_a40.csv"
    f.write_text("\n".join(src) + "\n")
    result = ingest("zeus-nsdi23", f, on_bad_rows="skip")
    assert result.rejected.values.tolist() == [["summary_power_a40.csv line 4", "time_per_epoch is not a positive number: '0'"]]
    assert set(result.runs["gpu_model"]) == {"A40"}  # from the file name
    with pytest.raises(IngestError, match="summary_power_<gpu>.csv"):
        ingest("zeus-nsdi23", DATA / "ingest_sweep.csv")


def test_perseus_adapter_pipeline_gpus_and_job_power():
    path = DATA / "ingest_perseus" / "power_limit_sweeps_A40.csv"
    raw = pd.read_csv(path)
    runs = ingest("perseus-sosp24", path.parent).runs
    assert runs.groupby("group")["gpus"].first().to_dict() == {
        "a40-bert_huge_uncased-dp1tp1pp8-b256": 8, "a40-gpt3_6.7b-dp2tp2pp4-b512": 16}
    raw["source_line"] = raw.index + 2  # header on line 1, no blank lines
    merged = runs.merge(raw, on="source_line")
    assert len(merged) == len(raw)
    assert np.allclose(merged["power_w"], merged["energy"] / merged["time"])
    assert np.allclose(merged["tokens_per_s"], merged["batch_size"] / merged["time"])
    assert (merged["cap_w"] == merged["power_limit_0"]).all()


@pytest.mark.parametrize("edit, reason", [
    (lambda cells: cells.__setitem__(10, "275"), "must be one positive cap shared by all 8 pipeline stages"),
    (lambda cells: cells.__setitem__(12 + 2, "300.0"), "must be 0 or empty for a 4-stage pipeline"),
])
def test_perseus_stage_limits_are_checked(tmp_path, edit, reason):
    lines = (DATA / "ingest_perseus" / "power_limit_sweeps_A40.csv").read_text().splitlines()
    row = 1 if "8 pipeline" in reason else 4
    cells = next(csv.reader([lines[row]]))
    edit(cells)
    buf = io.StringIO()
    csv.writer(buf, lineterminator="").writerow(cells)
    lines[row] = buf.getvalue()
    f = tmp_path / "power_limit_sweeps_A40.csv"
    f.write_text("\n".join(lines) + "\n")
    result = ingest("perseus-sosp24", f, on_bad_rows="skip")
    assert result.rejected["where"].tolist() == [f"power_limit_sweeps_A40.csv line {row + 1}"]
    assert reason in result.rejected["reason"].iloc[0]


def test_dcgm_run_manifest_summarises_each_capture():
    result = ingest("dcgm-runs", DATA / "ingest_dcgm_runs" / "manifest.csv")
    runs = result.runs.set_index("cap_w")
    assert list(runs.index) == [400.0, 700.0] and set(runs["gpus"]) == {2}
    # SEMs and telemetry come from the captures (the sweep-table path has neither)
    assert runs[["power_w_sem", "tokens_per_s_sem", "dram_active", "sm_clock_mhz"]].notna().all().all()
    assert runs.loc[700.0, "enforced_limit_w"] == 700 and runs.loc[400.0, "enforced_limit_w"] == 400
    assert runs.loc[700.0, "power_w"] > runs.loc[400.0, "power_w"]
    assert set(runs["throughput_unit"]) == {"tokens/s"}


def test_dcgm_run_manifest_rows_that_cannot_be_read_are_rejected_by_line(tmp_path):
    src = (DATA / "ingest_dcgm_runs" / "manifest.csv").read_text().splitlines()
    src.append(src[2].replace("400,", "300,").replace("dcgm_dmon_h100x2.txt", "missing.txt"))
    manifest = tmp_path / "manifest.csv"
    manifest.write_text("\n".join(src).replace("../", str(DATA) + "/") + "\n")
    result = ingest("dcgm-runs", manifest, on_bad_rows="skip")
    assert result.rejected["where"].tolist() == ["manifest.csv line 4"]
    assert "missing.txt: no such file" in result.rejected["reason"].iloc[0]
    assert len(result.runs) == 2


def test_clock_alignment():
    tel = pd.DataFrame({"t_s": [1.7e9, 1.7e9 + 5]})
    steps = pd.DataFrame({"t_end_s": [3.0, 6.0]})
    with pytest.raises(IngestError, match="start_unix"):
        align_clocks(tel, steps)
    t, s = align_clocks(tel, steps, start_unix=1.7e9 - 1)
    assert t["t_s"].tolist() == [1.0, 6.0] and s["t_end_s"].tolist() == [3.0, 6.0]
    t, s = align_clocks(tel, steps.assign(t_end_s=[1.7e9 + 3, 1.7e9 + 6]))
    assert t["t_s"].tolist() == [0.0, 5.0] and s["t_end_s"].tolist() == [3.0, 6.0]


def test_missing_data_path_says_what_to_do(tmp_path):
    with pytest.raises(IngestError, match=r"ingest.path 'nowhere/zeus'.*does not exist.*--config"):
        config_files({"format": "zeus-nsdi23", "path": "nowhere/zeus"}, tmp_path)
    (tmp_path / "empty").mkdir()
    with pytest.raises(IngestError, match=r"no input files for format zeus-nsdi23"):
        config_files({"format": "zeus-nsdi23", "path": "empty"}, tmp_path)


def test_report_helpers_on_a_sweep_without_telemetry():
    runs = ingest("zeus-nsdi23", DATA / "ingest_zeus").runs
    pfi = pfi_table(runs, throughput_col="tokens_per_s", mc_samples=0)
    counts = status_counts(pfi)
    for column in ("status", "robust_status"):
        assert counts.loc[counts["column"] == column, "groups"].sum() == len(pfi)
    stages = {s["stage"].split(" ")[0]: s for s in stage_applicability(runs, pfi)}
    assert not stages["telemetry-PFI"]["applies"] and "DCGM telemetry" in stages["telemetry-PFI"]["reason"]
    assert not stages["cluster"]["applies"] and "dense (2)" in stages["cluster"]["reason"]


def test_report_stages_apply_when_the_data_has_them():
    rng = np.random.default_rng(0)
    rows = []
    for g, cluster in enumerate(["dense", "dense", "moe-pt", "moe-pt", "moe-ft"]):
        for cap in (300, 500, 700):
            rows.append({"group": f"g{g}", "cap_w": cap, "power_w": cap * 0.9, "tokens_per_s": 100 * (cap / 700) ** 0.5,
                         "cluster": cluster, "matches": "", "dram_active": rng.uniform(0.2, 0.6),
                         "mem_copy_util": rng.uniform(20, 60)})
    runs = pd.DataFrame(rows)
    pfi = pfi_table(runs, throughput_col="tokens_per_s", mc_samples=0)
    applies = {s["stage"].split(" ")[0]: s["applies"] for s in stage_applicability(runs, pfi)}
    assert applies["cluster"] and applies["telemetry-PFI"] and not applies["H100"]


def test_cli_ingest(tmp_path, capsys):
    out, pfi = tmp_path / "runs.parquet", tmp_path / "pfi.csv"
    assert cli_main(["ingest", "perseus-sosp24", str(DATA / "ingest_perseus"), "-o", str(out), "--pfi", str(pfi)]) == 0
    runs = read_parquet(out)
    assert set(runs["backend"]) == {"ingest"} and len(runs) == 6
    assert len(pd.read_csv(pfi)) == 2 and (tmp_path / "pfi.csv.meta.json").is_file()
    assert cli_main(["ingest", "sweep-table", str(DATA / "ingest_sweep_bad.csv"), "-o", str(tmp_path / "x.csv")]) == 2
    err = capsys.readouterr().err
    assert "10 bad row(s)" in err and "ingest_sweep_bad.csv line 4: throughput is not a number" in err
    rej = tmp_path / "rejected.csv"
    assert cli_main(["ingest", "sweep-table", str(DATA / "ingest_sweep_bad.csv"), "-o", str(tmp_path / "x.csv"),
                     "--on-bad-rows", "skip", "--rejected", str(rej)]) == 0
    assert len(pd.read_csv(rej)) == 10


def test_real_traces_ingest_completely(shared):
    """The shipped Zeus and Perseus traces: every row becomes a run, one group per job."""
    zeus_dir, perseus_dir = shared / "external" / "zeus-nsdi23", shared / "external" / "perseus-sosp24"
    if not zeus_dir.is_dir() or not perseus_dir.is_dir():
        pytest.skip("external traces not found")
    zeus = ingest("zeus-nsdi23", zeus_dir)
    raw = pd.concat([pd.read_csv(f).assign(gpu=f.name) for f in sorted(zeus_dir.glob("summary_power_*.csv"))])
    assert len(zeus.runs) == len(raw) and zeus.rejected.empty
    assert zeus.runs["group"].nunique() == len(raw.groupby(["gpu", "dataset", "network", "batch_size", "optimizer"]))
    perseus = ingest("perseus-sosp24", perseus_dir)
    raw = pd.concat([pd.read_csv(f).assign(gpu=f.name) for f in sorted(perseus_dir.glob("power_limit_sweeps_*.csv"))])
    assert len(perseus.runs) == len(raw) and perseus.rejected.empty
    assert perseus.runs["group"].nunique() == len(raw.groupby(["gpu", "model_name", "dp", "tp", "pp", "batch_size"]))
