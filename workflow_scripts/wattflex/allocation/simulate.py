"""The allocation study (paper §6, and beyond): every policy on simulated workloads.

Workloads of jobs are drawn from the campaign's groups ("random": uniform with replacement;
"production": a job is pretraining with probability ``pretraining_fraction``, else
fine-tuning, then uniform within its kind); every policy
(:func:`wattflex.allocation.allocator.allocate`) runs at every cut. :func:`simulate`
returns per-workload results, summaries, the paper's headline, SLA tiers (each job draws a
maximum slowdown) and an out-of-sample check (policies fitted on one half of the groups,
evaluated on workloads of the other half).

Every random draw is made up front (:func:`draw`) and none depends on the cuts, so the
study splits into one job per cut (:func:`simulate_cuts`) whose parts :func:`combine`
merges into exactly the tables of one single run (rules/allocation.smk).
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from wattflex.allocation.allocator import allocate, predicted_curves
from wattflex.allocation.curves import Curves, cap_rows, curves_from_runs, is_concave
from wattflex.allocation.settings import PART_TABLES, SimulationConfig
from wattflex.policies import baseline, get, names, optimum, published

log = logging.getLogger("wattflex.allocation.simulate")


@dataclass
class GroupTable:
    """The campaign's groups as allocation sees them: curves (G, K) + per-group features."""

    groups: pd.DataFrame  # group, task, cluster, gpus, pfi_measured, pfi, dram_copy_product
    curves: Curves
    backend: str

    def features(self, index: np.ndarray, pfi: np.ndarray | None = None) -> dict[str, np.ndarray]:
        """The per-job inputs the policies read (``pfi``, ``pfi_measured``, ``moe_ft``, ...)
        for the jobs ``index`` (groups), the PFI replaced by ``pfi`` (per group) when given."""
        g = self.groups
        out = {
            c: g[c].to_numpy()[index] for c in ("pfi", "pfi_measured", "dram_copy_product", "gpus")
        }
        out["moe_ft"] = (g["cluster"] == "moe-ft").to_numpy()[index]
        if pfi is not None:
            out["pfi"] = np.asarray(pfi, float)[index]
        return out


def group_table(
    runs: pd.DataFrame, pfi: pd.DataFrame, predictions: pd.DataFrame, cfg: SimulationConfig
) -> GroupTable:
    """Join runs (curves), pfi (measured PFI) and predictions (predicted PFI, DRAM copy
    product) for the groups of ``cfg.groups_set``."""
    runs = cap_rows(
        runs[runs["set"] == cfg.groups_set]
    )  # cap curves only (a clock group: the knob menu)
    if runs.empty:
        raise ValueError(f"no runs with set == {cfg.groups_set!r} to build workloads from")
    names, curves = curves_from_runs(runs)
    meta = runs.groupby("group", sort=False)[["task", "cluster", "gpus"]].first()
    pred = predictions.set_index("group")
    if cfg.pfi_column not in pred.columns:
        raise ValueError(f"predictions lack column {cfg.pfi_column!r} (allocation.pfi_column)")
    missing = sorted(set(names) - set(pred.index))
    if missing:
        raise ValueError(f"no PFI prediction for group(s) {missing[:5]}")
    groups = pd.DataFrame({"group": names})
    groups = groups.join(meta, on="group")
    groups["pfi_measured"] = pfi.set_index("group")["pfi_ratio"].reindex(names).to_numpy(float)
    groups["pfi"] = pred[cfg.pfi_column].reindex(names).to_numpy(float)
    groups["dram_copy_product"] = pred["dram_copy_product"].reindex(names).to_numpy(float)
    backends = sorted(set(runs["backend"].astype(str)))
    return GroupTable(groups, curves, backends[0] if len(backends) == 1 else "+".join(backends))


def mix_unavailable(groups: pd.DataFrame, mix: str) -> str | None:
    """Why ``groups`` cannot form ``mix`` (None when they can)."""
    if mix not in ("random", "production"):
        raise ValueError(f"unknown mix {mix!r} (random | production)")
    if len(groups) == 0:
        return "no groups to draw jobs from"
    is_pt = (groups["task"] == "pt").to_numpy()
    if mix == "production" and (is_pt.all() or not is_pt.any()):
        kind = "pretraining (task pt)" if is_pt.all() else "fine-tuning"
        return (
            f"the production mix needs both pretraining and fine-tuning groups; "
            f"all {len(groups)} group(s) are {kind}"
        )
    return None


