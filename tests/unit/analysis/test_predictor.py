"""wattflex.analysis.predictor and ``wattflex predict``: features, LOO/LOCO on datasets whose answer is
known, leverage against statsmodels, the saved model and its predictions."""

from __future__ import annotations

import json
import re

import numpy as np
import pandas as pd
import pytest
from statsmodels.regression.linear_model import OLS
from statsmodels.stats.outliers_influence import OLSInfluence

from wattflex.analysis import predictor as pr
from wattflex.cli import main
from wattflex.provenance import provenance, write_json


def groups_table(n_per_cluster=(6, 4, 3), seed=3) -> pd.DataFrame:
    """Per-group telemetry where PFI rises with the DRAM copy product, plus noise."""
    rng = np.random.default_rng(seed)
    rows = []
    for cluster, n, arch, task in zip(
        ("dense", "moe-pt", "moe-ft"), n_per_cluster, ("dense", "moe", "moe"), ("pt", "pt", "lora")
    ):
        for i in range(n):
            dram = rng.uniform(0.05, 0.3) + (0.1 if arch == "moe" else 0)
            copy = rng.uniform(5, 35)
            rows.append(
                {
                    "group": f"{cluster}-{i}",
                    "cluster": cluster,
                    "set": "headline",
                    "architecture": arch,
                    "task": task,
                    "gpus": [8, 16, 32][i % 3],
                    "dram_active": dram,
                    "mem_copy_util": copy,
                    "tensor_active": rng.uniform(0.3, 0.65),
                    "sm_active": rng.uniform(0.8, 0.9),
                    "sm_clock_mhz": rng.uniform(1850, 1980),
                    "mem_clock_mhz": 3201.0,
                    "gpu_util": rng.uniform(92, 99),
                    "fb_used_gib": rng.uniform(20, 130),
                    "temp_c": rng.uniform(70, 77),
                    "power_per_gpu_w": rng.uniform(650, 695),
                }
            )
    df = pr.add_features(pd.DataFrame(rows))
    df["pfi"] = 1.2 + 0.08 * df["dram_copy_product"] + rng.normal(0, 0.05, len(df))
    return df


def test_features_scaling_and_metadata():
    df = pr.add_features(
        pd.DataFrame(
            {
                "dram_active": [0.6, 0.0],
                "mem_copy_util": [40.0, 10.0],
                "tensor_active": [0.3, 0.5],
                "architecture": ["moe", "dense"],
                "task": ["lora", "pt"],
                "gpus": [16, 8],
            }
        )
    )
    assert df["dram_copy_product"].tolist() == pytest.approx([24.0, 0.0])  # fraction x percent
    assert df["arithmetic_intensity"].iloc[0] == pytest.approx(0.5)
    assert np.isnan(df["arithmetic_intensity"].iloc[1])  # no DRAM activity: undefined, not inf
    assert df[["is_moe", "is_lora", "log2_gpus"]].to_numpy().tolist() == [[1, 1, 4], [0, 0, 3]]


def test_uncapped_telemetry_averages_repeats_at_the_top_cap():
    runs = pd.DataFrame(
        {
            "group": ["g"] * 4 + ["h"] * 2,
            "cap_w": [200, 700, 700, 700, 300, 600],
            "repeat": [0, 0, 1, 2, 0, 0],
            "dram_active": [0.9, 0.1, 0.2, 0.3, 0.5, 0.7],
            "cluster": ["dense"] * 4 + ["moe-ft"] * 2,
        }
    )
    top = pr.uncapped_telemetry(runs).set_index("group")
    assert top.loc["g", "dram_active"] == pytest.approx(0.2)
    assert top.loc["h", "dram_active"] == pytest.approx(0.7)
    assert top.loc["h", "cluster"] == "moe-ft"


def test_loo_predictions_equal_the_press_identity():
    """For OLS the leave-one-out residual is e_i / (1 - h_ii): a known closed form."""
    df = groups_table()
    X = df[["dram_copy_product", "tensor_active"]].to_numpy()
    y = df["pfi"].to_numpy()
    design = np.column_stack([np.ones(len(y)), X])
    hat = design @ np.linalg.inv(design.T @ design) @ design.T
    resid = y - hat @ y
    press = resid / (1 - np.diag(hat))
    assert y - pr.cv_predictions(X, y) == pytest.approx(press, rel=1e-9)


def test_loo_on_an_exact_line_is_perfect():
    df = pd.DataFrame({"dram_copy_product": [1.0, 2, 3, 5, 8], "cluster": list("aabbc")})
    df["pfi"] = 1 + 0.1 * df["dram_copy_product"]
    m = pr.evaluate(df, ["dram_copy_product"])
    assert m["loo_r2"] == pytest.approx(1.0) and m["loo_rmse"] == pytest.approx(0.0, abs=1e-12)
    assert m["loco_r2"] == pytest.approx(1.0) and m["r2_in"] == pytest.approx(1.0)


