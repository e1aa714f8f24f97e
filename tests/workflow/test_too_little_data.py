"""A one-group campaign is planned to the end: every stage is in the dry run (config/config.yaml's
control study and the rest merged under the campaign, as a user runs it). What each stage writes
when it has too little data (the predictor not fitted, mixes, policies and splits skipped, the
cluster tests not tested, the report's wording) is tested stage by stage on a one-group table:
tests/unit/test_too_little_data.py and tests/unit/test_report.py."""

import pytest
import yaml

from .campaigns import copy_workflow, planned, snakemake
from .conftest import REPO

pytestmark = pytest.mark.slow


def one_group_config() -> dict:
    """tests/data/tiny.yaml's first group alone, emulated, no repeats. 260 s runs: a little over the
    shortest the workflow accepts for this group (245 s, wattflex.runs.emulator.timeline); two
    out-of-sample splits, which one group cannot halve."""
    cfg = yaml.safe_load((REPO / "tests" / "data" / "tiny.yaml").read_text())
    cfg["backend"] = "emulated"
    cfg["groups"] = cfg["groups"][:1]
    cfg["repeats"] = []
    cfg["run"].update(duration_s=260, eval_at_s=None, checkpoint_at_s=None)
    cfg["allocation"]["out_of_sample"]["splits"] = 2
    return cfg


def test_a_one_group_campaign_plans_every_stage_to_the_report(tmp_path):
    root = copy_workflow(tmp_path / "workflow")
    config = root / "one.yaml"
    config.write_text(yaml.safe_dump(one_group_config(), sort_keys=False))
    jobs = planned(snakemake(root, root, config, "-n", "--cores", "2"))
    for rule in (
        "fit_predictor",
        "cluster_stats",
        "simulate_allocation",
        "control_figures",  # the control study on the one group
        "report",
    ):
        assert jobs.get(rule) == 1, (rule, jobs)