def sample_workloads(
    groups: pd.DataFrame,
    mix: str,
    n_workloads: int,
    n_jobs: int,
    rng: np.random.Generator,
    pretraining_fraction: float,
) -> np.ndarray:
    """Indices (n_workloads, n_jobs) into ``groups`` for one mix."""
    why_not = mix_unavailable(groups, mix)
    if why_not:
        raise ValueError(why_not)
    if mix == "random":
        return rng.integers(0, len(groups), size=(n_workloads, n_jobs))
    is_pt = (groups["task"] == "pt").to_numpy()
    pt, ft = np.flatnonzero(is_pt), np.flatnonzero(~is_pt)
    draw_pt = rng.random((n_workloads, n_jobs)) < pretraining_fraction
    return np.where(
        draw_pt,
        pt[rng.integers(0, len(pt), (n_workloads, n_jobs))],
        ft[rng.integers(0, len(ft), (n_workloads, n_jobs))],
    )


#: Where each per-job policy input comes from, for the reason a policy is left out.
FEATURE_SOURCES = {
    "pfi": "the predicted PFI (allocation.pfi_column {column!r}; predictor/model.json says why)",
    "pfi_measured": "the measured PFI (pfi.csv says why)",
    "dram_copy_product": "the DRAM copy product (predictor/predictions.parquet)",
}


def policy_unavailable(table: GroupTable, cfg: SimulationConfig, policy: str) -> str | None:
    """Why ``policy`` cannot run on the campaign's groups (None when it can): a per-job
    input it reads is missing for some group (e.g. no ``pfi_pred`` from an unfitted predictor),
    which would make every allocation of it NaN."""
    feature = get(policy).feature
    if feature not in FEATURE_SOURCES:
        return None
    values = table.groups[feature].to_numpy(float)
    bad = table.groups["group"][~np.isfinite(values)].tolist()
    if not bad:
        return None
    source = FEATURE_SOURCES[feature].format(column=cfg.pfi_column)
    return f"{policy} needs {source} for every group; {len(bad)} of {len(values)} have none ({', '.join(bad[:5])})"


@dataclass
class Skipped:
    """What the study left out and why: mixes the groups cannot form, policies whose input
    is missing, out-of-sample splits (or a mix in one) the halves cannot carry."""

    mixes: dict[str, str] = field(default_factory=dict)
    policies: dict[str, str] = field(default_factory=dict)
    splits: dict[str, str] = field(default_factory=dict)
    headline: str | None = None  # why the headline has no rows (its own sidecar's reason)

    def meta(self) -> dict[str, dict[str, str]]:
        """The sidecar entries of the allocation outputs (docs/outputs.md)."""
        return {
            "skipped_mixes": self.mixes,
            "skipped_policies": self.policies,
            "skipped_splits": self.splits,
        }


def runnable(table: GroupTable, cfg: SimulationConfig) -> tuple[SimulationConfig, Skipped]:
    """The study the campaign's groups can carry: ``cfg`` without the mixes they cannot form
    and the policies they lack an input for, and why each was left out. Deterministic, so
    every per-cut job and the merge leave out the same."""
    mixes = {mix: mix_unavailable(table.groups, mix) for mix in cfg.mixes}
    policies = {policy: policy_unavailable(table, cfg, policy) for policy in cfg.policies}
    kept = dataclasses.replace(
        cfg,
        mixes=[m for m, why in mixes.items() if why is None],
        policies=[p for p, why in policies.items() if why is None],
    )
    return kept, Skipped(
        {m: why for m, why in mixes.items() if why}, {p: why for p, why in policies.items() if why}
    )


