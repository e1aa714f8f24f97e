"""Fidelity of an emulated campaign: metrics on small constructed inputs, the seed draws
against the emulated backend they stand in for, and the sensitivity table's shape."""

import dataclasses
import math

import numpy as np
import pandas as pd
import pytest

from tests.conftest import REPO
from wattflex.analysis import fidelity as fid
from wattflex.config import groups, load_config
from wattflex.pfi import pfi_ratio
from wattflex.runs.emulator.device import run_emulated
from wattflex.runs.emulator.physics import PHYSICS
from wattflex.telemetry import SummaryProtocol, summarize_run

TINY = REPO / "tests" / "data" / "tiny.yaml"
PAPER = str(REPO / "resources" / "paper" / "tables")


@pytest.fixture(scope="module")
def tiny():
    """The tiny campaign's groups as GroupModels, one run per cap (plus its repeat)."""
    cfg = load_config(TINY)
    jobs = {g["id"]: {"group": g, "model_facts": cfg["_catalog"][g["model"]]} for g in groups(cfg)}
    rows = [
        {"group": g["id"], "cap_w": c, "run_id": f"cap{c:g}"}
        for g in groups(cfg)
        for c in g["caps"]
    ]
    rows.append({"group": "dense-pt-mistral24b-x8", "cap_w": 700.0, "run_id": "cap700_r1"})
    return cfg, fid.group_models(jobs, pd.DataFrame(rows))


def _meta(rows):
    """A group_meta-shaped table from (group, set, cluster, published, matches) tuples."""
    meta = pd.DataFrame(rows, columns=["group", "set", "cluster", "pfi_published", "matches"])
    meta["published_source"] = np.where(np.isfinite(meta["pfi_published"]), "table6", "")
    meta["in_spearman"] = (meta["set"] == "headline") & (meta["published_source"] == "table6")
    return meta


# ---- metrics on constructed inputs ------------------------------------------------------------


def test_spearman_medians_and_order_on_a_constructed_campaign():
    pub = [1.1, 1.2, 1.3, 1.4, 1.5, 1.6, 2.0, 2.2, 2.4]
    clusters = ["dense"] * 3 + ["moe-pt"] * 3 + ["moe-ft"] * 3
    meta = _meta([(f"g{i}", "headline", c, p, "") for i, (c, p) in enumerate(zip(clusters, pub))])
    same = pd.Series(pub, index=meta["group"])
    m = fid.metrics(same, meta, tests=False)
    assert m["spearman_table6"] == pytest.approx(1.0)
    assert (m["median_dense"], m["median_moe-pt"], m["median_moe-ft"]) == pytest.approx(
        (1.2, 1.5, 2.2)
    )
    assert m["clusters_ordered"] == 1.0
    assert m["spearman_within_dense"] == pytest.approx(1.0)
    reversed_ = pd.Series(pub[::-1], index=meta["group"])
    m = fid.metrics(reversed_, meta, tests=False)
    assert m["spearman_table6"] == pytest.approx(-1.0) and m["clusters_ordered"] == 0.0


def test_groups_without_a_published_value_stay_out_of_the_correlation():
    meta = _meta(
        [
            ("a", "headline", "dense", 1.1, ""),
            ("b", "headline", "dense", 1.2, ""),
            ("c", "headline", "moe-ft", 2.0, ""),
            ("new", "headline", "moe-ft", math.nan, ""),
        ]
    )
    pfi = pd.Series({"a": 1.1, "b": 1.2, "c": 2.0, "new": 0.5})
    m = fid.metrics(pfi, meta, tests=False)
    assert m["spearman_table6"] == pytest.approx(1.0)  # "new" (lowest) would break the ranking
    assert m["median_moe-ft"] == pytest.approx(1.25)  # ... but it is one of the campaign's groups


def test_too_few_groups_give_nan_not_an_error():
    meta = _meta([("a", "headline", "dense", 1.1, ""), ("b", "headline", "moe-ft", 2.0, "")])
    m = fid.metrics(pd.Series({"a": 1.2, "b": 1.9}), meta)
    assert math.isnan(m["spearman_table6"]) and math.isnan(m["spearman_within_dense"])
    assert math.isnan(m["median_moe-pt"]) and math.isnan(m["clusters_ordered"])


