"""The ingest sources (wattflex.ingest.sources): Zeus/Perseus adapters, DCGM run manifests,
the data path of a campaign's ``ingest:`` section and the ``wattflex ingest`` command."""

import csv
import io

import numpy as np
import pandas as pd
import pytest

from tests.conftest import REPO
from wattflex.cli import main as cli_main
from wattflex.commands import ingest as ingest_command
from wattflex.ingest.reader import IngestError
from wattflex.ingest.sources import FORMATS, align_clocks, config_files, ingest
from wattflex.pfi import pfi_table
from wattflex.provenance import read_parquet

DATA = REPO / "tests" / "data"


def test_zeus_adapter():
    path = DATA / "ingest_zeus" / "summary_power_v100.csv"
    raw = pd.read_csv(path)
    runs = ingest("zeus-nsdi23", path.parent).runs
    assert len(runs) == len(raw) and runs["group"].nunique() == 2
    assert set(runs["gpu_model"]) == {"V100"} and set(runs["gpus"]) == {1}
    merged = runs.merge(
        raw, left_on=["cap_w", "power_w"], right_on=["power_limit", "average_power"]
    )
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
    assert result.rejected.values.tolist() == [
        ["summary_power_a40.csv line 4", "time_per_epoch is not a positive number: '0'"]
    ]
    assert set(result.runs["gpu_model"]) == {"A40"}  # from the file name
    with pytest.raises(IngestError, match="summary_power_<gpu>.csv"):
        ingest("zeus-nsdi23", DATA / "ingest_sweep.csv")


def test_perseus_adapter_pipeline_gpus_and_job_power():
    path = DATA / "ingest_perseus" / "power_limit_sweeps_A40.csv"
    raw = pd.read_csv(path)
    runs = ingest("perseus-sosp24", path.parent).runs
    assert runs.groupby("group")["gpus"].first().to_dict() == {
        "a40-bert_huge_uncased-dp1tp1pp8-b256": 8,
        "a40-gpt3_6.7b-dp2tp2pp4-b512": 16,
    }
    raw["source_line"] = raw.index + 2  # header on line 1, no blank lines
    merged = runs.merge(raw, on="source_line")
    assert len(merged) == len(raw)
    assert np.allclose(merged["power_w"], merged["energy"] / merged["time"])
    assert np.allclose(merged["tokens_per_s"], merged["batch_size"] / merged["time"])
    assert (merged["cap_w"] == merged["power_limit_0"]).all()


@pytest.mark.parametrize(
    "edit, reason",
    [
        (
            lambda cells: cells.__setitem__(10, "275"),
            "must be one positive cap shared by all 8 pipeline stages",
        ),
        (
            lambda cells: cells.__setitem__(12 + 2, "300.0"),
            "must be 0 or empty for a 4-stage pipeline",
        ),
    ],
)
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
    assert (
        runs[["power_w_sem", "tokens_per_s_sem", "dram_active", "sm_clock_mhz"]].notna().all().all()
    )
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


def test_cli_ingest(tmp_path, capsys):
    out, pfi = tmp_path / "runs.parquet", tmp_path / "pfi.csv"
    assert (
        cli_main(
            [
                "ingest",
                "perseus-sosp24",
                str(DATA / "ingest_perseus"),
                "-o",
                str(out),
                "--pfi",
                str(pfi),
            ]
        )
        == 0
    )
    runs = read_parquet(out)
    assert set(runs["backend"]) == {"ingest"} and len(runs) == 6
    assert len(pd.read_csv(pfi)) == 2 and (tmp_path / "pfi.csv.meta.json").is_file()
    assert (
        cli_main(
            [
                "ingest",
                "sweep-table",
                str(DATA / "ingest_sweep_bad.csv"),
                "-o",
                str(tmp_path / "x.csv"),
            ]
        )
        == 2
    )
    err = capsys.readouterr().err
    assert (
        "10 bad row(s)" in err and "ingest_sweep_bad.csv line 4: throughput is not a number" in err
    )
    rej = tmp_path / "rejected.csv"
    assert (
        cli_main(
            [
                "ingest",
                "sweep-table",
                str(DATA / "ingest_sweep_bad.csv"),
                "-o",
                str(tmp_path / "x.csv"),
                "--on-bad-rows",
                "skip",
                "--rejected",
                str(rej),
            ]
        )
        == 0
    )
    assert len(pd.read_csv(rej)) == 10


def test_real_traces_ingest_completely(resources):
    """The shipped Zeus and Perseus traces: every row becomes a run, one group per job."""
    zeus_dir, perseus_dir = (
        resources / "external" / "zeus-nsdi23",
        resources / "external" / "perseus-sosp24",
    )
    zeus = ingest("zeus-nsdi23", zeus_dir)
    raw = pd.concat(
        [pd.read_csv(f).assign(gpu=f.name) for f in sorted(zeus_dir.glob("summary_power_*.csv"))]
    )
    assert len(zeus.runs) == len(raw) and zeus.rejected.empty
    assert zeus.runs["group"].nunique() == len(
        raw.groupby(["gpu", "dataset", "network", "batch_size", "optimizer"])
    )
    perseus = ingest("perseus-sosp24", perseus_dir)
    raw = pd.concat(
        [
            pd.read_csv(f).assign(gpu=f.name)
            for f in sorted(perseus_dir.glob("power_limit_sweeps_*.csv"))
        ]
    )
    assert len(perseus.runs) == len(raw) and perseus.rejected.empty
    assert perseus.runs["group"].nunique() == len(
        raw.groupby(["gpu", "model_name", "dp", "tp", "pp", "batch_size"])
    )


def test_the_command_offers_every_format():
    assert ingest_command.FORMATS == FORMATS  # kept in the command so that --help stays light
