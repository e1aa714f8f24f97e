"""Versioned artifacts of a real workflow run: every file the tiny campaign writes carries
schema_version and provenance, readers refuse an unknown major schema version, and two
campaigns in one working directory never write to the same path."""

import json
import re
import shutil

import pyarrow.parquet as pq
import pytest

from wattflex.provenance import (
    META_KEY,
    SchemaVersionError,
    artifact_meta,
    read_csv,
    read_json,
    read_parquet,
    read_png_meta,
)
from wattflex.report import read_report_meta

from .campaigns import snakemake

pytestmark = pytest.mark.slow

PROVENANCE_KEYS = {
    "wattflex_version",
    "git_commit",
    "git_dirty",
    "params_hash",
    "inputs",
    "packages",
    "backend",
    "device_model",
}
# made from a spec (config, emulator), not from other files: each run's, and the control study's truth table
RUN_FILES = {"telemetry.parquet", "steps.parquet", "run.json"}
SPEC_MADE = {"control/truth.parquet"}


def artifacts(campaign_dir):
    for path in sorted(campaign_dir.rglob("*")):
        if (
            path.is_file()
            and path.suffix in (".parquet", ".json", ".csv", ".png", ".html")
            and not path.name.endswith(".meta.json")
        ):
            yield path


def test_every_artifact_has_schema_version_and_full_provenance(tiny_run):
    seen = 0
    for path in artifacts(tiny_run):
        doc = artifact_meta(path)
        where = path.relative_to(tiny_run)
        assert doc and doc.get("schema_version") == "1.0", where
        prov = doc["provenance"]
        assert PROVENANCE_KEYS <= set(prov), (where, PROVENANCE_KEYS - set(prov))
        assert prov["backend"] == "emulated" and "H200" in prov["device_model"], (
            where,
            prov["backend"],
        )
        # the campaign's workflow is a copy without .git (campaigns.copy_workflow): no commit is
        # claimed (a git checkout's commit: tests/unit/test_provenance_git.py)
        assert "git_commit" in prov and prov["git_commit"] is None and prov["git_dirty"] is None, (
            where
        )
        assert {"numpy", "pandas", "snakemake"} <= set(prov["packages"]), where
        if (
            path.name not in RUN_FILES and where.as_posix() not in SPEC_MADE
        ):  # derived: names and checksums what it was made from
            assert prov["inputs"] and all(
                re.fullmatch(r"[0-9a-f]{16}", c) for c in prov["inputs"].values()
            ), where
            assert prov["params_hash"], where
        seen += 1
    assert seen > 15 * 4  # four files per run, plus the campaign's tables, figures and report


def _bump(doc):
    return {**doc, "schema_version": "2.0"}


def test_readers_refuse_an_unknown_major_schema_version_of_real_artifacts(tiny_run, tmp_path):
    # parquet: rewrite pfi.parquet's metadata as a future wattflex would
    table = pq.read_table(tiny_run / "pfi.parquet")
    doc = json.loads(table.schema.metadata[META_KEY])
    pq.write_table(
        table.replace_schema_metadata({**table.schema.metadata, META_KEY: json.dumps(_bump(doc))}),
        tmp_path / "pfi.parquet",
    )
    with pytest.raises(
        SchemaVersionError,
        match=r"schema_version 2.0 is not readable by wattflex .* rerun the stage",
    ):
        read_parquet(tmp_path / "pfi.parquet")
    # JSON: a run summary
    summary = next(tiny_run.glob("runs/*/cap700/summary.json"))
    (tmp_path / "summary.json").write_text(json.dumps(_bump(json.loads(summary.read_text()))))
    with pytest.raises(SchemaVersionError, match="schema_version 2.0"):
        read_json(tmp_path / "summary.json")
    # CSV: its sidecar
    shutil.copy(tiny_run / "pfi.csv", tmp_path / "pfi.csv")
    sidecar = json.loads((tiny_run / "pfi.csv.meta.json").read_text())
    (tmp_path / "pfi.csv.meta.json").write_text(json.dumps(_bump(sidecar)))
    with pytest.raises(SchemaVersionError, match="schema_version 2.0"):
        read_csv(tmp_path / "pfi.csv")
    assert len(read_csv(tiny_run / "pfi.csv")) == 3
    # PNG: a figure, its text chunk rewritten as a future wattflex would
    from PIL import Image, PngImagePlugin

    src = tiny_run / "figures" / "pfi_by_cluster.png"
    assert read_png_meta(src)["provenance"]["backend"] == "emulated"
    with Image.open(src) as img:
        img.load()
        info = PngImagePlugin.PngInfo()
        info.add_text(META_KEY.decode(), json.dumps(_bump(read_png_meta(src))))
        img.save(tmp_path / "fig.png", pnginfo=info)
    with pytest.raises(SchemaVersionError, match="schema_version 2.0"):
        read_png_meta(tmp_path / "fig.png")
    # the report
    html = (tiny_run / "report.html").read_text()
    (tmp_path / "report.html").write_text(
        html.replace('{"schema_version": "1.0"', '{"schema_version": "2.0"', 1)
    )
    with pytest.raises(SchemaVersionError, match="schema_version 2.0"):
        read_report_meta(tmp_path / "report.html")


def test_a_second_campaign_in_the_same_directory_writes_only_under_its_own_name(
    tiny_campaign, tmp_path
):
    other = tmp_path / "other.yaml"
    other.write_text(tiny_campaign.config.read_text().replace("campaign: tiny", "campaign: tiny-b"))
    proc = snakemake(tiny_campaign.workflow, tiny_campaign.work, other, "-n", "--cores", "2")
    written = re.findall(r"^\s+(?:output|log): (.+)$", proc.stdout, re.M)
    paths = [p.strip() for line in written for p in line.split(",")]
    assert len(paths) > 15 * 3
    assert all(p.startswith(("results/tiny-b/", "logs/tiny-b/")) for p in paths), [
        p for p in paths if not p.startswith(("results/tiny-b/", "logs/tiny-b/"))
    ]
    jobs = re.search(r"^run_at_cap\s+(\d+)$", proc.stdout, re.M)
    assert jobs and int(jobs.group(1)) == 15  # all of campaign B's runs: none is taken from A
    # and campaign A is still complete and up to date
    assert tiny_campaign.plan() == {}
