"""The reproduction report of the tiny campaign: content, order, labels, and every figure
loading in a real headless browser (Debian's chromium)."""

import html
import re
from pathlib import Path

import pytest

from wattflex.provenance import artifact_meta
from wattflex.report import read_report_meta
from wattflex.report_sections import SECTIONS

from ..report_checks import (
    CHROMIUM,
    figures_without_svg,
    hidden_published_columns,
    probe_page,
    raw_markdown,
    scientific_cells,
    scientific_text,
)

pytestmark = pytest.mark.slow

# Appended to a copy of the report: after load, the body says how many images there are
# and which did not decode (naturalWidth 0).
IMAGE_PROBE = """<script>window.addEventListener('load', () => {
  const imgs = [...document.images];
  document.body.setAttribute('data-images', imgs.length);
  document.body.setAttribute('data-broken',
    imgs.filter(i => !(i.complete && i.naturalWidth > 0)).map(i => i.alt).join('|') || 'none');
});</script>"""


def campaign_pngs(campaign_dir: Path) -> list[Path]:
    return sorted(
        p for p in campaign_dir.rglob("*.png") if "runs" not in p.relative_to(campaign_dir).parts
    )


def test_report_shows_the_papers_sections_in_order_labelled_emulated(tiny_run):
    report = tiny_run / "report.html"
    text = report.read_text()
    meta = read_report_meta(report)
    assert meta["campaign"] == "tiny" and meta["provenance"]["backend"] == "emulated"
    shown = [k for k, status in meta["sections"].items() if status != "omitted"]
    assert re.findall(r'<section id="(\w+)">', text)[: len(shown) + 1] == ["key", *shown]
    assert shown == [s.key for s in SECTIONS if meta["sections"][s.key] != "omitted"]
    for key in ("sweeps", "matrix", "pfi", "predictor", "grid", "repeatability"):
        assert meta["sections"][key] == "shown", key
    banners = re.findall(r'<div class="banner (?:top )?(\w+)', text)
    assert banners and set(banners) == {"emulated"}
    # every figure of the campaign is embedded, not linked; published values sit beside ours
    assert text.count('<img src="data:image/png;base64,') == len(campaign_pngs(tiny_run))
    assert 'src="http' not in text and "<link" not in text
    assert 'class="pub">pfi_<wbr>published</th>' in text
    assert "Published: table1_experiment_matrix.csv" in text
    assert "Config (result-shaping keys)" in text and "campaign: tiny" in text


def test_the_built_report_reads_as_a_report(tiny_run, tmp_path):
    """No number in scientific notation (no column is documented as such), no raw Markdown or
    <pre> table, every figure embedded with its SVG beside it, every published column visible
    at 1400 px without scrolling sideways (every folded table opened)."""
    report = tiny_run / "report.html"
    page = report.read_text()
    assert scientific_cells(page) == [] and scientific_text(page) == []
    assert raw_markdown(page) == []
    assert figures_without_svg(page, tiny_run) == []
    assert page.index('<section id="key">') < page.index('<section id="sweeps">')
    assert (
        "EMULATED" in page[page.index('<section id="key">') : page.index('<section id="sweeps">')]
    )
    if CHROMIUM is not None:
        n, hidden = hidden_published_columns(report, tmp_path)
        assert n > 0 and hidden == []


def test_every_figure_passes_the_figure_check_and_has_an_svg(tiny_run):
    """Every figure the campaign draws, as written: the check's result
    (wattflex.plots.style.figure_problems: no box over data, no label struck by a line, every
    series in a legend, no legend off the page) is in each PNG and its SVG."""
    pngs = campaign_pngs(tiny_run)
    flagged = {
        str(png.relative_to(tiny_run)): artifact_meta(png)["figure_check"]
        for png in pngs
        if artifact_meta(png)["figure_check"]
        or artifact_meta(png.with_suffix(".svg"))["figure_check"]
    }
    assert flagged == {} and len(pngs) >= 15


def test_report_shows_the_flexibility_statement_with_its_figure(tiny_run):
    text = (tiny_run / "report.html").read_text()
    assert read_report_meta(tiny_run / "report.html")["sections"]["statement"] == "shown"
    section = re.search(r'<section id="statement">(.*?)</section>', text, re.S)
    assert section, "no statement section in the report"
    body = section.group(1)
    (figure,) = [
        item
        for sec in SECTIONS
        if sec.key == "statement"
        for item in sec.items
        if item.path == "statement/statement.png"
    ]
    assert (tiny_run / "statement" / "statement.png").is_file()
    assert body.count('<img src="data:image/png;base64,') == 1
    assert f'alt="{html.escape(figure.title)}"' in body
    # its tables and the handover page are in the section too
    assert "statement/shed.csv" in body and "statement/knob_jobs.csv" in body
    assert "statement/statement.md" in body


@pytest.mark.skipif(
    CHROMIUM is None, reason="chromium not installed (apt-get install chromium; .ci/run does)"
)
def test_every_figure_loads_in_headless_chromium(tiny_run, tmp_path):
    body = probe_page(tiny_run / "report.html", IMAGE_PROBE, tmp_path)
    n_images = re.search(r'data-images="(\d+)"', body)
    broken = re.search(r'data-broken="([^"]*)"', body)
    assert n_images and broken, body
    assert int(n_images.group(1)) == len(campaign_pngs(tiny_run)) > 0
    assert broken.group(1) == "none", f"figures that did not load: {broken.group(1)}"


def test_snakemakes_own_report_files_every_figure_under_its_paper_section(
    tiny_campaign, tiny_run, tmp_path
):
    import zipfile

    from .campaigns import snakemake

    out = tmp_path / "snakemake_report.zip"
    snakemake(
        tiny_campaign.workflow, tiny_campaign.work, tiny_campaign.config, "--report", str(out)
    )
    with zipfile.ZipFile(out) as zf:
        names = zf.namelist()
        page = zf.read(next(n for n in names if n.endswith("/report.html"))).decode()
    assert sorted(Path(n).name for n in names if n.endswith(".png")) == sorted(
        p.name for p in campaign_pngs(tiny_run)
    )
    for category in (
        "Measurement: power-cap sweeps",
        "PFI per group, clusters",
        "Predicting PFI from one",
    ):
        assert category in page
