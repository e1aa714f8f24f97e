import json

import pandas as pd
import pytest

from wattflex import SCHEMA_VERSION
from wattflex.provenance import (
    SchemaVersionError,
    provenance,
    read_json,
    read_parquet,
    read_parquet_meta,
    write_json,
    write_parquet,
)


def test_parquet_roundtrip_carries_schema_version_and_provenance(tmp_path):
    df = pd.DataFrame({"a": [1, 2]})
    write_parquet(df, tmp_path / "x.parquet", provenance(params={"k": 1}, backend="emulated", device_model="H200"))
    meta = read_parquet_meta(tmp_path / "x.parquet")
    assert meta["schema_version"] == SCHEMA_VERSION
    assert meta["provenance"]["backend"] == "emulated" and meta["provenance"]["params_hash"]
    assert "numpy" in meta["provenance"]["packages"]
    assert read_parquet(tmp_path / "x.parquet").equals(df)


def test_reader_refuses_unknown_major_schema(tmp_path):
    p = tmp_path / "x.json"
    write_json({"a": 1}, p)
    doc = json.loads(p.read_text())
    doc["schema_version"] = "99.0"
    p.write_text(json.dumps(doc))
    with pytest.raises(SchemaVersionError, match="schema_version 99.0 is not readable"):
        read_json(p)
    p.write_text(json.dumps({"a": 1}))
    with pytest.raises(SchemaVersionError, match="no schema_version"):
        read_json(p)


def test_params_hash_ignores_key_order():
    assert provenance(params={"a": 1, "b": 2})["params_hash"] == provenance(params={"b": 2, "a": 1})["params_hash"]
