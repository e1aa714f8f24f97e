"""What an ingested campaign supports (wattflex.ingest.summary): status counts and which
downstream stages apply."""

import numpy as np
import pandas as pd

from tests.conftest import REPO
from wattflex.ingest.sources import ingest
from wattflex.ingest.summary import stage_applicability, status_counts
from wattflex.pfi import pfi_table

DATA = REPO / "tests" / "data"


def test_report_helpers_on_a_sweep_without_telemetry():
    runs = ingest("zeus-nsdi23", DATA / "ingest_zeus").runs
    pfi = pfi_table(runs, throughput_col="tokens_per_s", mc_samples=0)
    counts = status_counts(pfi)
    for column in ("status", "robust_status"):
        assert counts.loc[counts["column"] == column, "groups"].sum() == len(pfi)
    stages = {s["stage"].split(" ")[0]: s for s in stage_applicability(runs, pfi)}
    assert (
        not stages["telemetry-PFI"]["applies"]
        and "DCGM telemetry" in stages["telemetry-PFI"]["reason"]
    )
    assert not stages["cluster"]["applies"] and "dense (2)" in stages["cluster"]["reason"]


def test_report_stages_apply_when_the_data_has_them():
    rng = np.random.default_rng(0)
    rows = []
    for g, cluster in enumerate(["dense", "dense", "moe-pt", "moe-pt", "moe-ft"]):
        for cap in (300, 500, 700):
            rows.append(
                {
                    "group": f"g{g}",
                    "cap_w": cap,
                    "power_w": cap * 0.9,
                    "tokens_per_s": 100 * (cap / 700) ** 0.5,
                    "cluster": cluster,
                    "matches": "",
                    "dram_active": rng.uniform(0.2, 0.6),
                    "mem_copy_util": rng.uniform(20, 60),
                }
            )
    runs = pd.DataFrame(rows)
    pfi = pfi_table(runs, throughput_col="tokens_per_s", mc_samples=0)
    applies = {s["stage"].split(" ")[0]: s["applies"] for s in stage_applicability(runs, pfi)}
    assert applies["cluster"] and applies["telemetry-PFI"] and not applies["H100"]
