"""The flexibility offer is one of the default workflow's products: the tiny
campaign run end to end (real Snakemake, emulated backend) writes offer/offer.csv and
offer/offer.png from its runs' curves, and its report shows the figure and the table."""

import re

import pytest

from wattflex.provenance import read_csv, read_png_meta

pytestmark = pytest.mark.slow


def test_the_default_workflow_makes_the_offer_and_the_report_shows_it(tiny_run):
    table = read_csv(tiny_run / "offer" / "offer.csv")
    total = table[table["job"] == "TOTAL"]
    assert list(total["max_throughput_loss"]) == [0.1, 0.25, 0.5]
    assert (total["shed_kw"] > 0).all() and total["shed_kw"].is_monotonic_increasing
    png = tiny_run / "offer" / "offer.png"
    assert png.stat().st_size > 10_000 and read_png_meta(png)["provenance"]["backend"] == "emulated"
    html = (tiny_run / "report.html").read_text()
    sec = re.search(r'<section id="offer">(.*?)</section>', html, re.S)
    assert sec, "no offer section in the report"
    assert "data:image/png;base64," in sec.group(1) and "TOTAL" in sec.group(1)