def test_h100_rank_correlation_pairs_each_h100_group_with_its_match():
    rows = [(f"h200-{i}", "headline", "dense", 1.0 + i / 10, "") for i in range(4)]
    rows += [(f"h100-{i}", "h100", "dense", math.nan, f"h200-{i}") for i in range(4)]
    meta = _meta(rows)
    pfi = pd.Series(
        {**{f"h200-{i}": 1.0 + i for i in range(4)}, **{f"h100-{i}": 5.0 - i for i in range(4)}}
    )
    assert fid.metrics(pfi, meta, tests=False)["spearman_h100_vs_h200"] == pytest.approx(-1.0)


def test_dunn_pattern_is_compared_pair_by_pair_with_the_published():
    published = fid.published_metrics(PAPER)
    assert published["dunn_significant[dense vs moe-ft]"] == 1.0
    assert published["dunn_significant[dense vs moe-pt]"] == 0.0
    assert published["dunn_significant[moe-pt vs moe-ft]"] == 0.0
    assert (
        published["median_dense"] == pytest.approx(1.27)
        and published["spearman_h100_vs_h200"] == 0.943
    )
    same = {k: v for k, v in published.items() if k.startswith("dunn_significant[")}
    assert fid.with_pattern(same, published)["dunn_pattern_matches"] == 1.0
    flipped = {**same, "dunn_significant[dense vs moe-pt]": 1.0}
    assert fid.with_pattern(flipped, published)["dunn_pattern_matches"] == 0.0
    assert math.isnan(
        fid.with_pattern({**same, "dunn_significant[dense vs moe-pt]": math.nan}, published)[
            "dunn_pattern_matches"
        ]
    )


def test_cluster_tests_separate_clearly_different_clusters():
    rng = np.random.default_rng(0)
    values = np.concatenate(
        [rng.normal(1.2, 0.02, 10), rng.normal(1.21, 0.02, 10), rng.normal(2.0, 0.02, 10)]
    )
    clusters = ["dense"] * 10 + ["moe-pt"] * 10 + ["moe-ft"] * 10
    meta = _meta(
        [(f"g{i}", "headline", c, v, "") for i, (c, v) in enumerate(zip(clusters, values))]
    )
    m = fid.metrics(pd.Series(values, index=meta["group"]), meta)
    assert (
        m["dunn_significant[dense vs moe-ft]"] == 1.0
        and m["dunn_significant[dense vs moe-pt]"] == 0.0
    )
    assert m["kruskal_p"] < 0.001


def test_errors_are_split_in_and_out_of_the_calibrations_sample():
    groups = [
        fid.GroupModel(
            id=i,
            cluster="dense",
            set=st,
            gpu="H200",
            model="m",
            task="pt",
            matches="",
            job=None,
            runs=(),
        )
        for i, st in (
            ("t6", "headline"),
            ("t7", "validation"),
            ("fit", "validation"),
            ("none", "headline"),
        )
    ]
    published = pd.DataFrame(
        {
            "group": ["t6", "t7", "fit", "none"],
            "pfi_published": [1.5, 1.2, 1.3, math.nan],
            "published_source": ["table6", "table7", "table7", ""],
        }
    )
    meta = fid.group_meta(groups, published, fit_groups=["fit"])
    assert list(meta["calibration"]) == ["out-of-sample", "out-of-sample", "in-sample", ""]
    m = fid.metrics(pd.Series({"t6": 1.9, "t7": 1.1, "fit": 1.35, "none": 4.0}), meta, tests=False)
    assert m["mae_in_sample"] == pytest.approx(0.05)
    assert m["mae_out_of_sample_table6"] == pytest.approx(0.4)
    assert m["mae_out_of_sample_other"] == pytest.approx(0.1)
    assert m["max_pfi_table6"] == pytest.approx(1.9)  # "none" has no Table 6 value
    # no calibration given: nothing is in sample
    assert math.isnan(
        fid.metrics(pd.Series({"t6": 1.9}), fid.group_meta(groups, published), tests=False)[
            "mae_in_sample"
        ]
    )


def test_no_table_6_group_above_3_is_a_judged_target():
    s = fid.summary_table(
        {"max_pfi_table6": 3.2}, {"max_pfi_table6": 2.9}, pd.DataFrame(), {"max_pfi_table6": 2.67}
    ).set_index("metric")
    assert (s.loc["max_pfi_table6", "met_noise_free"], s.loc["max_pfi_table6", "met_campaign"]) == (
        0.0,
        1.0,
    )
    assert fid.published_metrics(PAPER)["max_pfi_table6"] == pytest.approx(2.67)


