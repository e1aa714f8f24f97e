"""The one sweep-table reader (wattflex.ingest.reader): rows with their file and line,
validation into runs.parquet rows, and the typed reading the commands share, so a bad row is
reported with the same words by ``wattflex ingest``, ``wattflex pfi`` and ``wattflex stats``."""

import pandas as pd
import pytest

from tests.conftest import REPO
from wattflex.cli import main as cli_main
from wattflex.ingest.reader import (
    RUN_COLUMNS,
    IngestError,
    check_cells,
    read_table,
    read_typed_table,
    validate_sweep,
)
from wattflex.ingest.sources import ingest

DATA = REPO / "tests" / "data"


def line_of(path, prefix: str) -> int:
    """1-based line number of the first line of ``path`` starting with ``prefix``."""
    return next(
        i for i, line in enumerate(path.read_text().splitlines(), 1) if line.startswith(prefix)
    )


def test_sweep_table_becomes_contract_rows_with_source_lines():
    path = DATA / "ingest_sweep.csv"
    runs = ingest("sweep-table", path).runs
    assert list(runs.columns[: len(RUN_COLUMNS)]) == RUN_COLUMNS
    data_lines = [ln for ln in path.read_text().splitlines()[1:] if ln.strip()]
    assert len(runs) == len(data_lines)  # the blank line holds no run; every other line is one
    assert set(runs["backend"]) == {"ingest"}
    row = runs[(runs["group"] == "llama8b-pt-x8") & (runs["cap_w"] == 300)].iloc[0]
    assert row["source_line"] == line_of(
        path, "llama8b-pt-x8,300"
    )  # physical line, past the blank one
    assert row["run_id"] == "cap300" and row["gpus"] == 8
    assert row["power_per_gpu_w"] == pytest.approx(row["power_w"] / 8)
    assert runs.loc[runs["repeat"] == 1, "run_id"].tolist() == ["cap700_r1"]
    # cluster derived as for generated groups: dense -> dense, MoE + LoRA -> moe-ft
    assert runs.groupby("group")["cluster"].first().to_dict() == {
        "llama8b-pt-x8": "dense",
        "olmoe-ft-x4": "moe-ft",
    }
    assert runs["dram_active"].notna().all() and runs["sm_clock_mhz"].isna().all()