def test_loco_folds_are_clusters_with_a_known_answer():
    # Clusters A and B lie on y = 2x + 1; cluster C sits 3 above that line.
    x = np.array([0, 1, 2, 3, 4, 5, 6, 7, 8.0])
    cluster = np.array(list("AAABBBCCC"))
    y = 2 * x + 1 + np.where(cluster == "C", 3.0, 0.0)
    pred = pr.cv_predictions(x[:, None], y, cluster)
    assert pred[cluster == "C"] == pytest.approx(2 * x[cluster == "C"] + 1)  # fit on A+B is exact
    for held in "AB":  # the other folds: an OLS on the two remaining clusters, by numpy
        slope, icept = np.polyfit(x[cluster != held], y[cluster != held], 1)
        assert pred[cluster == held] == pytest.approx(slope * x[cluster == held] + icept)
    df = pd.DataFrame({"dram_copy_product": x, "pfi": y, "cluster": cluster})
    m = pr.evaluate(df, ["dram_copy_product"])
    assert m["loco_rmse"] == pytest.approx(np.sqrt(np.mean((y - pred) ** 2)))
    assert m["loco_r2"] == pytest.approx(1 - np.sum((y - pred) ** 2) / np.sum((y - y.mean()) ** 2))


@pytest.mark.parametrize(
    "cols", [["dram_copy_product"], ["dram_copy_product", "tensor_active", "log2_gpus"]]
)
def test_leverage_equals_statsmodels_hat_diagonal(cols):
    df = groups_table()
    X = df[cols].to_numpy()
    ref = OLSInfluence(
        OLS(df["pfi"].to_numpy(), np.column_stack([np.ones(len(X)), X])).fit()
    ).hat_matrix_diag
    h = pr.leverage(X)
    assert h == pytest.approx(ref, rel=1e-9)
    assert h.sum() == pytest.approx(len(cols) + 1)


def test_leverage_handles_a_duplicated_column():
    X = groups_table()[["dram_copy_product"]].to_numpy()
    assert pr.leverage(np.column_stack([X, 2 * X])) == pytest.approx(pr.leverage(X))


def test_leverage_sensitivity_drops_the_outlying_group_first():
    df = groups_table()
    df.loc[0, "dram_copy_product"] = 60.0  # far out in x: the highest leverage
    table = pr.leverage_sensitivity(df, ["dram_copy_product"], k_max=3)
    assert table["k"].tolist() == [0, 1, 2, 3] and table["n"].tolist() == [13, 12, 11, 10]
    assert table.loc[1, "dropped_group"] == df.loc[0, "group"]
    assert table["dropped_leverage"].iloc[1:].is_monotonic_decreasing


def test_ablation_sets_and_all_dcgm_skips_constant_metrics():
    df = groups_table()
    table = pr.ablation(df).set_index("predictors")
    assert list(table.index) == list(pr.ABLATION_SETS)
    assert (
        table.loc["job_metadata", "p"] == 3
        and table.loc["dram_copy_product+job_metadata", "p"] == 4
    )
    assert "mem_clock_mhz" not in table.loc["all_dcgm", "features"]  # constant: no information
    assert table.loc["all_dcgm", "p"] == len(pr.DCGM_METRICS) - 1
    assert table.loc["dram_copy_product", "r2_in"] >= table.loc["dram_copy_product", "loo_r2"]
    with pytest.raises(ValueError, match="unknown feature"):
        pr.resolve_features("dram_copy_product+magic")


def test_ablation_scores_no_model_for_a_set_with_no_varying_metric():
    df = groups_table()
    for m in pr.DCGM_METRICS:  # identical telemetry in every group (fake GPUs, one job)
        if m in df.columns:
            df[m] = 1.0
    table = pr.ablation(df).set_index("predictors")
    assert table.loc["all_dcgm", "p"] == 0 and table.loc["all_dcgm", "features"] == ""
    assert np.isnan(table.loc["all_dcgm", "loo_r2"]) and np.isnan(table.loc["all_dcgm", "r2_in"])
    assert table.loc["job_metadata", "p"] == 3  # the other sets are still scored


def test_within_cluster_subsets():
    table = pr.within_cluster(groups_table(), ["dram_copy_product"]).set_index("subset")
    assert table["n"].to_dict() == {"dense only": 6, "moe only": 7, "all but moe-ft": 10, "all": 13}
    assert table.loc["all", "spearman_rho"] > 0.5