def test_summary_marks_targets_met_or_missed_and_summarises_the_seeds():
    order = ("dense", "moe-pt", "moe-ft")
    nf = {
        "spearman_table6": 0.75,
        "median_dense": 1.30,
        "median_moe-pt": 1.60,
        "median_moe-ft": 2.0,
        "clusters_ordered": 1.0,
        "kruskal_H": 10.0,
    }
    camp = {**nf, "spearman_table6": 0.65}
    seeds = pd.DataFrame({"spearman_table6": np.linspace(0.5, 0.9, 21)})
    pub = {"median_dense": 1.27, "median_moe-pt": 1.43, "median_moe-ft": 2.10, "kruskal_H": 12.37}
    s = fid.summary_table(nf, camp, seeds, pub, order).set_index("metric")
    assert (
        s.loc["spearman_table6", "met_noise_free"],
        s.loc["spearman_table6", "met_campaign"],
    ) == (1.0, 0.0)
    assert s.loc["spearman_table6", "seed_median"] == pytest.approx(0.7)
    assert s.loc["spearman_table6", "seed_p05"] == pytest.approx(0.52)
    assert s.loc["spearman_table6", "seed_share_met"] == pytest.approx(
        11 / 21
    )  # 0.70 itself meets ">= 0.70"
    assert s.loc["median_moe-pt", "met_noise_free"] == 0.0  # 0.17 from the published
    assert s.loc["median_moe-ft", "met_noise_free"] == 1.0
    assert math.isnan(s.loc["kruskal_H", "met_noise_free"]) and s.loc["kruskal_H", "target"] == ""
    assert set(s["backend"]) == {"emulated"}


# ---- the emulated PFIs ----------------------------------------------------------------------------


def test_noise_free_curve_of_one_gpu_is_that_of_all_gpus_alike(tiny):
    _, models = tiny
    g = models[0]
    p1, t1 = fid.noise_free_curve(g)
    pn, tn = fid.noise_free_curve(g, gpus=g.job.gpus)
    assert np.allclose(p1, pn) and np.allclose(t1, tn)
    assert pfi_ratio(p1, t1) == pytest.approx(fid.noise_free_pfi([g])[g.id])


def test_seed_draws_replay_the_emulated_backend_up_to_its_per_sample_jitter(tiny):
    """The draw at a campaign's seed vs simulated + summarised runs of the backend: same
    leakages and per-run factors, so they differ only by the jitter the draws leave out."""
    cfg, models = tiny
    g = models[0]
    run_cfg = {"duration_s": 900, "sample_period_s": 5}
    power, tput = [], []
    for cap in g.caps:
        spec = {
            "group": next(x for x in groups(cfg) if x["id"] == g.id),
            "model_facts": cfg["_catalog"][g.model],
            "campaign": "check",
            "run_id": f"cap{cap:g}",
            "seed": 5,
            "cap_w": cap,
            "run": run_cfg,
        }
        tel, steps, _ = run_emulated(spec)
        s = summarize_run(tel, steps, SummaryProtocol())
        power.append(s["power_w"])
        tput.append(s["tokens_per_s"])
    simulated = pfi_ratio(power, tput)
    single = dataclasses.replace(g, runs=tuple((c, f"cap{c:g}") for c in g.caps))
    drawn = fid.seed_pfi([single], "check", 5)[g.id]
    spread = fid.seed_draws([single], "check", range(20)).iloc[:, 0]
    assert abs(drawn - simulated) < 0.25 * (spread.quantile(0.95) - spread.quantile(0.05)) + 0.01
    assert spread.std() > 0  # the draws do vary


def test_published_values_come_from_tables_6_7_8_and_missing_ones_are_said(tiny):
    _, models = tiny
    pub = fid.published_pfi(models, PAPER).set_index("group")
    assert pub.loc["moe-ft-qwen30ba3b-x8", "published_source"] == "table6"
    assert pub.loc["moe-ft-qwen30ba3b-x8", "pfi_published"] == pytest.approx(2.00)
    assert pub.loc["dense-pt-mistral24b-x8", "published_source"] == "table7"
    assert pub.loc["moe-pt-gptoss20b-x8-ep8", "published_source"] == ""  # not a paper group id
    meta = fid.group_meta(models, pub.reset_index())
    table = fid.group_table(
        meta, fid.noise_free_pfi(models), pd.Series(dtype=float), pd.DataFrame()
    )
    notes = table.set_index("group")["note"]
    assert "left out of every correlation" in notes["moe-pt-gptoss20b-x8-ep8"]
    assert "not Table 6" in notes["dense-pt-mistral24b-x8"]
    assert not table.set_index("group").loc["dense-pt-mistral24b-x8", "in_spearman"]


# ---- sensitivity -----------------------------------------------------------------------------------


