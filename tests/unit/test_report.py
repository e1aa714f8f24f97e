import re
import shutil

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import pandas as pd
import pytest

from wattflex.provenance import SchemaVersionError, provenance, save_png, write_csv
from wattflex.report import backend_kind, is_published, read_report_meta, render_report
from wattflex.report_sections import SECTIONS, snakemake_category


def _png(path, prov):
    fig, ax = plt.subplots(figsize=(2, 2))
    ax.plot([0, 1], [0, 1])
    save_png(fig, path, prov, dpi=40)
    plt.close(fig)


@pytest.fixture
def campaign(tmp_path):
    """A measured (cuda) campaign with runs, a Table 6, a figure and a table the report does not know."""
    root = tmp_path / "results" / "real"
    cuda = provenance(params={}, backend="cuda", device_model="H200")
    runs = pd.DataFrame(
        {
            "group": ["g1", "g1", "g2"],
            "run_id": ["cap200", "cap700", "cap700"],
            "backend": "cuda",
            "gpu_model": "H200",
            "set": "headline",
            "cluster": ["dense", "dense", "moe-ft"],
        }
    )
    write_csv(runs, root / "runs.csv", cuda)
    write_csv(
        pd.DataFrame({"group": ["g1"], "pfi": [1.31], "pfi_published": [1.27]}),
        root / "tables" / "table6_pfi.csv",
        cuda,
        summary={"spearman_rho": 0.9},
    )
    write_csv(pd.DataFrame({"x": [1]}), root / "tables" / "extra_analysis.csv", cuda)
    _png(root / "figures" / "pfi_by_cluster.png", cuda)
    _png(root / "allocation" / "fig8_allocation.png", cuda)  # named and matched by a glob too
    paper = tmp_path / "paper"
    paper.mkdir()
    pd.DataFrame({"model": ["Qwen3-32B"], "gpus": ["8|16"]}).to_csv(
        paper / "table1_experiment_matrix.csv", index=False
    )
    files = [p for p in root.rglob("*") if p.is_file()]
    return root, files, paper


def _section(html, key):
    m = re.search(rf'<section id="{key}">(.*?)</section>', html, re.S)
    assert m, key
    return m.group(1)


def test_report_labels_measured_data_and_embeds_figures(campaign):
    root, files, paper = campaign
    html = render_report(
        files,
        "real",
        {"campaign": "real", "source": "generate"},
        paper,
        provenance(params={}, inputs=files),
    )
    pfi = _section(html, "pfi")
    assert '<div class="banner measured"><b>MEASURED</b>' in pfi
    assert "data:image/png;base64," in pfi and 'class="pub">1.27</td>' in pfi
    assert "spearman_rho" in pfi  # the summary stored in the table's sidecar
    assert "Not produced for this campaign: figures/fig2" not in pfi
    assert "Published: table1_experiment_matrix.csv" in _section(html, "matrix")
    assert "tables/extra_analysis.csv" in _section(
        html, "other"
    )  # nothing the campaign made is dropped
    assert "EMULATED" not in html
    assert html.count("data:image/png;base64,") == 2  # each figure once
    assert 'class="banner top measured"' in html


def test_sections_without_artifacts_are_skipped_with_the_reason(campaign):
    root, files, paper = campaign
    html = render_report(files, "real", {"source": "ingest"}, paper)
    sweeps = _section(html, "sweeps")
    assert "Skipped:" in sweeps and "source: ingest" in sweeps and "per-run telemetry" in sweeps
    assert "Skipped:" in _section(html, "predictor") and "LOO R² 0.524" in _section(
        html, "predictor"
    )
    assert '<section id="ingest">' not in html  # optional sections vanish instead
    # the key results come first, then the paper's sections in its order
    assert re.findall(r'<section id="(\w+)">', html)[:4] == ["key", "sweeps", "matrix", "pfi"]


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