def evaluate_policies(
    table: GroupTable,
    index: np.ndarray,
    cuts: Sequence[float],
    cfg: SimulationConfig,
    pfi: np.ndarray | None = None,
    policies: Sequence[str] | None = None,
    max_slowdown: np.ndarray | None = None,
    tiers: np.ndarray | None = None,
) -> pd.DataFrame:
    """Every policy on every workload (rows of ``index``) at every cut: one row per
    (cut, workload, policy) with total throughput and power. ``max_slowdown``: SLA tiers
    the policies must honour; ``tiers``: tiers to count violations against
    (``sla_violations``, jobs per workload), honoured or not."""
    curves = table.curves.take(index)
    feats = table.features(index, pfi)
    # a predicted curve depends only on its group: predict per group, then gather
    group_pfi = table.groups["pfi"].to_numpy(float) if pfi is None else np.asarray(pfi, float)
    # jobs of one group (and tier) share their curves: one hull each (allocate)
    curve_key = index
    if max_slowdown is not None:
        tier_values, tier_of_job = np.unique(max_slowdown, return_inverse=True)
        curve_key = index * len(tier_values) + tier_of_job.reshape(index.shape)
    cache = {
        "predicted": predicted_curves(table.curves, group_pfi, cfg.curve_nodes).take(index),
        "curve_key": curve_key,
    }
    uncapped_w = curves.ceiling_w.sum(-1)
    uncapped_t = curves.uncapped_throughput.sum(-1)
    target = None if tiers is None else (1.0 - tiers) * curves.uncapped_throughput
    frames = []
    for cut in cuts:
        budget = (1.0 - cut) * uncapped_w
        oracle_total = oracle_gap = None
        for policy in policies or cfg.policies:
            a = allocate(
                curves,
                budget,
                policy,
                feats,
                max_slowdown=max_slowdown,
                moe_ft_share=cfg.moe_ft_share,
                curve_nodes=cfg.curve_nodes,
                cache=cache,
            )
            row = {
                "cut": cut,
                "workload": np.arange(len(index)),
                "policy": policy,
                "total_tokens_per_s": a.total_throughput,
                "total_power_w": a.power_w.sum(-1),
                "budget_w": budget,
                "uncapped_tokens_per_s": uncapped_t,
                "n_jobs": index.shape[1],
                "feasible": a.feasible,
                "exact_fallback": False if a.exact_fallback is None else a.exact_fallback,
            }
            if target is not None:
                row["sla_violations"] = (a.throughput < target * (1 - 1e-9)).sum(-1)
            frames.append(pd.DataFrame(row))
            if policy == optimum():
                oracle_total, oracle_gap = a.total_throughput, a.oracle_gap
        # with SLA tiers a policy on predicted curves works on its own (predicted) floors and
        # may break a tier
        _check_oracle_dominates(
            frames,
            cut,
            oracle_total,
            oracle_gap,
            skip=(optimum(),) if max_slowdown is None else (optimum(), *names(curves="predicted")),
        )
    return pd.concat(frames, ignore_index=True)


def _check_oracle_dominates(
    frames: list[pd.DataFrame],
    cut: float,
    oracle_total: np.ndarray | None,
    oracle_gap: np.ndarray | None,
    skip: Sequence[str],
) -> None:
    """Guard: a policy beating the oracle on a feasible workload by more than the oracle's
    proven gap (it may stop that far below the optimum) means the oracle is wrong."""
    if oracle_total is None:
        return
    gap = np.zeros_like(oracle_total) if oracle_gap is None else np.asarray(oracle_gap, float)
    oracle_feasible = next(
        f for f in frames if f["cut"].iat[0] == cut and f["policy"].iat[0] == optimum()
    )["feasible"]
    for f in frames:
        if f["cut"].iat[0] != cut or f["policy"].iat[0] in skip:
            continue
        ok = f["feasible"].to_numpy() & oracle_feasible.to_numpy()
        excess = (f["total_tokens_per_s"].to_numpy() - oracle_total)[ok]
        # + rounding of the totals themselves (sums of 100 floats)
        if (excess > gap[ok] + 1e-9 * np.abs(oracle_total[ok])).any():
            raise AssertionError(
                f"policy {f['policy'].iat[0]} beat the oracle at cut {cut}: oracle is not exact"
            )


def _pct(x: pd.Series, q: float) -> float:
    return float(np.percentile(x, q)) if len(x) else np.nan


