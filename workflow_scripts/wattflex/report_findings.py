"""The report's first screen: each of the paper's findings, the published value beside this
campaign's, and the fidelity verdict where the emulation has a target for it.

Every row is read from an artifact the campaign wrote (a finding whose artifact is missing is
left out, never guessed); the published values come from those artifacts' ``published``
columns, the paper's tables, or the paper's text as quoted in ``PAPER_TEXT``. A value that
would surprise a reader (an R² below 0, a gain three times the paper's) carries a sentence.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from wattflex.policies import published
from wattflex.report_format import format_value

#: The paper's numbers that no artifact carries in a ``published`` column (Colangelo et al.,
#: arXiv:2609.11542: §4 text and Table 6 for the PFI range).
PAPER_TEXT = {
    "pfi_range": (1.10, 2.67),  # §4: "PFI ranges from 1.10 to 2.67" (Table 6)
}
#: Campaign / published ratios outside [1/2, 2] get a sentence.
SURPRISE_RATIO = 2.0
CLUSTERS = ("dense", "moe-pt", "moe-ft")


@dataclass(frozen=True)
class Finding:
    """One row of the key results: what the paper found, its number, ours, the verdict."""

    section: str  # the report section that shows it (an anchor)
    claim: str
    published: str
    campaign: str
    verdict: str = ""  # "met" | "missed" | "" (no target)
    target: str = ""
    note: str = ""  # a sentence where the number would surprise


def _csv(files: Mapping[str, Path], rel: str) -> pd.DataFrame | None:
    path = files.get(rel)
    if path is None:
        return None
    df = pd.read_csv(path)
    return df if len(df) else None


def _verdict(met: float | None) -> str:
    if met is None or (isinstance(met, float) and math.isnan(met)):
        return ""
    return "met" if float(met) == 1.0 else "missed"


def _ratio_note(ours: float, published: float, what: str) -> str:
    if not (published and ours) or (ours > 0) != (published > 0):
        return ""
    r = ours / published
    if r >= SURPRISE_RATIO or r <= 1 / SURPRISE_RATIO:
        return (
            f"{format_value(r, 1)}× the paper's {what}: the campaign's jobs, curves and mix "
            "differ from the paper's cluster by that much; the sections below show where."
        )
    return ""


def _r2_note(value: float) -> str:
    if value < 0:
        return (
            "An R² below 0 means predicting every held-out group at the training groups' mean "
            "would have done better: the signal separates clusters, it does not rank groups "
            "within a cluster it has not seen (the paper's Table 13 says the same)."
        )
    return ""


class _Fidelity:
    """The fidelity summary (emulated campaigns), by metric."""

    def __init__(self, df: pd.DataFrame | None):
        self.rows = {} if df is None else {r["metric"]: r for _, r in df.iterrows()}

    def get(self, metric: str) -> pd.Series | None:
        return self.rows.get(metric)

    def verdict(self, metric: str) -> tuple[str, str]:
        row = self.get(metric)
        if row is None or not str(row.get("target") or "").strip() or pd.isna(row.get("target")):
            return "", ""
        return _verdict(row.get("met_campaign")), str(row["target"])


def _pfi_findings(files, fid: _Fidelity) -> list[Finding]:
    table6 = _csv(files, "tables/table6_pfi.csv")
    if table6 is None or "pfi" not in table6:
        return []
    head = table6[table6["set"] == "headline"] if "set" in table6 else table6
    head = head if len(head) else table6
    lo, hi = PAPER_TEXT["pfi_range"]
    verdict, target = fid.verdict("max_pfi_table6")
    out = [
        Finding(
            "pfi",
            "PFI per group spans a range, none below 1 (Table 6)",
            f"{format_value(lo, 2)} – {format_value(hi, 2)}",
            f"{format_value(head['pfi'].min(), 2)} – {format_value(head['pfi'].max(), 2)}",
            verdict,
            target,
        )
    ]
    if "cluster" in head:
        medians = head.groupby("cluster")["pfi"].median()
        for cluster in CLUSTERS:
            if cluster not in medians:
                continue
            row = fid.get(f"median_{cluster}")
            pub = row["published"] if row is not None else None
            verdict, target = fid.verdict(f"median_{cluster}")
            out.append(
                Finding(
                    "pfi",
                    f"Median PFI of the {cluster} cluster",
                    format_value(pub, 2) if pub is not None else "—",
                    format_value(medians[cluster], 2),
                    verdict,
                    target,
                )
            )
    spearman = fid.get("spearman_table6")
    if spearman is not None:
        verdict, target = fid.verdict("spearman_table6")
        out.append(
            Finding(
                "fidelity",
                "Groups ranked as in Table 6 (Spearman ρ with the published PFI)",
                "1 (the paper itself)",
                format_value(spearman["campaign"], 2),
                verdict,
                target,
            )
        )
    pattern = fid.get("dunn_pattern_matches")
    if pattern is not None:
        pairs = [
            m.removeprefix("dunn_significant[").removesuffix("]")
            for m, r in fid.rows.items()
            if m.startswith("dunn_significant[") and float(r["campaign"]) == 1.0
        ]
        verdict, target = fid.verdict("dunn_pattern_matches")
        out.append(
            Finding(
                "pfi",
                "Clusters significantly different after Holm (Dunn, Table 11)",
                "dense vs moe-ft only",
                ", ".join(pairs) or "none",
                verdict,
                target,
            )
        )
    return out


def _predictor_findings(files, fid: _Fidelity) -> list[Finding]:
    out = []
    ablation = _csv(files, "predictor/ablation.csv")
    if ablation is not None and "predictors" in ablation:
        best = ablation[ablation["predictors"] == "dram_copy_product"]
        for col, label in (("loo_r2", "leave-one-out"), ("loco_r2", "leave-one-cluster-out")):
            if best.empty or col not in best:
                continue
            ours = float(best[col].iat[0])
            pub = best.get(f"{col}_published")
            out.append(
                Finding(
                    "predictor",
                    f"DRAM copy product alone predicts PFI: {label} R² (Table 3)",
                    format_value(pub.iat[0], 3) if pub is not None else "—",
                    format_value(ours, 3),
                    note=_r2_note(ours),
                )
            )
    summary = _csv(files, "tables/analysis_summary.csv")
    if summary is not None:
        rows = {(r["table"], r["metric"]): r for _, r in summary.iterrows()}
        for key, claim, section, met in (
            (
                ("h100_vs_h200", "spearman_rho"),
                "H100 keeps the H200 rank order (Spearman ρ, Table 8)",
                "predictor",
                "spearman_h100_vs_h200",
            ),
            (
                ("h100_vs_h200", "predictor_r2_h100"),
                "The H200 predictor on H100 groups (R², Table 8)",
                "predictor",
                "",
            ),
            (
                ("grid_sensitivity", "median_delta_pct"),
                "4-cap vs 6-cap grid: median PFI change, % (Table 9)",
                "grid",
                "",
            ),
            (
                ("repeatability", "median_cv_tokens_pct"),
                "Repeat runs: median CV of tokens/s, % (§2)",
                "repeatability",
                "",
            ),
        ):
            row = rows.get(key)
            if row is None:
                continue
            verdict, target = fid.verdict(met) if met else ("", "")
            value = float(row["value"])
            out.append(
                Finding(
                    section,
                    claim,
                    format_value(row["published"]),  # 3 significant digits each: the
                    format_value(value),  # paper's 10.7 is not shown as 10.700
                    verdict,
                    target,
                    _r2_note(value) if "r2" in key[1] else "",
                )
            )
    return out


def _allocation_findings(files, fid: _Fidelity) -> list[Finding]:
    head = _csv(files, "allocation/headline.csv")
    if head is None or "policy" not in head:
        return []
    row = head[head["policy"] == published()]
    if row.empty:
        return []
    r = row.iloc[0]
    cut = f"{format_value(100 * float(r['cut']), 0)} % cut, {r['mix']} mix"
    gain, gain_pub = (
        float(r["tokens_per_s_per_job_recovered"]),
        float(r["published_tokens_per_s_per_job_recovered"]),
    )
    gap, gap_pub = float(r["gap_closed"]), float(r["published_gap_closed"])
    return [
        Finding(
            "allocation",
            f"PFI-aware allocation recovers tokens/s per job over equal weight ({cut}, Fig. 8)",
            format_value(gain_pub, 0),
            format_value(gain, 0),
            note=_ratio_note(gain, gain_pub, "gain"),
        ),
        Finding(
            "allocation",
            f"… closing this share of the equal-weight-to-oracle gap ({cut})",
            f"{format_value(100 * gap_pub, 0)} %",
            f"{format_value(100 * gap, 0)} %",
            note=_ratio_note(gap, gap_pub, "share of the gap"),
        ),
    ]


def _beyond_findings(files, fid: _Fidelity) -> list[Finding]:
    out = []
    offer = _csv(files, "offer/offer.csv")
    if offer is not None and {"job", "shed_kw", "max_throughput_loss"} <= set(offer):
        total = offer[offer["job"] == "TOTAL"].sort_values("max_throughput_loss")
        for _, r in total.iterrows():
            out.append(
                Finding(
                    "offer",
                    f"kW the site can shed at ≤ {format_value(100 * r['max_throughput_loss'], 0)} % "
                    "throughput loss",
                    "—",
                    format_value(r["shed_kw"], 0),
                )
            )
    control = _csv(files, "control/summary.csv")
    if control is not None and {"policy", "gap_closed_vs_equal_weight"} <= set(control):
        for scenario, sub in control.groupby("scenario", sort=False):
            pfi = sub[sub["policy"] == published()]
            if pfi.empty:
                continue
            out.append(
                Finding(
                    "control",
                    f"Closed-loop PFI-aware control, {scenario}: share of the equal-weight-to-"
                    "oracle gap closed",
                    "—",
                    f"{format_value(100 * float(pfi['gap_closed_vs_equal_weight'].iat[0]), 0)} %",
                )
            )
    return out


#: The first screen's two tables: the paper's findings in its order, then beyond the paper.
PAPER: tuple[Callable[..., list[Finding]], ...] = (
    _pfi_findings,
    _predictor_findings,
    _allocation_findings,
)
BEYOND: tuple[Callable[..., list[Finding]], ...] = (_beyond_findings,)


def key_results(files: Mapping[str, Path]) -> dict[str, list[Finding]]:
    """The first screen's rows from the campaign's artifacts (``files``: path relative to
    ``results/<campaign>/`` -> path): ``paper`` (each finding, published beside ours) and
    ``beyond`` (what the paper does not measure)."""
    fid = _Fidelity(_csv(files, "tables/fidelity_summary.csv"))
    return {
        "paper": [f for make in PAPER for f in make(files, fid)],
        "beyond": [f for make in BEYOND for f in make(files, fid)],
    }


def fidelity_verdict(files: Mapping[str, Path]) -> dict[str, int] | None:
    """How many of the emulation's fidelity targets this campaign meets (``met``, ``of``), or
    None without a fidelity summary (a measured campaign)."""
    df = _csv(files, "tables/fidelity_summary.csv")
    if df is None or "target" not in df:
        return None
    judged = df[df["target"].fillna("").astype(str).str.strip() != ""]
    return {"met": int((judged["met_campaign"] == 1.0).sum()), "of": len(judged)}