@pytest.fixture
def emulated_fidelity(tmp_path):
    """An emulated campaign with the fidelity tables (built by wattflex.analysis.fidelity)."""
    from wattflex.analysis import fidelity as fid

    root = tmp_path / "results" / "emu"
    emu = provenance(params={}, backend="emulated", device_model="H200")
    nf = {
        "spearman_table6": 0.72,
        "median_dense": 1.30,
        "median_moe-pt": 1.62,
        "median_moe-ft": 2.0,
        "clusters_ordered": 1.0,
        "kruskal_H": 14.0,
        "dunn_significant[dense vs moe-pt]": 1.0,
    }
    seeds = pd.DataFrame(
        {"spearman_table6": [0.6, 0.65, 0.7, 0.75], "kruskal_H": [13.0, 14.0, 15.0, 16.0]}
    )
    pub = {
        "median_dense": 1.27,
        "median_moe-pt": 1.43,
        "median_moe-ft": 2.10,
        "kruskal_H": 12.37,
        "dunn_significant[dense vs moe-pt]": 0.0,
    }
    summary = fid.summary_table(
        nf,
        {**nf, "spearman_table6": 0.61},
        seeds,
        pub,
        extra={"replay_max_abs_error": (0.02, "what the seed draws leave out")},
    )
    meta = pd.DataFrame(
        {
            "group": ["g1", "g2"],
            "set": "headline",
            "cluster": ["dense", "moe-ft"],
            "gpu": "H200",
            "model": "m",
            "task": "pt",
            "pfi_published": [1.27, float("nan")],
            "published_source": ["table6", ""],
            "in_spearman": [True, False],
        }
    )
    groups = fid.group_table(
        meta,
        pd.Series({"g1": 1.31, "g2": 2.2}),
        pd.Series({"g1": 1.29, "g2": 2.1}),
        pd.DataFrame({"g1": [1.2, 1.3], "g2": [2.0, 2.3]}),
    )
    sens = pd.DataFrame(
        {
            "constant": ["(none: baseline)", "calib_tensor_util", "calib_tensor_util"],
            "change": ["0%", "-25%", "+25%"],
            "median_dense": [1.3, 1.2, 1.45],
            "delta_median_dense": [0.0, -0.1, 0.15],
            "spearman_table6": [0.72, 0.7, 0.71],
            "delta_spearman_table6": [0.0, -0.02, -0.01],
            "source": ["", "assumed", "assumed"],
            "backend": "emulated",
        }
    )
    write_csv(summary, root / "tables" / "fidelity_summary.csv", emu)
    write_csv(groups, root / "tables" / "fidelity.csv", emu)
    write_csv(sens, root / "tables" / "fidelity_sensitivity.csv", emu)
    from wattflex.analysis.public_sweeps import row

    sets = pd.DataFrame(
        [
            row(
                test_set="Table 6 out of sample (this campaign's calibration)",
                fitted_to="the anchor",
                not_fitted_to="Table 6",
                pfi_mae=0.21,
            ),
            row(test_set="Zeus NSDI'23 V100 power-limit sweeps", note="not scored: no V100 model"),
        ]
    )
    write_csv(sets.assign(backend="emulated"), root / "tables" / "fidelity_test_sets.csv", emu)
    return [p for p in root.rglob("*") if p.is_file()]


def test_fidelity_section_marks_each_target_and_says_emulated(emulated_fidelity, tmp_path):
    html = render_report(emulated_fidelity, "emu", {"source": "generate"}, tmp_path)
    sec = _section(html, "fidelity")
    assert (
        '<div class="banner emulated"><b>EMULATED</b>' in sec
        and "Every number in this section is EMULATED" in sec
    )
    targets = sec[
        sec.index("<h3>Targets</h3>") : sec.index("</table>", sec.index("<h3>Targets</h3>"))
    ]
    rows = re.findall(r"<tr>(.*?)</tr>", targets)
    spearman = next(r for r in rows if ">spearman_table6<" in r)
    assert (
        "✓ met" in spearman and "✗ missed" in spearman
    )  # noise-free 0.72 >= 0.70, campaign 0.61 not
    assert "✗ missed" in next(r for r in rows if ">median_moe-pt<" in r)  # 1.62 vs 1.43
    assert "0.675 [0.608, 0.742]" in spearman  # seed median [5 %, 95 %]
    assert "Kruskal-Wallis and Dunn-Holm" in sec and "replay_max_abs_error" in sec
    assert 'class="pub">pfi_<wbr>published</th>' in sec and "left out of every correlation" in sec
    sens = sec[sec.index("fidelity_sensitivity") :]
    assert (
        sens.index("+25%") < sens.index("-25%") < sens.index("(none: baseline)")
    )  # largest effect first
    assert "MEASURED" not in sec
    assert (
        "within 0.15 of the published" in sec and "issue" not in sec.lower()
    )  # targets stated, not cited
    sets = sec[sec.index("Every test set side by side") :]
    assert (
        sets.index("Table 6 out of sample")
        < sets.index("not scored: no V100 model")
        < sets.index("fidelity_calibration")
    )


