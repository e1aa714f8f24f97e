"""A one-group campaign runs to the end: every stage that has too little data
writes its outputs with the reason instead of failing the workflow. The real Snakemake on a
copy of the workflow, as its own working directory (config/config.yaml's control study and
the rest merged under the campaign, as a user runs it)."""

import json

import pandas as pd
import pytest
import yaml

from .campaigns import copy_workflow, planned, snakemake
from .conftest import REPO

pytestmark = pytest.mark.slow


def one_group_config() -> dict:
    """tests/data/tiny.yaml's first group alone, emulated, no repeats. 240 s runs: about the
    shortest the workflow accepts for this group (239 s, wattflex.runs.emulator.timeline); two
    out-of-sample splits, which one group cannot halve."""
    cfg = yaml.safe_load((REPO / "tests" / "data" / "tiny.yaml").read_text())
    cfg["backend"] = "emulated"
    cfg["groups"] = cfg["groups"][:1]
    cfg["repeats"] = []
    cfg["run"].update(duration_s=240, eval_at_s=None, checkpoint_at_s=None)
    cfg["allocation"]["out_of_sample"]["splits"] = 2
    return cfg


def test_a_one_group_campaign_runs_to_the_end_and_says_what_it_could_not_do(tmp_path):
    root = copy_workflow(tmp_path / "workflow")
    config = root / "one.yaml"
    config.write_text(yaml.safe_dump(one_group_config(), sort_keys=False))
    snakemake(root, root, config, "--cores", "2", "-q")
    assert planned(snakemake(root, root, config, "-n", "--cores", "2")) == {}
    results = root / "results" / "tiny"

    model = json.loads((results / "predictor" / "model.json").read_text())
    assert model["status"] == "not_fitted" and "need at least 3 groups" in model["reason"]

    summary_meta = json.loads((results / "allocation" / "summary.csv.meta.json").read_text())
    assert (
        "needs both pretraining and fine-tuning groups"
        in summary_meta["skipped_mixes"]["production"]
    )
    assert set(summary_meta["skipped_policies"]) == {
        "pfi-aware",
        "curve-aware",
    }  # no pfi_pred to read
    assert set(summary_meta["skipped_splits"]) == {"0", "1"}
    assert set(pd.read_csv(results / "allocation" / "summary.csv")["mix"]) == {"random"}
    headline = pd.read_csv(results / "allocation" / "headline.csv")
    assert headline.empty and "tokens_per_s_per_job_recovered" in headline.columns
    headline_meta = json.loads((results / "allocation" / "headline.csv.meta.json").read_text())
    assert (
        headline_meta["status"] == "not_simulated" and "production mix" in headline_meta["reason"]
    )
    assert (
        json.loads((results / "stats" / "kruskal_dunn.json").read_text())["status"] == "not_tested"
    )
    assert (results / "control" / "summary.csv").is_file()  # the control study ran on the one group

    report = (results / "report.html").read_text()
    assert "<b>Not fitted:</b> need at least 3 groups" in report
    assert (
        "<b>Not simulated:</b> the production mix: the production mix needs both pretraining"
        in report
    )
    assert "<b>Not simulated:</b> the pfi-aware policy:" in report
