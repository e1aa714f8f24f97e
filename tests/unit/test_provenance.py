import json
import struct
import zlib

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
    write_parquet(
        df,
        tmp_path / "x.parquet",
        provenance(params={"k": 1}, backend="emulated", device_model="H200"),
    )
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
    assert (
        provenance(params={"a": 1, "b": 2})["params_hash"]
        == provenance(params={"b": 2, "a": 1})["params_hash"]
    )


def _figure():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(2, 2))
    ax.plot([0, 1], [0, 1])
    return fig


def test_save_png_carries_provenance_ahead_of_the_pixels(tmp_path):
    from PIL import Image

    from wattflex.provenance import artifact_meta, read_png_meta, save_png

    path = tmp_path / "figs" / "a.png"
    save_png(
        _figure(), path, provenance(params={"dpi": 40}, backend="emulated"), dpi=40, scenario="s1"
    )
    doc = read_png_meta(path)
    assert doc["schema_version"] == SCHEMA_VERSION and doc["scenario"] == "s1"
    assert doc["provenance"]["backend"] == "emulated"
    with Image.open(path) as img:
        # in the chunks read on opening (before the image data): reading it decodes no pixels
        assert json.loads(img.info["wattflex"]) == doc
        assert img.size == (80, 80)
    assert artifact_meta(path) == doc
    # the same figure as SVG beside it, carrying the same document; no temporary file left
    assert sorted(p.name for p in path.parent.iterdir()) == ["a.png", "a.svg"]
    assert artifact_meta(path.with_suffix(".svg")) == doc
    assert path.with_suffix(".svg").read_text().lstrip().startswith("<?xml")


def test_save_png_keeps_the_old_figure_when_drawing_fails(tmp_path):
    from wattflex.provenance import OutputPathError, read_png_meta, save_png

    path = tmp_path / "a.png"
    save_png(_figure(), path, provenance(params={"v": 1}))
    before = path.read_bytes()
    fig = _figure()
    fig.axes[0].set_title(
        "$\\notacommand$"
    )  # mathtext fails while drawing, after the temp file opened
    with pytest.raises(ValueError):
        save_png(fig, path, provenance(params={"v": 2}))
    assert path.read_bytes() == before and read_png_meta(path)["provenance"]["params_hash"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.png", "a.svg"]
    (tmp_path / "link.png").symlink_to(path)
    with pytest.raises(OutputPathError, match="symbolic link"):
        save_png(_figure(), tmp_path / "link.png")


def test_artifact_meta_reads_a_png_whose_chunk_follows_the_pixels(tmp_path):
    """Older files (stamped after saving) may carry the chunk after the image data."""
    from PIL import Image, PngImagePlugin

    from wattflex.provenance import artifact_meta

    Image.new("RGB", (4, 4)).save(tmp_path / "a.png")
    raw = (tmp_path / "a.png").read_bytes()
    doc = {"schema_version": SCHEMA_VERSION, "provenance": {"backend": "cuda"}}
    info = PngImagePlugin.PngInfo()
    info.add_text("wattflex", json.dumps(doc))
    chunk = info.chunks[0]
    # move the tEXt chunk after IDAT, before IEND (12 bytes: length, type, CRC)
    iend = raw.rindex(b"IEND") - 4
    body = chunk[0] + chunk[1]
    text_chunk = (
        struct.pack(">I", len(chunk[1])) + body + struct.pack(">I", zlib.crc32(body) & 0xFFFFFFFF)
    )
    (tmp_path / "late.png").write_bytes(raw[:iend] + text_chunk + raw[iend:])
    with Image.open(tmp_path / "late.png") as img:
        assert "wattflex" not in img.info
    assert artifact_meta(tmp_path / "late.png") == doc
