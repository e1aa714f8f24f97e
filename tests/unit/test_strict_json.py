"""Every JSON artifact is strict JSON: an undefined value is ``null`` with its
reason beside it, never a ``NaN``/``Infinity`` token that strict parsers reject."""

import ast
import json
import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from wattflex import provenance
from wattflex.analysis.calibration import (
    Calibration,
    PowerCurve,
    read_calibration,
    write_calibration,
)
from wattflex.ops.adapters.slurm import write_json_atomic
from wattflex.runs.devices import cap_state
from wattflex.runs.sweep import real as sweep_real

PACKAGE = Path(provenance.__file__).resolve().parent
SCRIPTS = PACKAGE.parent
# json.dumps calls that are not artifacts: a hash of parameters (changing its text would
# change every fingerprint).
NOT_ARTIFACTS = {
    ("provenance.py", "params_hash"),
    ("openadr3.py", "_poll_once"),  # a fingerprint of a VTN's event, compared, never written
    ("slurm.py", "file_problem"),
}  # a value quoted in a message as JSON spells it
RECORD = {
    "summary": {
        "power_w": 700.0,
        "power_w_sem": math.nan,
        "throughput": np.float64("inf"),
        "windows": [1.0, -math.inf],
        "n": np.int64(3),
    }
}


def strict_load(text: str):
    """What a strict parser (JavaScript's JSON.parse, jq, Go) does with NaN/Infinity: refuse."""

    def refuse(token):
        raise ValueError(f"non-standard JSON token {token}")

    return json.loads(text, parse_constant=refuse)


def test_strict_json_writes_null_and_refuses_what_slips_past():
    doc = strict_load(provenance.strict_json(RECORD))
    assert doc["summary"]["power_w_sem"] is None and doc["summary"]["throughput"] is None
    assert doc["summary"]["windows"] == [1.0, None] and doc["summary"]["n"] == 3
    with pytest.raises(ValueError):  # a NaN made by default= is an error at the writer
        provenance.strict_json({"x": object()}, default=lambda o: math.nan)


def test_run_records_and_summaries_say_which_values_are_undefined(tmp_path):
    provenance.write_json(RECORD, tmp_path / "summary.json")
    doc = strict_load((tmp_path / "summary.json").read_text())
    assert doc["summary"]["power_w_sem"] is None
    assert doc["undefined"] == {
        "summary.power_w_sem": "NaN",
        "summary.throughput": "inf",
        "summary.windows.1": "-inf",
    }
    # the readers' frames take null as missing, as they took NaN
    frame = pd.DataFrame(
        [provenance.read_json(tmp_path / "summary.json")["summary"], {"power_w_sem": 1.5}]
    )
    assert frame.power_w_sem.dtype == float and frame.power_w_sem.isna().tolist() == [True, False]


def test_clean_records_carry_no_undefined_key(tmp_path):
    provenance.write_json({"summary": {"power_w": 1.0}}, tmp_path / "s.json")
    assert "undefined" not in strict_load((tmp_path / "s.json").read_text())


def test_csv_sidecar_and_parquet_metadata_are_strict(tmp_path):
    df = pd.DataFrame({"a": [1.0]})
    provenance.write_csv(df, tmp_path / "t.csv", extra=math.nan)
    assert strict_load((tmp_path / "t.csv.meta.json").read_text())["extra"] is None
    provenance.write_parquet(df, tmp_path / "t.parquet", missing_runs=[{"error": math.nan}])
    import pyarrow.parquet as pq

    raw = pq.read_schema(tmp_path / "t.parquet").metadata[provenance.META_KEY]
    assert strict_load(raw.decode())["missing_runs"] == [{"error": None}]


@pytest.mark.parametrize("writer", ["cap state", "sweep state", "slurm budget"])
def test_state_files_are_strict(tmp_path, writer):
    path = tmp_path / "state.json"
    write = {
        "cap state": lambda p, d: cap_state.write_record(p.parent, p.name, d),
        "sweep state": sweep_real._write_atomic,
        "slurm budget": write_json_atomic,
    }[writer]
    write(path, {"caps_w": [700.0, math.nan], "load_w": math.inf})
    assert strict_load(path.read_text()) == {"caps_w": [700.0, None], "load_w": None}


def test_a_calibration_with_an_undefined_mae_round_trips(tmp_path):
    cal = Calibration(
        anchor_clock_mhz=1980.0,
        curve=PowerCurve(300.0, 0.7, 2.0, 0.5, math.nan),
        source="fitted (test)",
        fit_groups=("one",),
    )
    path = write_calibration(cal, tmp_path / "cal.json")
    doc = strict_load(path.read_text())
    assert doc["out_of_sample_mae"] is None and doc["undefined"]["out_of_sample_mae"] == "NaN"
    back = read_calibration(path)
    assert math.isnan(back.out_of_sample_mae) and math.isnan(back.curve.max_table_error_mhz)
    assert back.anchor_clock_mhz == 1980.0


def _json_calls(path: Path):
    """``(call, enclosing function name)`` of every json.dump/json.dumps in ``path``."""
    tree = ast.parse(path.read_text())
    where = {}
    for fn in ast.walk(tree):  # outer functions first: an inner one overwrites, innermost wins
        if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
            for node in ast.walk(fn):
                where[id(node)] = fn.name
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and isinstance(node.func.value, ast.Name)
            and node.func.value.id == "json"
            and node.func.attr in ("dump", "dumps")
        ):
            yield node, where.get(id(node), "<module>")


def test_every_json_writer_in_the_code_is_strict():
    """The class, not the example: a json.dump(s) anywhere in the workflow's code either
    refuses NaN itself (allow_nan=False) or is not an artifact (listed, with why)."""
    loose = set()
    for path in SCRIPTS.rglob("*.py"):
        for call, func in _json_calls(path):
            strict = any(
                k.arg == "allow_nan"
                and isinstance(k.value, ast.Constant)
                and k.value.value is False
                for k in call.keywords
            )
            if not strict and (path.name, func) not in NOT_ARTIFACTS:
                loose.add(f"{path.relative_to(SCRIPTS)}:{call.lineno} ({func})")
    assert not loose, (
        "JSON written without allow_nan=False (use provenance.strict_json):\n"
        + "\n".join(sorted(loose))
    )
