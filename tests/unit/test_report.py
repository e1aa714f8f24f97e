import re

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import pandas as pd
import pytest

from wattflex.provenance import SchemaVersionError, provenance, stamp_png, write_csv
from wattflex.report import (
    SECTIONS,
    backend_kind,
    is_published,
    read_report_meta,
    render_report,
    snakemake_category,
)


def _png(path, prov):
    path.parent.mkdir(parents=True, exist_ok=True)
    fig, ax = plt.subplots(figsize=(2, 2))
    ax.plot([0, 1], [0, 1])
    fig.savefig(path, dpi=40)
    plt.close(fig)
    stamp_png(path, prov)


@pytest.fixture
def campaign(tmp_path):
    """A measured (cuda) campaign with runs, a Table 6, a figure and a table the report does not know."""
    root = tmp_path / "results" / "real"
    cuda = provenance(params={}, backend="cuda", device_model="H200")
    runs = pd.DataFrame({"group": ["g1", "g1", "g2"], "run_id": ["cap200", "cap700", "cap700"], "backend": "cuda",
                         "gpu_model": "H200", "set": "headline", "cluster": ["dense", "dense", "moe-ft"]})
    write_csv(runs, root / "runs.csv", cuda)
    write_csv(pd.DataFrame({"group": ["g1"], "pfi": [1.31], "pfi_published": [1.27]}), root / "tables" / "table6_pfi.csv",
              cuda, summary={"spearman_rho": 0.9})
    write_csv(pd.DataFrame({"x": [1]}), root / "tables" / "extra_analysis.csv", cuda)
    _png(root / "figures" / "pfi_by_cluster.png", cuda)
    _png(root / "allocation" / "fig8_allocation.png", cuda)  # named and matched by a glob too
    paper = tmp_path / "paper"
    paper.mkdir()
    pd.DataFrame({"model": ["Qwen3-32B"], "gpus": ["8|16"]}).to_csv(paper / "table1_experiment_matrix.csv", index=False)
    files = [p for p in root.rglob("*") if p.is_file()]
    return root, files, paper


def _section(html, key):
    m = re.search(rf'<section id="{key}">(.*?)</section>', html, re.S)
    assert m, key
    return m.group(1)


def test_report_labels_measured_data_and_embeds_figures(campaign):
    root, files, paper = campaign
    html = render_report(files, "real", {"campaign": "real", "source": "generate"}, paper,
                         provenance(params={}, inputs=files))
    pfi = _section(html, "pfi")
    assert '<div class="banner measured"><b>MEASURED</b>' in pfi
    assert "data:image/png;base64," in pfi and 'class="pub">1.27</td>' in pfi
    assert "spearman_rho" in pfi  # the summary stored in the table's sidecar
    assert "Not produced for this campaign: figures/fig2" not in pfi
    assert "Published: table1_experiment_matrix.csv" in _section(html, "matrix")
    assert "tables/extra_analysis.csv" in _section(html, "other")  # nothing the campaign made is dropped
    assert "EMULATED" not in html
    assert html.count("data:image/png;base64,") == 2  # each figure once
    assert 'class="banner top measured"' in html


def test_sections_without_artifacts_are_skipped_with_the_reason(campaign):
    root, files, paper = campaign
    html = render_report(files, "real", {"source": "ingest"}, paper)
    sweeps = _section(html, "sweeps")
    assert "Skipped:" in sweeps and "source: ingest" in sweeps and "per-run telemetry" in sweeps
    assert "Skipped:" in _section(html, "predictor") and "LOO R² 0.524" in _section(html, "predictor")
    assert '<section id="ingest">' not in html  # optional sections vanish instead
    assert [m for m in re.findall(r'<section id="(\w+)">', html)][:3] == ["sweeps", "matrix", "pfi"]


def test_report_metadata_roundtrip_and_schema_refusal(campaign, tmp_path):
    root, files, paper = campaign
    out = tmp_path / "report.html"
    out.write_text(render_report(files, "real", {}, paper, provenance(params={}, inputs=files)))
    meta = read_report_meta(out)
    assert meta["schema_version"] == "1.0" and meta["provenance"]["backend"] == "cuda"
    assert set(meta["sections"]) == {s.key for s in SECTIONS}
    out.write_text(out.read_text().replace('"schema_version": "1.0"', '"schema_version": "3.1"', 1))
    with pytest.raises(SchemaVersionError, match="schema_version 3.1 is not readable"):
        read_report_meta(out)


def test_backend_kind_and_snakemake_categories():
    assert backend_kind(["emulated", "emulated"]) == "emulated"
    assert backend_kind(["cuda", "ingest"]) == "measured"
    assert backend_kind(["emulated,cuda"]) == "mixed"
    assert backend_kind([None]) == "unknown"
    assert snakemake_category("results/{campaign}/figures/clocks_vs_cap.png").startswith("§4")
    assert snakemake_category("results/x/allocation/fig8_allocation.png").startswith("§6")
    assert snakemake_category("results/x/figures/something_new.png") == "Other outputs"
    assert all(map(is_published, ["pfi_published", "published_gap_closed", "published"]))
    assert not any(map(is_published, ["pfi", "unpublished_note"]))