def test_fidelity_section_is_omitted_for_a_measured_campaign(campaign):
    root, files, paper = campaign
    html = render_report(files, "real", {"source": "generate"}, paper)
    assert '<section id="fidelity">' not in html
    assert read_report_meta_from(html)["sections"]["fidelity"] == "omitted"


def read_report_meta_from(html):
    import json

    return json.loads(
        re.search(
            r'<script type="application/json" id="wattflex-meta">(.*?)</script>', html, re.S
        ).group(1)
    )


@pytest.mark.parametrize(
    "status,label", [("not_fitted", "Not fitted"), ("not_tested", "Not tested")]
)
def test_a_stage_with_too_little_data_says_why_above_its_empty_table(campaign, status, label):
    """Too little data: the predictor on one group (and the cluster tests on one cluster) write empty
    tables whose sidecar says why; the report shows the reason, not a bare '(no rows)'."""
    root, files, paper = campaign
    write_csv(
        pd.DataFrame(columns=["predictors", "p"]),
        root / "predictor" / "ablation.csv",
        provenance(params={}, backend="cuda"),
        status=status,
        reason="need at least 3 groups, have 1",
    )
    html = render_report(
        [*files, root / "predictor" / "ablation.csv"], "real", {"source": "generate"}, paper
    )
    assert f"<b>{label}:</b> need at least 3 groups, have 1" in _section(html, "predictor")


def test_the_allocation_section_names_the_mixes_and_policies_it_left_out(campaign):
    """A one-group campaign cannot form the production mix, and an unfitted predictor
    gives the PFI-aware policies nothing to read; the report says so once, and why the headline is empty."""
    root, files, paper = campaign
    prov = provenance(params={}, backend="cuda")
    left_out = {
        "skipped_mixes": {"production": "all 1 group(s) are pretraining (task pt)"},
        "skipped_policies": {"pfi-aware": "no predicted PFI"},
        "skipped_splits": {},
    }
    write_csv(
        pd.DataFrame({"mix": ["random"], "cut": [0.3], "policy": ["oracle"]}),
        root / "allocation" / "summary.csv",
        prov,
        **left_out,
    )
    write_csv(
        pd.DataFrame(columns=["mix", "cut", "policy"]),
        root / "allocation" / "headline.csv",
        prov,
        **left_out,
        status="not_simulated",
        reason="the headline's production mix was not simulated",
    )
    html = render_report(
        [*files, root / "allocation" / "summary.csv", root / "allocation" / "headline.csv"],
        "real",
        {"source": "generate"},
        paper,
    )
    section = _section(html, "allocation")
    assert (
        section.count(
            "<b>Not simulated:</b> the production mix: all 1 group(s) are pretraining (task pt)"
        )
        == 1
    )
    assert "<b>Not simulated:</b> the pfi-aware policy: no predicted PFI" in section
    assert "<b>Not simulated:</b> the headline&#x27;s production mix was not simulated" in section


# --- the report a reader takes in (issue 49): key results first, numbers for people ---------