def summarize(results: pd.DataFrame, keys: Sequence[str] = ("mix", "cut")) -> pd.DataFrame:
    """Per (mix, cut, policy): mean/sd/p5/p95 of total and per-job tokens/s over feasible
    workloads, difference to the oracle, and the fraction of the equal-weight-to-oracle gap
    closed (ratio of means over workloads; NaN when there is no gap, e.g. at 0 % cut)."""
    keys = list(keys)
    df = results.copy()
    wide = df.pivot_table(index=keys + ["workload"], columns="policy", values="total_tokens_per_s")
    eq, best = baseline(), optimum()
    df = df.join(
        wide[[eq, best]].rename(columns={eq: "_eq", best: "_or"}),
        on=keys + ["workload"],
    )
    df["per_job"] = df["total_tokens_per_s"] / df["n_jobs"]
    rows = []
    for (*key, policy), part in df.groupby(keys + ["policy"], sort=False):
        feas = part[part["feasible"]]
        total, per_job = feas["total_tokens_per_s"], feas["per_job"]
        gap = (feas["_or"] - feas["_eq"]).mean()
        rows.append(
            {
                **dict(zip(keys, key)),
                "policy": policy,
                "n_workloads": len(part),
                "feasible_fraction": float(part["feasible"].mean()),
                "total_tokens_per_s_mean": total.mean(),
                "total_tokens_per_s_sd": total.std(),
                "total_tokens_per_s_p5": _pct(total, 5),
                "total_tokens_per_s_p95": _pct(total, 95),
                "per_job_tokens_per_s_mean": per_job.mean(),
                "per_job_tokens_per_s_sd": per_job.std(),
                "per_job_tokens_per_s_p5": _pct(per_job, 5),
                "per_job_tokens_per_s_p95": _pct(per_job, 95),
                "retained_fraction_mean": (total / feas["uncapped_tokens_per_s"]).mean(),
                "diff_to_oracle_total_mean": (total - feas["_or"]).mean(),
                "diff_to_oracle_per_job_mean": ((total - feas["_or"]) / feas["n_jobs"]).mean(),
                "gain_over_equal_per_job_mean": ((total - feas["_eq"]) / feas["n_jobs"]).mean(),
                "gap_closed": ((total - feas["_eq"]).mean() / gap)
                if gap > 1e-9 * max(total.mean(), 1.0)
                else np.nan,
                "frac_workloads_ge_equal": float(
                    (total >= feas["_eq"] - 1e-9 * feas["_eq"].abs()).mean()
                ),
            }
        )
    return pd.DataFrame(rows)


HEADLINE_COLUMNS = [
    "mix",
    "cut",
    "policy",
    "tokens_per_s_per_job_recovered",
    "recovered_p5",
    "recovered_p95",
    "gap_closed",
    "published_tokens_per_s_per_job_recovered",
    "published_gap_closed",
    "equal_weight_per_job_tokens_per_s",
    "oracle_per_job_tokens_per_s",
    "backend",
]


def headline(
    summary: pd.DataFrame, results: pd.DataFrame, cfg: SimulationConfig, backend: str
) -> pd.DataFrame:
    """The paper's headline: at ``headline_cut`` on ``headline_mix``, tokens/s per job each
    policy recovers over equal weight and its share of the equal-weight-to-oracle gap,
    beside the published 1.5k tokens/s and 63 % (for PFI-aware)."""
    at = summary[
        (summary["mix"] == cfg.headline_mix) & np.isclose(summary["cut"], cfg.headline_cut)
    ]
    if at.empty:
        raise ValueError(f"headline cut {cfg.headline_cut} / mix {cfg.headline_mix} not simulated")
    res = results[
        (results["mix"] == cfg.headline_mix) & np.isclose(results["cut"], cfg.headline_cut)
    ]
    wide = res.pivot_table(index="workload", columns="policy", values="total_tokens_per_s")
    n_jobs = res["n_jobs"].iat[0]
    eq, paper = baseline(), published()
    rows = []
    for _, r in at[~at["policy"].isin([eq])].iterrows():
        gain = (wide[r["policy"]] - wide[eq]) / n_jobs
        rows.append(
            {
                "mix": cfg.headline_mix,
                "cut": cfg.headline_cut,
                "policy": r["policy"],
                "tokens_per_s_per_job_recovered": r["gain_over_equal_per_job_mean"],
                "recovered_p5": _pct(gain, 5),
                "recovered_p95": _pct(gain, 95),
                "gap_closed": r["gap_closed"],
                "published_tokens_per_s_per_job_recovered": cfg.published_tokens_per_s_per_job
                if r["policy"] == paper
                else np.nan,
                "published_gap_closed": cfg.published_gap_closed
                if r["policy"] == paper
                else np.nan,
                "equal_weight_per_job_tokens_per_s": float(wide[eq].mean() / n_jobs),
                "oracle_per_job_tokens_per_s": float(wide[optimum()].mean() / n_jobs),
                "backend": backend,
            }
        )
    return pd.DataFrame(rows, columns=HEADLINE_COLUMNS)


def draw_tiers(
    shape: tuple[int, ...], cfg: SimulationConfig, rng: np.random.Generator
) -> np.ndarray:
    """Per-job maximum slowdown drawn from ``sla_tiers`` with ``sla_tier_weights``."""
    weights = np.asarray(cfg.sla_tier_weights, float)
    return rng.choice(np.asarray(cfg.sla_tiers, float), p=weights / weights.sum(), size=shape)