def test_sensitivity_has_two_rows_per_sensitive_constant_and_a_zero_perturbation_changes_nothing(
    tiny,
):
    _, models = tiny
    meta = fid.group_meta(models, fid.published_pfi(models, PAPER))
    constants = fid.sensitive_constants()
    assert constants and all(
        f.metadata["sensitivity"] and isinstance(getattr(PHYSICS, f.name), float) for f in constants
    )
    table = fid.sensitivity(models, meta, fraction=0.25)
    perturbed = table[table["constant"] != "(none: baseline)"]
    assert len(perturbed) == 2 * (len(constants) + 1)  # and the catalogue's HBM power
    assert set(perturbed["constant"]) == {f.name for f in constants} | {fid.HBM_POWER}
    assert sorted(perturbed.groupby("constant")["change"].agg(tuple).iloc[0]) == ["+25%", "-25%"]
    up = perturbed[perturbed["change"] == "+25%"]
    assert np.allclose(up["perturbed_value"], 1.25 * up["baseline_value"])
    still = fid.sensitivity(models, meta, fraction=0.0)
    deltas = [c for c in still.columns if c.startswith("delta_")]
    assert np.allclose(still[deltas].fillna(0.0).to_numpy(float), 0.0)
    assert set(table["backend"]) == {"emulated"}


def test_some_constant_moves_the_medians(tiny):
    """Property, not today's values: a model whose cluster medians no physics constant moves
    would not be a model of anything."""
    _, models = tiny
    meta = fid.group_meta(models, fid.published_pfi(models, PAPER))
    table = fid.sensitivity(models, meta)
    moved = table[[c for c in table.columns if c.startswith("delta_median_")]].abs().max(axis=1)
    assert moved.max() > 1e-3
    assert table.loc[moved.idxmax(), "source"]  # and it says where the constant comes from


def test_hbm_power_scales_memory_watts_and_the_idle_power_that_holds_them():
    from wattflex.gpus import GPUS

    up = fid.hbm_scaled(1.25)
    for name, g in GPUS.items():
        assert up[name].mem_dyn_w == pytest.approx(1.25 * g.mem_dyn_w)
        assert up[name].idle_w - g.idle_w == pytest.approx(0.25 * g.mem_idle_w)
        assert up[name].sm_clock_max_mhz == g.sm_clock_max_mhz


def test_each_group_names_the_assumption_that_moves_its_pfi_most(tiny):
    """Per group, top_assumption is the assumed perturbation with the largest |PFI change|
    (recomputed here by perturbing it alone), and the named assumptions each have a column."""
    _, models = tiny
    meta = fid.group_meta(models, fid.published_pfi(models, PAPER))
    sens = fid.sensitivity_runs(models, meta)
    table = sens.table
    assert table.loc[table["constant"] == fid.HBM_POWER, "assumed"].all()
    assert table.loc[table["constant"] == "lora_gemm_eff", "assumed"].all()  # its source: "assumed"
    assert table.loc[table["constant"] == "expert_gemm_rel_eff", "assumed"].all()  # UNSETTLED
    assert not table.loc[
        table["constant"] == "attention_eff", "assumed"
    ].any()  # a published figure
    top = fid.top_assumptions(
        sens.per_group, table.loc[1:].set_index(["constant", "change"])["assumed"]
    )
    assert set(top["group"]) == {g.id for g in models}
    assert [c for c in top.columns if c.startswith("delta_pfi[")] == [
        f"delta_pfi[{n}]" for n in fid.NAMED_ASSUMPTIONS
    ]
    g = next(m for m in models if m.cluster == "moe-ft")
    r = top.set_index("group").loc[g.id]
    assert r["top_assumption"] and abs(r["top_assumption_delta_pfi"]) > 0
    pert = next(
        p
        for p in fid.perturbations()
        if (p.constant, p.change) == (r["top_assumption"], r["top_assumption_change"])
    )
    again = (
        fid.noise_free_pfi([g], pert.physics, pert.catalogue)[g.id] - fid.noise_free_pfi([g])[g.id]
    )
    assert again == pytest.approx(r["top_assumption_delta_pfi"])
    assumed = [p for p in fid.perturbations() if p.assumed]
    moved = [
        abs(fid.noise_free_pfi([g], p.physics, p.catalogue)[g.id] - fid.noise_free_pfi([g])[g.id])
        for p in assumed
    ]
    assert abs(r["top_assumption_delta_pfi"]) == pytest.approx(max(moved))
    assert r[f"delta_pfi[{fid.HBM_POWER}]"] > 0  # HBM power moves a capped job's PFI
    assert table["groups_decided"].sum() == len(models)