@pytest.fixture
def reader_campaign(tmp_path):
    """An emulated campaign with what the first screen reads and what used to read badly: float
    noise, a count in the ten thousands, a range cell, a negative LOCO R², a gain 3x the
    paper's, a wide table whose published columns come last, and a Markdown statement."""
    root = tmp_path / "results" / "emu"
    emu = provenance(params={}, backend="emulated", device_model="H200")
    write_csv(
        pd.DataFrame({"group": ["a", "b", "c"], "backend": "emulated", "set": "headline"}),
        root / "runs.csv",
        emu,
    )
    write_csv(
        pd.DataFrame(
            {
                "group": ["a", "b", "c"],
                "set": "headline",
                "cluster": ["dense", "moe-pt", "moe-ft"],
                "pfi": [1.2, 1.6, 2.4],
                "pfi_published": [1.27, 1.43, 2.1],
            }
        ),
        root / "tables" / "table6_pfi.csv",
        emu,
    )
    write_csv(
        pd.DataFrame(
            {
                "predictors": ["dram_copy_product", "all_dcgm+job_metadata"],
                "loo_r2": [0.69, 0.61],
                "loco_r2": [-0.0606, -3217.2],
                "n": [25, 25],
                **{f"metric_{i}": [12180.0 * i, 7194.0] for i in range(14)},
                "features": ["dram_copy_product", "x" * 60],
                "loo_r2_published": [0.524, -0.01],
                "loco_r2_published": [0.246, -104.0],
            }
        ),
        root / "predictor" / "ablation.csv",
        emu,
    )
    write_csv(
        pd.DataFrame(
            {
                "mix": ["production"],
                "cut": [0.3],
                "policy": ["pfi-aware"],
                "tokens_per_s_per_job_recovered": [4421.3],
                "gap_closed": [0.76],
                "noise": [3.446e-13],
                "p_holm": [1.2e-7],
                "range": ["[1.1351313887696182, 2.559834825457332]"],
                "published_tokens_per_s_per_job_recovered": [1500.0],
                "published_gap_closed": [0.63],
            }
        ),
        root / "allocation" / "headline.csv",
        emu,
    )
    (root / "statement").mkdir(parents=True)
    (root / "statement" / "statement.md").write_text(
        "# Flexibility statement\n\n- A 50 % cut loses 7.75e+09 tokens.\n\n"
        "## What the site can shed\n\n| depth | kW | loss |\n|---|---|---|\n"
        "| 10 % | 12.3456789 | nan |\n"
    )
    _png(root / "figures" / "pfi_by_cluster.png", emu)
    return [p for p in root.rglob("*") if p.is_file()], root


def test_the_first_screen_is_the_papers_findings_beside_this_campaign(reader_campaign):
    files, root = reader_campaign
    html = render_report(files, "emu", {"source": "generate"}, root)
    assert re.findall(r'<section id="(\w+)">', html)[0] == "key"
    key = _section(html, "key")
    assert "EMULATED" in key
    rows = re.findall(r"<tr>(.*?)</tr>", key, re.S)
    dense = next(r for r in rows if "Median PFI of the dense cluster" in r)
    assert ">1.20<" in dense.replace("<b>", "").replace("</b>", "")
    loco = next(r for r in rows if "leave-one-cluster-out" in r)
    assert "0.246" in loco and "−0.061" in loco and "R² below 0" in loco
    gain = next(r for r in rows if "recovers tokens/s per job" in r)
    assert "1,500" in gain and "4,421" in gain and "2.9× the paper" in gain
    # the section repeats its findings as its short table, above its figure
    pfi = _section(html, "pfi")
    assert pfi.index("Median PFI of the moe-ft cluster") < pfi.index("<figure>")


def test_numbers_are_formatted_for_people_and_markdown_rendered(reader_campaign):
    from tests.report_checks import raw_markdown, scientific_cells, scientific_text

    files, root = reader_campaign
    html = render_report(files, "emu", {"source": "generate"}, root)
    assert scientific_cells(html) == [] and scientific_text(html) == []
    assert raw_markdown(html) == []
    assert "loses 7,750,000,000 tokens" in _section(html, "statement")
    alloc = _section(html, "allocation")
    assert ">[1.14, 2.56]<" in alloc and ">&lt;0.001<" in alloc and ">0<" in alloc
    assert ">12,180<" in _section(html, "predictor")
    statement = _section(html, "statement")
    assert "<h1>Flexibility statement</h1>" in statement and "<th>kW</th>" in statement
    assert ">12.3<" in statement and ">—<" in statement and "nan" not in statement


def test_published_columns_sit_beside_their_campaign_columns():
    from wattflex.report import paired_columns

    cols = ["predictors", "loo_r2", "loco_r2", "n", "features", "loco_r2_published"]
    assert paired_columns([*cols[:5], "loo_r2_published", cols[5]]) == [
        "predictors",
        "loo_r2",
        "loo_r2_published",
        "loco_r2",
        "loco_r2_published",
        "n",
        "features",
    ]
    assert paired_columns(["metric", "value", "published", "published_source"]) == [
        "metric",
        "value",
        "published",
        "published_source",
    ]