def sla_study(blind: pd.DataFrame, honoured: pd.DataFrame) -> pd.DataFrame:
    """Per (mix, cut, policy) with per-job SLA tiers: feasibility, tokens/s per job over
    feasible workloads, the gap to the SLA-constrained oracle, tier violations (0 for
    every policy that knows the curves), the share of jobs the same policy pushes past
    their tier when it ignores them (``blind``, the main run scored against the same
    tiers) and the oracle's throughput cost of the tiers."""
    keys = ["mix", "cut", "workload"]
    best = optimum()
    sla_oracle = honoured[honoured["policy"] == best].set_index(keys)["total_tokens_per_s"]
    free_oracle = blind[blind["policy"] == best].set_index(keys)["total_tokens_per_s"]
    blind_viol = blind.set_index(keys + ["policy"])["sla_violations"]
    rows = []
    for (mix, cut, policy), part in honoured.groupby(["mix", "cut", "policy"], sort=False):
        feas = part[part["feasible"]]
        at = pd.MultiIndex.from_frame(feas[keys])
        n = feas["n_jobs"].to_numpy()
        pb = part.set_index(keys + ["policy"]).index
        rows.append(
            {
                "mix": mix,
                "cut": cut,
                "policy": policy,
                "n_workloads": len(part),
                "feasible_fraction": float(part["feasible"].mean()),
                "per_job_tokens_per_s_mean": float(np.mean(feas["total_tokens_per_s"] / n))
                if len(feas)
                else np.nan,
                "diff_to_sla_oracle_per_job_mean": float(
                    np.mean(
                        (feas["total_tokens_per_s"].to_numpy() - sla_oracle.reindex(at).to_numpy())
                        / n
                    )
                )
                if len(feas)
                else np.nan,
                "sla_violating_job_fraction": float(np.mean(feas["sla_violations"] / n))
                if len(feas)
                else np.nan,
                "violations_if_sla_blind_job_fraction": float(
                    np.mean(blind_viol.reindex(pb).to_numpy() / part["n_jobs"].to_numpy())
                ),
                "oracle_cost_of_sla_per_job_mean": float(
                    np.mean(
                        (free_oracle.reindex(at).to_numpy() - feas["total_tokens_per_s"].to_numpy())
                        / n
                    )
                )
                if policy == best and len(feas)
                else np.nan,
            }
        )
    return pd.DataFrame(rows)


def stratified_halves(groups: pd.DataFrame, rng: np.random.Generator) -> np.ndarray:
    """Boolean training mask: half of each (cluster, task) stratum, odd remainders random."""
    train = np.zeros(len(groups), bool)
    for _, idx in groups.groupby(["cluster", "task"], sort=True).indices.items():
        idx = rng.permutation(idx)
        k = len(idx) // 2 + (rng.random() < 0.5 if len(idx) % 2 else 0)
        train[idx[:k]] = True
    return train


def fit_pfi_ols(x: np.ndarray, y: np.ndarray) -> tuple[float, float]:
    """One-feature OLS ``PFI = intercept + slope * dram_copy_product`` (the paper's best
    predictor, refitted here on a training half only). Returns (slope, intercept).

    Slope = cov(x, y) / var(x) from ``np.cov``, the very arithmetic of
    ``scipy.stats.linregress`` (so the same bits), without importing scipy.stats, which
    costs each per-cut job ~0.35 s of CPU."""
    ok = np.isfinite(x) & np.isfinite(y)
    x, y = np.asarray(x, float)[ok], np.asarray(y, float)[ok]
    ssxm, ssxym, _, _ = np.cov(x, y, bias=1).flat
    slope = ssxym / ssxm
    return float(slope), float(np.mean(y, None) - slope * np.mean(x, None))


@dataclass
class OosSplit:
    """One out-of-sample split: PFI predicted for every group by an OLS fitted on a
    training half, and workloads (per mix) drawn from the other half."""

    split: int
    pfi: np.ndarray  # (G,) predicted PFI per group
    test_r2: float  # the fit's R^2 on the held-out half
    workloads: dict[str, np.ndarray]


@dataclass
class Draws:
    """Every random draw of the study. Drawn up front, in one fixed order, and independent
    of the cuts: a job simulating any subset of cuts sees the same workloads, tiers and
    splits as one simulating all of them (so per-cut jobs merge to the same numbers)."""

    workloads: dict[str, np.ndarray]  # mix -> (n_workloads, n_jobs) group indices
    tiers: dict[str, np.ndarray]  # mix -> (n_workloads, n_jobs) per-job SLA tier
    splits: list[OosSplit]
    skipped_splits: dict[str, str] = field(
        default_factory=dict
    )  # "<split>" or "<split>/<mix>" -> why


