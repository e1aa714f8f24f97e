"""Too little data, stage by stage, on a one-group table: each stage the workflow runs on a
one-group campaign writes its outputs with the reason instead of failing (the branches the
one-group campaign of tests/workflow/test_too_little_data.py ran end to end: the predictor
``not_fitted``, the allocation study's ``skipped_mixes``, ``skipped_policies`` and
``skipped_splits`` and its empty headline, the cluster tests ``not_tested``, the report's wording).
The same library calls as the rule scripts (fit_predictor.py, simulate_allocation.py,
cluster_stats.py, make_report.py) on one pretraining group."""

import numpy as np
import pandas as pd
import pytest

from wattflex.allocation.simulate import (
    HEADLINE_COLUMNS,
    SimulationConfig,
    combine,
    group_table,
    simulate,
    simulate_cuts,
)
from wattflex.analysis import predictor
from wattflex.analysis.stats import kruskal_dunn


@pytest.fixture(scope="module")
def one_group():
    """runs / pfi / predictions of one pretraining group (a power-law curve, PFI 1.4), the
    predictor not fitted (its predictions table has no ``pfi_pred``)."""
    gpus, pfi, t_max = 8, 1.4, 2.0e4
    p_max = 690.0 * gpus
    runs = pd.DataFrame(
        [
            {
                "group": "g0",
                "cap_w": cap,
                "repeat": 0,
                "set": "headline",
                "task": "pt",
                "cluster": "dense",
                "gpus": gpus,
                "backend": "emulated",
                "power_w": min(cap * gpus * 0.98, p_max),
                "tokens_per_s": t_max * (min(cap * gpus * 0.98, p_max) / p_max) ** (1 / pfi),
            }
            for cap in (200, 300, 400, 500, 600, 700)
        ]
    )
    pfi_table = pd.DataFrame({"group": ["g0"], "pfi_ratio": [pfi]})
    preds = pd.DataFrame(
        {"group": ["g0"], "pfi": [pfi], "pfi_pred": [np.nan], "dram_copy_product": [2.8]}
    )
    return runs, pfi_table, preds


def test_the_predictor_on_one_group_is_not_fitted_and_says_why():
    groups = pd.DataFrame({"group": ["g0"], "set": ["headline"], "pfi": [1.4]})
    with pytest.raises(predictor.TooFewGroups, match="need at least 3 groups") as exc:
        predictor.training_rows(groups, "headline")
    model = predictor.not_fitted_model("dram_copy_product", str(exc.value))
    assert model["status"] == predictor.NOT_FITTED == "not_fitted"
    assert "need at least 3 groups" in model["reason"] and not predictor.is_fitted(model)


def test_the_allocation_study_on_one_group_skips_what_it_cannot_do_and_says_why(one_group):
    cfg = SimulationConfig.from_dict(
        {
            "n_workloads": 8,
            "jobs_per_workload": 4,
            "cuts": [0.0, 0.2],
            "out_of_sample": {"splits": 2, "workloads": 4},
            "headline": {"cut": 0.2},
        }
    )
    table = group_table(*one_group, cfg)
    out = simulate(table, cfg)
    skipped = out["skipped"]
    assert "needs both pretraining and fine-tuning groups" in skipped.mixes["production"]
    assert set(skipped.policies) == {"pfi-aware", "curve-aware"}  # no pfi_pred to read
    assert set(skipped.splits) == {"0", "1"}  # one group cannot be halved
    assert set(out["summary"]["mix"]) == {"random"}
    assert np.isfinite(out["results"]["total_tokens_per_s"]).all()
    headline = out["headline"]
    assert headline.empty and list(headline.columns) == HEADLINE_COLUMNS
    assert "production mix" in skipped.headline
    # the workflow's per-cut jobs merged by simulate_allocation.py say the same
    merged = combine([simulate_cuts(table, cfg, [c]) for c in cfg.cuts], table, cfg)
    assert merged["skipped"].meta() == skipped.meta()
    assert merged["skipped"].headline == skipped.headline


def test_the_cluster_tests_on_one_cluster_are_not_tested_and_say_why(one_group):
    _, pfi_table, _ = one_group
    result = kruskal_dunn(pfi_table.assign(cluster="dense"))
    assert result["status"] == "not_tested" and result["reason"]
    assert result["dunn"] == []