def test_every_figure_is_embedded_with_its_svg_beside_it(reader_campaign):
    from tests.report_checks import figures_without_svg

    files, root = reader_campaign
    out = root / "report.html"
    out.write_text(render_report(files, "emu", {"source": "generate"}, root))
    assert (root / "figures" / "pfi_by_cluster.svg").is_file()
    assert figures_without_svg(out.read_text(), root) == []
    (root / "figures" / "pfi_by_cluster.svg").unlink()
    assert figures_without_svg(out.read_text(), root) == ["SVG missing: figures/pfi_by_cluster.svg"]


@pytest.mark.skipif(
    shutil.which("chromium") is None,
    reason="chromium not installed (apt-get install chromium; .ci/run does)",
)
def test_every_published_column_is_visible_in_chromium(reader_campaign, tmp_path):
    from tests.report_checks import hidden_published_columns

    files, root = reader_campaign
    out = root / "report.html"
    out.write_text(render_report(files, "emu", {"source": "generate"}, root))
    n, hidden = hidden_published_columns(out, tmp_path)
    assert n >= 6 and hidden == []


def test_each_reader_check_finds_its_defect_planted_in_a_built_report(reader_campaign, tmp_path):
    """The checks run on the built report (tests/report_checks.py) are not vacuous: on a clean
    report they find nothing, and each finds the defect issue 49 found, planted back."""
    from tests.report_checks import (
        CHROMIUM,
        figures_without_svg,
        hidden_published_columns,
        raw_markdown,
        scientific_cells,
        scientific_text,
    )

    files, root = reader_campaign
    html = render_report(files, "emu", {"source": "generate"}, root)
    assert ">4,421<" in html
    sci = html.replace(">4,421<", ">4.421e+03<", 1)  # report._fmt's old '.4g'
    assert len(scientific_cells(sci)) == 1 and scientific_text(sci) == ["4.421e+03"]
    statement = "<pre># Flexibility statement\n| kW | h |\n|---|---|\n| 12.3 | 4 |</pre>"
    pre = html.replace("</main>", statement + "</main>", 1)  # the old statement, as text
    assert raw_markdown(html) == []
    assert raw_markdown(pre) == ["<pre>", "|---", "|---", "# Flexibility statement"]
    nosvg = re.sub(r'<a class="svg" href="[^"]+"[^>]*>[^<]*</a>', "", html, count=1)
    assert len(figures_without_svg(nosvg, root)) == 1
    if CHROMIUM is not None:
        clipped = root / "clipped.html"  # tables wider than the page: columns off at the right
        clipped.write_text(html.replace("</head>", "<style>table{min-width:2400px}</style></head>"))
        n, hidden = hidden_published_columns(clipped, tmp_path)
        assert n >= 6 and len(hidden) >= 1


def test_a_stored_summarys_range_is_rounded_like_the_tables():
    """Table 6's stored summary showed its range as [1.4257824468436777, 2.1757492170071097]."""
    from wattflex.report import kv_html

    page = kv_html({"range": [1.4257824468436777, 2.1757492170071097], "n_groups": 25})
    assert "<td>[1.43, 2.18]</td>" in page and "<td>25</td>" in page


def test_a_key_result_shows_the_papers_number_as_the_paper_gives_it(reader_campaign):
    """Table 9's median change read 10.700 (paper) beside 8.288: 3 decimals chosen from the
    campaign's value alone, as if the paper had given them."""
    files, root = reader_campaign
    summary = pd.DataFrame(
        {
            "table": ["grid_sensitivity"],
            "metric": ["median_delta_pct"],
            "value": [8.288],
            "published": [10.7],
        }
    )
    path = root / "tables" / "analysis_summary.csv"
    write_csv(summary, path, provenance(params={}, backend="emulated"))
    html = render_report([*files, path], "emu", {"source": "generate"}, root)
    row = next(
        r for r in re.findall(r"<tr>(.*?)</tr>", _section(html, "key"), re.S) if "Table 9" in r
    )
    assert ">10.7<" in row and "<b>8.29</b>" in row