def draw(table: GroupTable, cfg: SimulationConfig) -> Draws:
    """Workloads (seed ``cfg.seed``), SLA tiers (``[seed, 1]``) and out-of-sample splits
    (``[seed, 2]``), each stream consumed mix by mix (split by split) in config order."""
    rng = np.random.default_rng(cfg.seed)
    workloads = {
        mix: sample_workloads(
            table.groups, mix, cfg.n_workloads, cfg.jobs_per_workload, rng, cfg.pretraining_fraction
        )
        for mix in cfg.mixes
    }
    tier_rng = np.random.default_rng([cfg.seed, 1])
    tiers = {mix: draw_tiers(index.shape, cfg, tier_rng) for mix, index in workloads.items()}
    skipped: dict[str, str] = {}
    splits = draw_splits(table, cfg, np.random.default_rng([cfg.seed, 2]), skipped)
    return Draws(workloads, tiers, splits, skipped)


#: Groups a training half needs for the one-feature OLS (a slope needs two points).
MIN_OOS_TRAIN_GROUPS = 2


def draw_splits(
    table: GroupTable,
    cfg: SimulationConfig,
    rng: np.random.Generator,
    skipped: dict[str, str] | None = None,
) -> list[OosSplit]:
    """``oos_splits`` stratified halves: the OLS PFI predictor refitted on the training half
    and ``oos_workloads`` workloads per mix from the test half. A split whose halves cannot
    carry the fit (or a mix its test half cannot form) is left out, why in ``skipped``."""
    skipped = {} if skipped is None else skipped
    g = table.groups
    x, y = g["dram_copy_product"].to_numpy(float), g["pfi_measured"].to_numpy(float)
    splits = []
    for split in range(cfg.oos_splits):
        train = stratified_halves(g, rng)
        n_fit = int((train & np.isfinite(x) & np.isfinite(y)).sum())
        if n_fit < MIN_OOS_TRAIN_GROUPS or train.all():
            skipped[str(split)] = (
                f"{n_fit} training group(s) with a PFI and a DRAM copy product (the refit needs "
                f"{MIN_OOS_TRAIN_GROUPS}) and {int((~train).sum())} test group(s) (needs 1), "
                f"of {len(g)} groups"
            )
            continue
        slope, intercept = fit_pfi_ols(x[train], y[train])
        pfi_oos = intercept + slope * x
        resid = y[~train] - pfi_oos[~train]
        spread = ((y[~train] - y[~train].mean()) ** 2).sum()
        r2 = 1.0 - (resid**2).sum() / spread if spread > 0 else np.nan  # no R^2 on one test group
        test = np.flatnonzero(~train)
        test_groups = g.iloc[test].reset_index(drop=True)
        workloads = {}
        for mix in cfg.mixes:
            why_not = mix_unavailable(test_groups, mix)
            if why_not:
                skipped[f"{split}/{mix}"] = f"its test half: {why_not}"
                continue
            workloads[mix] = test[
                sample_workloads(
                    test_groups,
                    mix,
                    cfg.oos_workloads,
                    cfg.jobs_per_workload,
                    rng,
                    cfg.pretraining_fraction,
                )
            ]
        splits.append(OosSplit(split, pfi_oos, float(r2), workloads))
    return splits


OOS_COLUMNS = ["mix", "cut", "policy", "variant", "n_splits", "gap_closed_mean"]