def test_model_document_round_trip_and_predictions_table(tmp_path):
    df = groups_table()
    extra = df.iloc[:2].assign(
        group=["val-0", "h100-0"], set=["validation", "h100"], pfi=[np.nan, 1.5]
    )
    model = pr.fit_model(df, "dram_copy_product")
    write_json(model, tmp_path / "model.json", provenance(params={}))
    loaded = json.loads((tmp_path / "model.json").read_text())
    assert loaded["features"] == ["dram_copy_product"]
    assert loaded["required_columns"] == ["dram_active", "mem_copy_util"]
    assert loaded["training_groups"] == df["group"].tolist()
    slope, icept = np.polyfit(df["dram_copy_product"], df["pfi"], 1)
    assert loaded["coefficients"]["dram_copy_product"] == pytest.approx(slope)
    assert loaded["intercept"] == pytest.approx(icept)
    raw = df[["dram_active", "mem_copy_util"]]  # features are derived from raw telemetry
    assert pr.predict(loaded, raw) == pytest.approx(icept + slope * df["dram_copy_product"])

    preds = pr.predictions_table(pd.concat([df, extra], ignore_index=True), model)
    assert len(preds) == len(df) + 2 and preds["group"].is_unique
    assert preds["pfi_pred_loo"].notna().sum() == len(df)
    assert np.isnan(preds.set_index("group").loc["val-0", "pfi"])
    scores = pr.holdout_scores(preds).set_index("set")
    assert scores.loc["headline", "prediction"] == "loo"
    assert scores.loc["headline", "r2"] == pytest.approx(model["metrics"]["loo_r2"])
    assert scores.loc["validation", "n"] == 0


def test_predict_names_the_missing_raw_columns():
    model = pr.fit_model(groups_table(), "dram_copy_product+job_metadata")
    with pytest.raises(ValueError, match=r"mem_copy_util"):
        pr.predict(
            model,
            pd.DataFrame(
                {"dram_active": [0.2], "architecture": ["moe"], "task": ["pt"], "gpus": [8]}
            ),
        )


@pytest.mark.parametrize(
    "change, message",
    [
        (
            {"coefficients": {"dram_copy_product": 1e308}, "intercept": 1e308},
            "PFI of data row(s) 1, 2 is not a finite number",
        ),  # finite numbers whose sum overflows
        ({"intercept": float("inf")}, "intercept inf is not a finite number"),
        (
            {"coefficients": {"dram_copy_product": True}},
            "coefficient 'dram_copy_product' True is not a finite number",
        ),
    ],
)
def test_predict_refuses_a_model_that_gives_no_finite_pfi(change, message):
    model = {**pr.fit_model(groups_table(), "dram_copy_product"), **change}
    jobs = pd.DataFrame({"dram_active": [0.1, 0.4], "mem_copy_util": [10.0, 30.0]})
    with pytest.raises(ValueError, match=re.escape(message)):
        pr.predict(model, jobs)


def test_cli_predict(tmp_path, capsys):
    model = pr.fit_model(groups_table(), "dram_copy_product")
    write_json(model, tmp_path / "model.json", provenance(params={}))
    jobs = pd.DataFrame(
        {"job": ["a", "b"], "dram_active": [0.1, 0.4], "mem_copy_util": [10.0, 30.0]}
    )
    jobs.to_csv(tmp_path / "jobs.csv", index=False)
    out = tmp_path / "pred.csv"
    assert (
        main(
            [
                "predict",
                str(tmp_path / "jobs.csv"),
                "--model",
                str(tmp_path / "model.json"),
                "-o",
                str(out),
            ]
        )
        == 0
    )
    got = pd.read_csv(out)
    expect = model["intercept"] + model["coefficients"]["dram_copy_product"] * np.array([1.0, 12.0])
    assert got["pfi_pred"].to_numpy() == pytest.approx(expect)
    assert (tmp_path / "pred.csv.meta.json").is_file()
    jobs.drop(columns="mem_copy_util").to_csv(tmp_path / "bad.csv", index=False)
    assert (
        main(["predict", str(tmp_path / "bad.csv"), "--model", str(tmp_path / "model.json")]) == 2
    )
    assert "mem_copy_util" in capsys.readouterr().err


# A campaign of one or two groups has no predictor to fit; the analysis records why
# (a model that says not_fitted, predictions without pfi_pred) and goes on.
def test_too_few_groups_give_a_model_that_says_not_fitted_and_why(tmp_path, capsys):
    df = groups_table().iloc[:2]
    with pytest.raises(
        pr.TooFewGroups, match=r"need at least 3 groups .* in set 'headline' .*have 2"
    ) as err:
        pr.training_rows(df, "headline")
    model = pr.not_fitted_model("dram_copy_product", str(err.value))
    assert (
        model["status"] == pr.NOT_FITTED
        and not pr.is_fitted(model)
        and model["reason"] == str(err.value)
    )
    preds = pr.predictions_table(df, model)
    assert list(preds["group"]) == list(df["group"]) and preds["pfi_pred"].isna().all()
    assert preds["pfi"].tolist() == pytest.approx(df["pfi"].tolist())
    with pytest.raises(ValueError, match="not fitted: need at least 3 groups"):
        pr.predict(model, df)
    write_json(model, tmp_path / "model.json", provenance(params={}))
    pd.DataFrame({"dram_active": [0.1], "mem_copy_util": [10.0]}).to_csv(
        tmp_path / "jobs.csv", index=False
    )
    assert (
        main(["predict", str(tmp_path / "jobs.csv"), "--model", str(tmp_path / "model.json")]) == 2
    )
    assert "was not fitted: need at least 3 groups" in capsys.readouterr().err
