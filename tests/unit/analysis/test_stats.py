"""wattflex.analysis.stats and ``wattflex stats``: checked against scipy, scikit-posthocs, statsmodels
and hand-computed values (with ties), and on the paper's own Table 6."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import scikit_posthocs as sp
from scipy.stats import norm, rankdata
from statsmodels.stats.multitest import multipletests

from wattflex.analysis.stats import (
    bh_fdr,
    cluster_tests_table,
    dunn_z,
    kruskal_dunn,
    telemetry_correlations,
)
from wattflex.cli import main

DATA = Path(__file__).resolve().parents[2] / "data"
# Three clusters with ties inside and across clusters, unequal sizes (14/7/4 like the paper).
TIED = pd.DataFrame(
    {
        "cluster": ["dense"] * 14 + ["moe-pt"] * 7 + ["moe-ft"] * 4,
        "pfi": [
            1.10,
            1.22,
            1.27,
            1.52,
            1.17,
            1.23,
            1.25,
            1.26,
            1.27,
            1.30,
            1.30,
            1.34,
            1.47,
            1.51,
            1.24,
            1.35,
            1.36,
            1.43,
            1.45,
            1.52,
            1.57,
            1.79,
            2.00,
            2.20,
            2.67,
        ],
    }
)


def hand_kruskal_h(values, groups) -> float:
    """H = [12/(N(N+1)) sum R_i^2/n_i - 3(N+1)] / [1 - sum(t^3-t)/(N^3-N)]."""
    values, groups = np.asarray(values, float), np.asarray(groups)
    n = values.size
    ranks = rankdata(values)
    h = (
        12
        / (n * (n + 1))
        * sum(ranks[groups == g].sum() ** 2 / (groups == g).sum() for g in set(groups))
    )
    h -= 3 * (n + 1)
    _, t = np.unique(values, return_counts=True)
    return h / (1 - np.sum(t**3 - t) / (n**3 - n))


def test_kruskal_h_matches_hand_formula_with_ties():
    res = kruskal_dunn(TIED, value_col="pfi")
    assert res["kruskal"]["H"] == pytest.approx(
        hand_kruskal_h(TIED["pfi"], TIED["cluster"]), rel=1e-12
    )
    assert res["kruskal"]["df"] == 2 and res["kruskal"]["n"] == 25
    assert [t["value"] for t in res["ties"]] == [1.27, 1.30, 1.52]
    assert [t["across_groups"] for t in res["ties"]] == [False, False, True]


def test_dunn_z_by_hand_without_and_with_ties():
    # No ties: mean ranks 2 and 5, SE = sqrt(6*7/12 * (1/3 + 1/3)).
    assert dunn_z([1, 2, 3, 4, 5, 6], list("aaabbb"), "a", "b") == pytest.approx(
        -3 / np.sqrt(3.5 * 2 / 3)
    )
    # Three tied pairs: ranks 1.5,1.5,3.5 | 3.5,5.5,5.5; tie term 3*(2^3-2)/(12*5) = 0.3.
    z = dunn_z([1, 1, 2, 2, 3, 3], list("aaabbb"), "a", "b")
    assert z == pytest.approx((13 / 6 - 29 / 6) / np.sqrt((3.5 - 0.3) * 2 / 3))
    assert dunn_z([1, 1, 2, 2, 3, 3], list("aaabbb"), "b", "a") == pytest.approx(-z)


def test_dunn_p_values_equal_scikit_posthocs_and_holm_equals_statsmodels():
    res = kruskal_dunn(TIED, value_col="pfi")
    ref = sp.posthoc_dunn(TIED, val_col="pfi", group_col="cluster")
    for d in res["dunn"]:
        # Our own tie-corrected z reproduces scikit-posthocs' raw p exactly.
        assert 2 * norm.sf(abs(d["z"])) == pytest.approx(ref.loc[d["a"], d["b"]], rel=1e-12)
    raw = [d["p_raw"] for d in res["dunn"]]
    assert [d["p_holm"] for d in res["dunn"]] == pytest.approx(
        multipletests(raw, method="holm")[1], rel=1e-12
    )
    assert [(d["a"], d["b"]) for d in res["dunn"]] == [
        ("dense", "moe-pt"),
        ("dense", "moe-ft"),
        ("moe-pt", "moe-ft"),
    ]
    assert all(d["z"] < 0 for d in res["dunn"])  # clusters listed in increasing PFI


def test_published_table6_with_the_rounding_tie_broken_reproduces_tables_10_11():
    """Table 6 is rounded to 2 decimals; the paper's unrounded PFIs had no cross-cluster tie.

    Breaking the only cross-cluster tie (1.52: dense-ft-qwen32b-x16 vs
    moe-pt-qwen30ba3b-x8-ep8) with the dense group above gives the published numbers.
    """
    table = pd.read_csv(DATA / "analysis_table6_pfi.csv")
    rounded = kruskal_dunn(table, value_col="pfi")
    assert rounded["kruskal"]["H"] == pytest.approx(12.48, abs=0.005)
    untied = table.copy()
    untied.loc[untied["group"] == "dense-ft-qwen32b-x16", "pfi"] += 1e-4
    res = kruskal_dunn(untied, value_col="pfi")
    assert res["kruskal"]["H"] == pytest.approx(12.37, abs=0.01)
    assert res["kruskal"]["p"] == pytest.approx(0.0021, abs=5e-5)
    published = {
        ("dense", "moe-ft"): (-3.44, 0.0006, 0.0017),
        ("moe-pt", "moe-ft"): (-1.90, 0.0568, 0.1137),
        ("dense", "moe-pt"): (-1.64, 0.1020, 0.1137),
    }
    for d in res["dunn"]:
        z, p_raw, p_holm = published[(d["a"], d["b"])]
        assert d["z"] == pytest.approx(z, abs=0.03)
        assert d["p_raw"] == pytest.approx(p_raw, abs=5e-4)
        assert d["p_holm"] == pytest.approx(p_holm, abs=1e-3)
    medians = {g["group"]: g["median"] for g in res["groups"]}
    assert medians == pytest.approx({"dense": 1.27, "moe-pt": 1.43, "moe-ft": 2.10}, abs=1e-3)


def test_kruskal_dunn_drops_missing_and_rejects_bad_input():
    df = pd.concat(
        [TIED, pd.DataFrame({"cluster": ["dense", None], "pfi": [np.nan, 1.3]})], ignore_index=True
    )
    res = kruskal_dunn(df, value_col="pfi")
    assert res["n_dropped"] == 2 and res["kruskal"]["n"] == 25
    with pytest.raises(ValueError, match="missing column"):
        kruskal_dunn(TIED, value_col="pfi_ratio")
    with pytest.raises(ValueError, match="non-numeric"):
        kruskal_dunn(
            TIED.assign(pfi=TIED["pfi"].astype(object).where(TIED.index != 3, "n/a")),
            value_col="pfi",
        )


def test_cluster_tests_table_has_the_published_rows():
    table = cluster_tests_table(kruskal_dunn(TIED, value_col="pfi"))
    assert table["comparison"].tolist() == [
        "dense|moe-pt|moe-ft",
        "dense vs moe-pt",
        "dense vs moe-ft",
        "moe-pt vs moe-ft",
    ]
    assert table["n"].tolist() == ["25", "14|7", "14|4", "7|4"]
    assert np.isnan(table["p_holm"].iloc[0])


def test_bh_fdr_matches_statsmodels_and_keeps_nan_out_of_the_family():
    p = np.array([0.001, 0.04, np.nan, 0.03, 0.5, 0.012, np.nan, 0.2])
    q = bh_fdr(p)
    ok = ~np.isnan(p)
    assert np.isnan(q[~ok]).all()
    assert q[ok] == pytest.approx(multipletests(p[ok], method="fdr_bh")[1], rel=1e-12)


def test_telemetry_correlations_slope_rho_and_constant_metric():
    x = np.array([0.1, 0.2, 0.3, 0.5, 0.8, 1.3])
    groups = pd.DataFrame(
        {"pfi": 1 + 2 * x, "good": x, "inverse": -(x**2) + [0, 0.01, 0, 0.02, 0, 0], "flat": 5.0}
    )
    out = telemetry_correlations(groups, ["good", "inverse", "flat", "absent"]).set_index("metric")
    assert out.loc["good", "ols_slope"] == pytest.approx(2.0)
    assert out.loc["good", "spearman_rho"] == pytest.approx(1.0)
    assert out.loc["inverse", "spearman_rho"] == pytest.approx(-1.0)
    assert out.loc["flat", "note"] == "constant" and np.isnan(out.loc["flat", "bh_q"])
    assert out.loc["absent", "note"] == "absent"
    tested = out["spearman_p"].notna()
    assert out.loc[tested, "bh_q"].to_numpy() == pytest.approx(
        multipletests(out.loc[tested, "spearman_p"], method="fdr_bh")[1]
    )


def test_cli_stats_on_table6_writes_json(tmp_path, capsys):
    out = tmp_path / "stats.json"
    assert (
        main(
            [
                "stats",
                str(DATA / "analysis_table6_pfi.csv"),
                "--value-col",
                "pfi",
                "--group-col",
                "cluster",
                "-o",
                str(out),
            ]
        )
        == 0
    )
    doc = json.loads(out.read_text())
    assert set(doc["kruskal"]) >= {"H", "df", "p"}
    assert {k for d in doc["dunn"] for k in d} >= {"a", "b", "n_a", "n_b", "z", "p_raw", "p_holm"}
    assert doc["schema_version"] and doc["provenance"]["inputs"]
    assert "Kruskal-Wallis H = 12.485" in capsys.readouterr().out


def test_cli_stats_missing_column_is_a_one_line_error(tmp_path, capsys):
    assert main(["stats", str(DATA / "analysis_table6_pfi.csv"), "--value-col", "pfi_ratio"]) == 2
    err = capsys.readouterr().err
    assert "missing column" in err and "pfi_ratio" in err and "Traceback" not in err
    assert main(["stats", str(tmp_path / "nope.csv")]) == 2


# ---- undefined statistics are null with a reason, never NaN or SciPy warnings ---------------


def _strict(text: str):
    def refuse(constant):
        raise ValueError(f"non-standard JSON constant {constant}")

    return json.loads(text, parse_constant=refuse)


def test_all_tied_values_give_null_statistics_with_a_reason():
    import warnings

    df = pd.DataFrame(
        {
            "cluster": ["dense", "dense", "moe-pt", "moe-pt", "moe-ft", "moe-ft"],
            "pfi_ratio": [1.0] * 6,
        }
    )
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a SciPy RuntimeWarning fails the test
        result = kruskal_dunn(df)
    kw = result["kruskal"]
    assert kw["H"] is None and kw["p"] is None
    assert kw["note"] == "undefined: all 6 values are equal (1), so ranks carry no information"
    assert all(
        d["z"] is None
        and d["p_raw"] is None
        and d["p_holm"] is None
        and not d["significant"]
        and d["note"] == kw["note"]
        for d in result["dunn"]
    )


def test_stats_json_is_strict_json_on_tied_values(tmp_path, run_cli):
    import warnings

    (tmp_path / "t.csv").write_text(
        "group,cluster,pfi_ratio\n"
        + "".join(
            f"g{i},{c},1.0\n"
            for i, c in enumerate(["dense", "dense", "moe-pt", "moe-pt", "moe-ft", "moe-ft"])
        )
    )
    for extra in ([], ["-o", "out.json"]):
        with warnings.catch_warnings():
            warnings.simplefilter(
                "error"
            )  # scipy's or numpy's warning on tied values fails the test
            proc = run_cli("stats", "t.csv", *extra, cwd=tmp_path)
        assert proc.returncode == 0 and "Warning" not in proc.stderr, proc.stderr
        doc = _strict(proc.stdout if not extra else (tmp_path / "out.json").read_text())
        assert doc["kruskal"]["H"] is None and "all 6 values are equal" in doc["kruskal"]["note"]
    assert "undefined: all 6 values are equal" in proc.stdout


def test_json_safe_turns_non_finite_numbers_into_null():
    from wattflex.provenance import json_safe

    doc = {
        "a": float("nan"),
        "b": [np.float64("inf"), np.float32("nan"), 1.5],
        "c": {"d": -np.inf, "e": "x"},
        "f": np.int64(3),
    }
    assert json_safe(doc) == {"a": None, "b": [None, None, 1.5], "c": {"d": None, "e": "x"}, "f": 3}


def test_one_cluster_is_not_tested_and_says_why():
    """A campaign of one cluster has nothing to compare: a result that says so, not a failed job."""
    res = kruskal_dunn(TIED[TIED["cluster"] == "dense"], value_col="pfi")
    assert res["status"] == "not_tested" and res["dunn"] == []
    assert res["reason"] == "need at least 2 groups in 'cluster' to compare, found 1 (dense)"
    assert res["kruskal"]["H"] is None and res["kruskal"]["p"] is None and res["kruskal"]["n"] == 14
    assert res["groups"][0]["group"] == "dense" and res["groups"][0]["n"] == 14
    json.dumps(res, allow_nan=False)  # strict JSON, as cluster_stats writes it
    table = cluster_tests_table(res)
    assert list(table["test"]) == ["kruskal_wallis"] and table["statistic"].isna().all()


def test_kruskal_dunn_refuses_an_unknown_p_adjust_before_any_test():
    # statsmodels itself says only "method not recognized"; the config's stats.p_adjust goes here too
    df = pd.DataFrame(
        {"cluster": ["dense", "dense", "moe-pt", "moe-pt"], "pfi_ratio": [1.0, 1.2, 2.0, 2.2]}
    )
    with pytest.raises(
        ValueError,
        match=r"p_adjust 'bogus': not a multiple-comparison method of statsmodels; "
        r"one of b, s, h",
    ):
        kruskal_dunn(df, p_adjust="bogus")