def out_of_sample(
    table: GroupTable, cfg: SimulationConfig, splits: Sequence[OosSplit], cuts: Sequence[float]
) -> pd.DataFrame:
    """Policies whose PFI comes from a predictor fitted on one half of the groups, evaluated
    on workloads drawn from the other half, beside the same policies fed the in-sample
    prediction (``pfi_column``, fitted on all groups) and the oracle; repeated over the
    stratified random halves ``splits`` (:func:`draw_splits`). Per (mix, cut, policy,
    variant): mean and spread over splits."""
    # the policies that read the PFI, refitted per split, after the baseline; the others of
    # the study (read nothing the split changes) after them, the optimum last
    studied = names(out_of_sample=True)
    uses_pfi = [p for p in studied if get(p).feature == "pfi"]
    ends = (baseline(), optimum())
    order = [ends[0], *uses_pfi, *(p for p in studied if p not in (*ends, *uses_pfi)), ends[1]]
    # a policy whose in-sample input is missing (e.g. no pfi_pred) is left out of the in-sample variant
    in_sample = [p for p in order if policy_unavailable(table, cfg, p) is None]
    blocks = [(sp, mix, index) for sp in splits for mix, index in sp.workloads.items()]
    if not blocks:
        return pd.DataFrame(columns=OOS_COLUMNS)
    # the in-sample policies read nothing split-specific: one call over every split's
    # workloads (each workload's result is its own), then cut back into blocks
    start = np.cumsum([0] + [len(index) for _, _, index in blocks])
    ins_all = evaluate_policies(
        table, np.concatenate([index for _, _, index in blocks]), cuts, cfg, policies=in_sample
    )
    block_of = np.searchsorted(start, ins_all["workload"].to_numpy(), side="right") - 1
    frames = []
    for b, (sp, mix, index) in enumerate(blocks):
        ins = ins_all[block_of == b].reset_index(drop=True)
        ins["workload"] -= start[b]
        oos = evaluate_policies(table, index, cuts, cfg, pfi=sp.pfi, policies=uses_pfi)
        ins["variant"] = np.where(ins["policy"].isin(uses_pfi), "in-sample", "no PFI")
        oos["variant"] = "out-of-sample"
        both = pd.concat([ins, oos], ignore_index=True)
        both["mix"], both["split"] = mix, sp.split
        both["policy"] = both["policy"] + "|" + both["variant"]
        both.loc[both["variant"] == "no PFI", "policy"] = both["policy"].str.split("|").str[0]
        frames.append(both)
    # one summary over all splits: its groups are the per-split summaries', in the same order
    per_split = summarize(pd.concat(frames, ignore_index=True), keys=("split", "mix", "cut"))
    per_split["test_r2"] = per_split["split"].map({sp.split: sp.test_r2 for sp in splits})
    parts = per_split["policy"].str.split("|", expand=True)
    per_split["policy"], per_split["variant"] = parts[0], parts[1].fillna("no PFI")
    agg = (
        per_split.groupby(["mix", "cut", "policy", "variant"], sort=False)
        .agg(
            n_splits=("split", "nunique"),
            per_job_tokens_per_s_mean=("per_job_tokens_per_s_mean", "mean"),
            per_job_tokens_per_s_sd_over_splits=("per_job_tokens_per_s_mean", "std"),
            gain_over_equal_per_job_mean=("gain_over_equal_per_job_mean", "mean"),
            gap_closed_mean=("gap_closed", "mean"),
            gap_closed_sd_over_splits=("gap_closed", "std"),
            gap_closed_p5=("gap_closed", lambda v: _pct(v.dropna(), 5)),
            gap_closed_p95=("gap_closed", lambda v: _pct(v.dropna(), 95)),
            frac_workloads_ge_equal=("frac_workloads_ge_equal", "mean"),
            pfi_test_r2_mean=("test_r2", "mean"),
        )
        .reset_index()
    )
    agg.loc[agg["variant"] != "out-of-sample", "pfi_test_r2_mean"] = np.nan
    return agg


def simulate_cuts(
    table: GroupTable, cfg: SimulationConfig, cuts: Sequence[float], draws: Draws | None = None
) -> dict[str, pd.DataFrame]:
    """The study at ``cuts`` only (one Snakemake job per cut): ``results`` (per workload),
    ``summary``, ``sla`` and ``out_of_sample``. Every row of these belongs to one cut, so
    :func:`combine` of the parts of any partition of ``cfg.cuts`` gives :func:`simulate`'s
    tables exactly. Mixes and policies the groups cannot carry are left out (:func:`runnable`);
    with no mix left the tables have no rows."""
    cfg, _ = runnable(table, cfg)
    draws = draws or draw(table, cfg)
    if not draws.workloads:
        return {name: pd.DataFrame(columns=EMPTY_PART_COLUMNS[name]) for name in PART_TABLES}
    frames, sla_frames = [], []
    for mix, index in draws.workloads.items():
        tiers = draws.tiers[mix]
        res = evaluate_policies(table, index, cuts, cfg, tiers=tiers)
        res["mix"] = mix
        frames.append(res)
        log.info(
            "mix %s: %d workloads x %d cuts x %d policies",
            mix,
            len(index),
            len(cuts),
            len(cfg.policies),
        )
        sla = evaluate_policies(table, index, cuts, cfg, max_slowdown=tiers, tiers=tiers)
        sla["mix"] = mix
        sla_frames.append(sla)
    results = pd.concat(frames, ignore_index=True)
    return {
        "results": results,
        "summary": summarize(results),
        "sla": sla_study(results, pd.concat(sla_frames, ignore_index=True)),
        "out_of_sample": out_of_sample(table, cfg, draws.splits, cuts),
    }