def test_bad_rows_are_reported_by_line_and_nothing_is_dropped_silently():
    path = DATA / "ingest_sweep_bad.csv"
    expected = {  # line -> what its reason must say
        "job-a,500": "outside 1-2000 W per GPU",
        "job-a,400": "throughput is not a number: 'n/a'",
        "job-a,300,0,2400": "duplicate run",
        "job-a,300,0,2405": "duplicate run",
        "job-b,700": "dram_active = 41 is outside 0-1",
        "job-b,500": "gpu_model 'A100' differs from 'H100'",
        "job c": "group 'job c'",
        "job-d,700": "6 fields, the header has 8",
        "job-d,-200": "cap_w -200 is not a finite positive number",
        "job-d,500": "over 1.5x the cap",
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
    assert sorted(result.runs["source_line"]) == [
        line_of(path, "job-a,700"),
        line_of(path, "job-b,600"),
    ]


def test_units_are_converted_or_refused():
    table = pd.DataFrame(
        {
            "group": ["g", "g"],
            "cap_kw": ["0.7", "0.4"],
            "power_kw": ["5.0", "3.1"],
            "tokens_per_s": ["100", "80"],
            "gpus": ["8", "8"],
        }
    )
    runs = validate_sweep(table).runs
    assert runs["cap_w"].tolist() == [400.0, 700.0] and runs["power_w"].tolist() == [3100.0, 5000.0]
    assert set(runs["throughput_unit"]) == {"tokens/s"}
    # a job total given in kW under power_w: 0.6 W per GPU is no GPU's power
    bad = validate_sweep(
        table.rename(columns={"power_kw": "power_w", "cap_kw": "cap_w"}).assign(
            cap_w=["700", "400"]
        )
    )
    assert bad.runs.empty and bad.rejected["reason"].str.contains("kW, mW or a wrong gpus").all()
    with pytest.raises(IngestError, match="both cap_kw and cap_w"):
        validate_sweep(table.assign(cap_w=["700", "400"]))


def test_empty_or_fractional_counts_are_bad_rows():
    table = pd.DataFrame(
        {
            "group": ["g", "g", "g"],
            "cap_w": ["300", "200", "100"],
            "power_w": ["600", "380", "190"],
            "throughput": ["10", "8", "5"],
            "gpus": ["2", "", "1.5"],
            "repeat": ["0", "0", ""],
        }
    )
    reasons = validate_sweep(table).rejected.set_index("where")["reason"]
    assert reasons["table row 2"] == "gpus is empty"
    assert (
        "gpus must be a whole number >= 1 (1.5)" in reasons["table row 3"]
        and "repeat is empty" in reasons["table row 3"]
    )


def test_missing_columns_and_defaults():
    with pytest.raises(IngestError, match="lacks column.*throughput"):
        validate_sweep(pd.DataFrame({"group": ["g"], "cap_w": [300], "power_w": [250]}))
    table = pd.DataFrame(
        {"group": ["g", "g"], "cap_w": [300, 200], "power_w": [250, 190], "throughput": [10, 8]}
    )
    result = validate_sweep(table)
    assert set(result.runs["gpus"]) == {1} and any(
        "every job is taken as 1 GPU" in n for n in result.notes
    )
    result = validate_sweep(
        table, defaults={"gpus": 1, "gpu_model": "L40S", "architecture": "dense"}
    )
    assert set(result.runs["gpu_model"]) == {"L40S"} and set(result.runs["cluster"]) == {"dense"}


def test_parquet_rows_are_named_by_row_number(tmp_path):
    f = tmp_path / "sweeps.parquet"
    pd.DataFrame(
        {
            "group": ["g", "g", "g"],
            "cap_w": [300.0, 200.0, 100.0],
            "power_w": [250.0, -1.0, 95.0],
            "throughput": [10.0, 8.0, 5.0],
        }
    ).to_parquet(f)
    result = ingest("sweep-table", f, on_bad_rows="skip")
    assert result.rejected["where"].tolist() == ["sweeps.parquet row 2"]
    assert len(result.runs) == 2


def test_read_table_counts_physical_lines_with_quoted_commas(tmp_path):
    f = tmp_path / "t.csv"
    f.write_text('a,b\n\n"x,y",1\n\n"z",2\n')
    df, bad = read_table(f)
    assert df["_where"].tolist() == ["t.csv line 3", "t.csv line 5"] and df["a"].tolist() == [
        "x,y",
        "z",
    ]
    assert bad == []


def test_typed_table_types_cells_as_pandas_does(tmp_path):
    f = tmp_path / "t.csv"
    f.write_text(
        "\ufeffgroup,cap_w,power_w,note,sem\n"  # a spreadsheet's byte-order mark
        "a,200,800.5,x,NA\n\n"
        "b,300,900,,1.5\n"
        "c,400\n"
    )  # short line: padded, as pandas reads it
    df = read_typed_table(f)
    ref = pd.read_csv(f)
    pd.testing.assert_frame_equal(df.drop(columns="_where"), ref, check_exact=True)
    assert df["_where"].tolist() == ["t.csv line 2", "t.csv line 4", "t.csv line 5"]
    f.write_text("group,cap_w\na,200\nb,300,7\n")
    with pytest.raises(
        IngestError, match=r"1 bad row\(s\):\n  t.csv line 3: 3 fields, the header has 2"
    ):
        read_typed_table(f)


def test_check_cells_lists_every_bad_row_by_line(tmp_path):
    f = tmp_path / "t.csv"
    f.write_text("group,cap_w,power_w\na,200,800\n,300,x\nb,oops,\n")
    df = read_typed_table(f)
    with pytest.raises(IngestError) as err:
        check_cells(df, numeric=["cap_w", "power_w"], required=["group", "cap_w", "power_w"])
    assert str(err.value) == (
        "2 bad row(s):\n"
        "  t.csv line 3: group is empty; power_w is not a number: 'x'\n"
        "  t.csv line 4: cap_w is not a number: 'oops'; power_w is empty"
    )
    good = read_typed_table(f).iloc[:1]
    check_cells(good, numeric=["cap_w", "power_w"], required=["group"])
    assert good["power_w"].tolist() == [800.0]


def test_ingest_pfi_and_stats_report_a_bad_cell_with_the_same_words(tmp_path, capsys):
    f = tmp_path / "sweeps.csv"
    f.write_text(
        "group,cluster,cap_w,power_w,throughput,pfi\n"
        "a,dense,200,800,50,1.2\nb,moe-pt,300,16OO,70,1.5\nc,moe-ft,400,1600,80,abc\n"
    )
    with pytest.raises(IngestError, match="sweeps.csv line 3: power_w is not a number: '16OO'"):
        ingest("sweep-table", f)
    assert cli_main(["pfi", str(f)]) == 2
    assert "sweeps.csv line 3: power_w is not a number: '16OO'" in capsys.readouterr().err
    assert cli_main(["stats", str(f), "--value-col", "pfi"]) == 2
    assert "sweeps.csv line 4: pfi is not a number: 'abc'" in capsys.readouterr().err