#: The key columns of each part table when no mix could be simulated (no rows to fill the rest).
EMPTY_PART_COLUMNS = {
    "results": [
        "mix",
        "cut",
        "workload",
        "policy",
        "total_tokens_per_s",
        "feasible",
        "exact_fallback",
    ],
    "summary": ["mix", "cut", "policy", "n_workloads"],
    "sla": ["mix", "cut", "policy", "n_workloads"],
    "out_of_sample": OOS_COLUMNS,
}


def _in_study_order(
    df: pd.DataFrame, cfg: SimulationConfig, variant_first: bool = False
) -> pd.DataFrame:
    """Rows of per-cut parts back in the single-run order: by mix, (out-of-sample variant
    after the others,) cut, then as they were."""
    if df.empty:
        return df.reset_index(drop=True)
    keys = [df["mix"].map({m: i for i, m in enumerate(cfg.mixes)}).to_numpy()]
    if variant_first:
        keys.append((df["variant"] == "out-of-sample").to_numpy())
    keys.append(df["cut"].map({c: i for i, c in enumerate(dict.fromkeys(cfg.cuts))}).to_numpy())
    order = np.lexsort([np.arange(len(df)), *keys[::-1]])
    return df.iloc[order].reset_index(drop=True)


def combine(
    parts: Sequence[Mapping[str, pd.DataFrame]], table: GroupTable, cfg: SimulationConfig
) -> dict[str, Any]:
    """Merge :func:`simulate_cuts` parts covering ``cfg.cuts`` into the full study's tables:
    ``results``, ``summary``, ``headline``, ``sla``, ``out_of_sample`` and ``diagnostics``, and
    ``skipped`` (:class:`Skipped`: what the study left out and why)."""
    cfg, skipped = runnable(table, cfg)
    skipped.splits = draw(table, cfg).skipped_splits
    cat = {name: pd.concat([p[name] for p in parts], ignore_index=True) for name in PART_TABLES}
    missing = set(cfg.cuts) - set(cat["results"]["cut"]) if cfg.mixes else set()
    if missing:
        raise ValueError(f"no simulated part for cut(s) {sorted(missing)}")
    out = {
        name: _in_study_order(cat[name], cfg, variant_first=name == "out_of_sample")
        for name in PART_TABLES
    }
    if out["out_of_sample"].empty:
        out["out_of_sample"] = pd.DataFrame(columns=OOS_COLUMNS)
    results = out["results"]
    skipped.headline = headline_unavailable(cfg, skipped)
    out["headline"] = (
        pd.DataFrame(columns=HEADLINE_COLUMNS)
        if skipped.headline
        else headline(out["summary"], results, cfg, table.backend)
    )
    oracle_rows = results[results["policy"] == optimum()]
    concave = is_concave(table.curves)
    out["diagnostics"] = pd.DataFrame(
        [
            {
                "groups": len(table.groups),
                "concave_groups": int(concave.sum()),
                "non_concave_groups": ",".join(table.groups["group"][~concave]),
                "oracle_workload_cuts": len(oracle_rows),
                "oracle_milp_fraction": float(oracle_rows["exact_fallback"].mean())
                if len(oracle_rows)
                else None,
            }
        ]
    )
    out["skipped"] = skipped
    return out


def headline_unavailable(cfg: SimulationConfig, skipped: Skipped) -> str | None:
    """Why the headline has no rows (None when it has): its mix is not simulated."""
    if cfg.headline_mix in skipped.mixes:
        return (
            f"the headline's {cfg.headline_mix} mix (allocation.headline.mix) was not simulated: "
            f"{skipped.mixes[cfg.headline_mix]}"
        )
    if cfg.headline_mix not in cfg.mixes:
        return (
            f"the headline's mix {cfg.headline_mix!r} (allocation.headline.mix) is not among "
            f"allocation.mixes {cfg.mixes}"
        )
    return None


def simulate(table: GroupTable, cfg: SimulationConfig) -> dict[str, Any]:
    """The full study in one process: :func:`combine` of :func:`simulate_cuts` at every cut."""
    return combine([simulate_cuts(table, cfg, cfg.cuts)], table, cfg)
