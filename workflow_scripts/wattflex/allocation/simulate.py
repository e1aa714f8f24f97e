"""The allocation study (paper §6, and beyond): every policy on simulated workloads.

Workloads of jobs are drawn from the campaign's groups ("random": uniform with replacement;
"production": a job is pretraining with probability ``pretraining_fraction``, else
fine-tuning, then uniform within its kind); every policy
(:func:`wattflex.allocation.allocator.allocate`) runs at every cut. :func:`simulate`
returns per-workload results, summaries, the paper's headline, SLA tiers (each job draws a
maximum slowdown) and an out-of-sample check (policies fitted on one half of the groups,
evaluated on workloads of the other half).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field, fields
from typing import Any, Mapping, Sequence

import numpy as np
import pandas as pd
from scipy.stats import linregress

from wattflex.allocation.allocator import allocate, predicted_curves
from wattflex.allocation.curves import Curves, curves_from_runs, is_concave
from wattflex.allocation.policies import POLICIES

log = logging.getLogger("wattflex.allocation.simulate")


@dataclass
class SimulationConfig:
    """The ``allocation:`` config slice (defaults = the paper's setup, see config.yaml)."""
    groups_set: str = "headline"
    n_workloads: int = 500
    jobs_per_workload: int = 100
    cuts: list[float] = field(default_factory=lambda: [round(0.05 * i, 2) for i in range(9)])
    mixes: list[str] = field(default_factory=lambda: ["random", "production"])
    # Share of pretraining jobs in the "production" mix (count share among training jobs);
    # see config.yaml for the source and caveat.
    pretraining_fraction: float = 0.2
    policies: list[str] = field(default_factory=lambda: list(POLICIES))
    pfi_column: str = "pfi_pred"
    moe_ft_share: float = 2.0
    curve_nodes: int = 6
    seed: int = 20260911
    sla_tiers: list[float] = field(default_factory=lambda: [0.0, 0.10, 0.25, 0.50])
    sla_tier_weights: list[float] = field(default_factory=lambda: [0.25, 0.25, 0.25, 0.25])
    oos_splits: int = 10
    oos_workloads: int = 100
    headline_mix: str = "production"
    headline_cut: float = 0.30
    published_tokens_per_s_per_job: float = 1500.0
    published_gap_closed: float = 0.63

    @classmethod
    def from_dict(cls, cfg: Mapping[str, Any] | None) -> "SimulationConfig":
        """Accept the nested config layout (see config.yaml) or flat keys."""
        cfg = dict(cfg or {})
        flat: dict[str, Any] = {}
        for key, val in cfg.items():
            if key == "production":
                flat["pretraining_fraction"] = val.get("pretraining_fraction", cls.pretraining_fraction)
            elif key == "sla":
                flat.update({"sla_tiers": val.get("tiers"), "sla_tier_weights": val.get("tier_weights")})
            elif key == "out_of_sample":
                flat.update({"oos_splits": val.get("splits"), "oos_workloads": val.get("workloads")})
            elif key == "headline":
                flat.update({"headline_mix": val.get("mix"), "headline_cut": val.get("cut")})
            elif key == "published":
                flat.update({"published_tokens_per_s_per_job": val.get("tokens_per_s_per_job"),
                             "published_gap_closed": val.get("gap_closed")})
            else:
                flat[key] = val
        known = {f.name for f in fields(cls)}
        unknown = set(flat) - known
        if unknown:
            raise ValueError(f"unknown allocation config key(s): {', '.join(sorted(unknown))}")
        out = cls(**{k: v for k, v in flat.items() if v is not None})
        bad = set(out.policies) - set(POLICIES)
        if bad:
            raise ValueError(f"unknown allocation policies {sorted(bad)}; choose from {', '.join(POLICIES)}")
        out.policies = list(dict.fromkeys(["equal-weight", *out.policies, "oracle"]))
        if not 0.0 <= out.pretraining_fraction <= 1.0:
            raise ValueError("allocation.production.pretraining_fraction must be in [0, 1]")
        if any(not 0.0 <= c < 1.0 for c in out.cuts):
            raise ValueError("allocation.cuts must be fractions in [0, 1)")
        return out


@dataclass
class GroupTable:
    """The campaign's groups as allocation sees them: curves (G, K) + per-group features."""
    groups: pd.DataFrame          # group, task, cluster, gpus, pfi_measured, pfi, dram_copy_product
    curves: Curves
    backend: str

    def features(self, index: np.ndarray, pfi: np.ndarray | None = None) -> dict[str, np.ndarray]:
        g = self.groups
        out = {c: g[c].to_numpy()[index] for c in ("pfi", "pfi_measured", "dram_copy_product", "gpus")}
        out["moe_ft"] = (g["cluster"] == "moe-ft").to_numpy()[index]
        if pfi is not None:
            out["pfi"] = np.asarray(pfi, float)[index]
        return out


def group_table(runs: pd.DataFrame, pfi: pd.DataFrame, predictions: pd.DataFrame,
                cfg: SimulationConfig) -> GroupTable:
    """Join runs (curves), pfi (measured PFI) and predictions (predicted PFI, DRAM copy
    product) for the groups of ``cfg.groups_set``."""
    runs = runs[runs["set"] == cfg.groups_set]
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


def sample_workloads(groups: pd.DataFrame, mix: str, n_workloads: int, n_jobs: int,
                     rng: np.random.Generator, pretraining_fraction: float) -> np.ndarray:
    """Indices (n_workloads, n_jobs) into ``groups`` for one mix."""
    G = len(groups)
    if mix == "random":
        return rng.integers(0, G, size=(n_workloads, n_jobs))
    if mix != "production":
        raise ValueError(f"unknown mix {mix!r} (random | production)")
    is_pt = (groups["task"] == "pt").to_numpy()
    pt, ft = np.flatnonzero(is_pt), np.flatnonzero(~is_pt)
    if len(pt) == 0 or len(ft) == 0:
        raise ValueError("the production mix needs both pretraining and fine-tuning groups")
    draw_pt = rng.random((n_workloads, n_jobs)) < pretraining_fraction
    return np.where(draw_pt, pt[rng.integers(0, len(pt), (n_workloads, n_jobs))],
                    ft[rng.integers(0, len(ft), (n_workloads, n_jobs))])


def evaluate_policies(table: GroupTable, index: np.ndarray, cuts: Sequence[float],
                      cfg: SimulationConfig, pfi: np.ndarray | None = None,
                      policies: Sequence[str] | None = None, max_slowdown: np.ndarray | None = None,
                      tiers: np.ndarray | None = None) -> pd.DataFrame:
    """Every policy on every workload (rows of ``index``) at every cut: one row per
    (cut, workload, policy) with total throughput and power. ``max_slowdown``: SLA tiers
    the policies must honour; ``tiers``: tiers to count violations against
    (``sla_violations``, jobs per workload), honoured or not."""
    curves = table.curves.take(index)
    feats = table.features(index, pfi)
    # a predicted curve depends only on its group: predict per group, then gather
    group_pfi = table.groups["pfi"].to_numpy(float) if pfi is None else np.asarray(pfi, float)
    cache = {"predicted": predicted_curves(table.curves, group_pfi, cfg.curve_nodes).take(index)}
    uncapped_w = curves.ceiling_w.sum(-1)
    uncapped_t = curves.uncapped_throughput.sum(-1)
    target = None if tiers is None else (1.0 - tiers) * curves.uncapped_throughput
    frames = []
    for cut in cuts:
        budget = (1.0 - cut) * uncapped_w
        oracle_total = None
        for policy in policies or cfg.policies:
            a = allocate(curves, budget, policy, feats, max_slowdown=max_slowdown,
                         moe_ft_share=cfg.moe_ft_share, curve_nodes=cfg.curve_nodes, cache=cache)
            row = {"cut": cut, "workload": np.arange(len(index)), "policy": policy,
                   "total_tokens_per_s": a.total_throughput, "total_power_w": a.power_w.sum(-1),
                   "budget_w": budget, "uncapped_tokens_per_s": uncapped_t, "n_jobs": index.shape[1],
                   "feasible": a.feasible,
                   "exact_fallback": False if a.exact_fallback is None else a.exact_fallback}
            if target is not None:
                row["sla_violations"] = (a.throughput < target * (1 - 1e-9)).sum(-1)
            frames.append(pd.DataFrame(row))
            if policy == "oracle":
                oracle_total = a.total_throughput
        # with SLA tiers curve-aware works on its own (predicted) floors and may break a tier
        _check_oracle_dominates(frames, cut, oracle_total,
                                skip=("oracle",) if max_slowdown is None else ("oracle", "curve-aware"))
    return pd.concat(frames, ignore_index=True)


def _check_oracle_dominates(frames: list[pd.DataFrame], cut: float, oracle_total: np.ndarray | None,
                            skip: Sequence[str]) -> None:
    """Guard: a policy beating the oracle on a feasible workload means the oracle is wrong."""
    if oracle_total is None:
        return
    oracle_feasible = next(f for f in frames if f["cut"].iat[0] == cut and f["policy"].iat[0] == "oracle")["feasible"]
    for f in frames:
        if f["cut"].iat[0] != cut or f["policy"].iat[0] in skip:
            continue
        ok = f["feasible"].to_numpy() & oracle_feasible.to_numpy()
        excess = (f["total_tokens_per_s"].to_numpy() - oracle_total)[ok]
        if (excess > 1e-6 * np.abs(oracle_total[ok]).max(initial=1.0)).any():
            raise AssertionError(f"policy {f['policy'].iat[0]} beat the oracle at cut {cut}: oracle is not exact")


def _pct(x: pd.Series, q: float) -> float:
    return float(np.percentile(x, q)) if len(x) else np.nan


def summarize(results: pd.DataFrame, keys: Sequence[str] = ("mix", "cut")) -> pd.DataFrame:
    """Per (mix, cut, policy): mean/sd/p5/p95 of total and per-job tokens/s over feasible
    workloads, difference to the oracle, and the fraction of the equal-weight-to-oracle gap
    closed (ratio of means over workloads; NaN when there is no gap, e.g. at 0 % cut)."""
    keys = list(keys)
    df = results.copy()
    wide = df.pivot_table(index=keys + ["workload"], columns="policy", values="total_tokens_per_s")
    df = df.join(wide[["equal-weight", "oracle"]].rename(columns={"equal-weight": "_eq", "oracle": "_or"}),
                 on=keys + ["workload"])
    df["per_job"] = df["total_tokens_per_s"] / df["n_jobs"]
    rows = []
    for (*key, policy), part in df.groupby(keys + ["policy"], sort=False):
        feas = part[part["feasible"]]
        total, per_job = feas["total_tokens_per_s"], feas["per_job"]
        gap = (feas["_or"] - feas["_eq"]).mean()
        rows.append({
            **dict(zip(keys, key)), "policy": policy, "n_workloads": len(part),
            "feasible_fraction": float(part["feasible"].mean()),
            "total_tokens_per_s_mean": total.mean(), "total_tokens_per_s_sd": total.std(),
            "total_tokens_per_s_p5": _pct(total, 5), "total_tokens_per_s_p95": _pct(total, 95),
            "per_job_tokens_per_s_mean": per_job.mean(), "per_job_tokens_per_s_sd": per_job.std(),
            "per_job_tokens_per_s_p5": _pct(per_job, 5), "per_job_tokens_per_s_p95": _pct(per_job, 95),
            "retained_fraction_mean": (total / feas["uncapped_tokens_per_s"]).mean(),
            "diff_to_oracle_total_mean": (total - feas["_or"]).mean(),
            "diff_to_oracle_per_job_mean": ((total - feas["_or"]) / feas["n_jobs"]).mean(),
            "gain_over_equal_per_job_mean": ((total - feas["_eq"]) / feas["n_jobs"]).mean(),
            "gap_closed": ((total - feas["_eq"]).mean() / gap) if gap > 1e-9 * max(total.mean(), 1.0) else np.nan,
            "frac_workloads_ge_equal": float((total >= feas["_eq"] - 1e-9 * feas["_eq"].abs()).mean()),
        })
    return pd.DataFrame(rows)


def headline(summary: pd.DataFrame, results: pd.DataFrame, cfg: SimulationConfig, backend: str) -> pd.DataFrame:
    """The paper's headline: at ``headline_cut`` on ``headline_mix``, tokens/s per job each
    policy recovers over equal weight and its share of the equal-weight-to-oracle gap,
    beside the published 1.5k tokens/s and 63 % (for PFI-aware)."""
    at = summary[(summary["mix"] == cfg.headline_mix) & np.isclose(summary["cut"], cfg.headline_cut)]
    if at.empty:
        raise ValueError(f"headline cut {cfg.headline_cut} / mix {cfg.headline_mix} not simulated")
    res = results[(results["mix"] == cfg.headline_mix) & np.isclose(results["cut"], cfg.headline_cut)]
    wide = res.pivot_table(index="workload", columns="policy", values="total_tokens_per_s")
    n_jobs = res["n_jobs"].iat[0]
    rows = []
    for _, r in at[~at["policy"].isin(["equal-weight"])].iterrows():
        gain = (wide[r["policy"]] - wide["equal-weight"]) / n_jobs
        rows.append({
            "mix": cfg.headline_mix, "cut": cfg.headline_cut, "policy": r["policy"],
            "tokens_per_s_per_job_recovered": r["gain_over_equal_per_job_mean"],
            "recovered_p5": _pct(gain, 5), "recovered_p95": _pct(gain, 95),
            "gap_closed": r["gap_closed"],
            "published_tokens_per_s_per_job_recovered": cfg.published_tokens_per_s_per_job if r["policy"] == "pfi-aware" else np.nan,
            "published_gap_closed": cfg.published_gap_closed if r["policy"] == "pfi-aware" else np.nan,
            "equal_weight_per_job_tokens_per_s": float(wide["equal-weight"].mean() / n_jobs),
            "oracle_per_job_tokens_per_s": float(wide["oracle"].mean() / n_jobs),
            "backend": backend,
        })
    return pd.DataFrame(rows)


def draw_tiers(shape: tuple[int, ...], cfg: SimulationConfig, rng: np.random.Generator) -> np.ndarray:
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
    sla_oracle = honoured[honoured["policy"] == "oracle"].set_index(keys)["total_tokens_per_s"]
    free_oracle = blind[blind["policy"] == "oracle"].set_index(keys)["total_tokens_per_s"]
    blind_viol = blind.set_index(keys + ["policy"])["sla_violations"]
    rows = []
    for (mix, cut, policy), part in honoured.groupby(["mix", "cut", "policy"], sort=False):
        feas = part[part["feasible"]]
        at = pd.MultiIndex.from_frame(feas[keys])
        n = feas["n_jobs"].to_numpy()
        pb = part.set_index(keys + ["policy"]).index
        rows.append({
            "mix": mix, "cut": cut, "policy": policy, "n_workloads": len(part),
            "feasible_fraction": float(part["feasible"].mean()),
            "per_job_tokens_per_s_mean": float(np.mean(feas["total_tokens_per_s"] / n)) if len(feas) else np.nan,
            "diff_to_sla_oracle_per_job_mean": float(np.mean((feas["total_tokens_per_s"].to_numpy()
                                                               - sla_oracle.reindex(at).to_numpy()) / n)) if len(feas) else np.nan,
            "sla_violating_job_fraction": float(np.mean(feas["sla_violations"] / n)) if len(feas) else np.nan,
            "violations_if_sla_blind_job_fraction": float(np.mean(blind_viol.reindex(pb).to_numpy() / part["n_jobs"].to_numpy())),
            "oracle_cost_of_sla_per_job_mean": float(np.mean((free_oracle.reindex(at).to_numpy()
                                                              - feas["total_tokens_per_s"].to_numpy()) / n))
            if policy == "oracle" and len(feas) else np.nan,
        })
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
    predictor, refitted here on a training half only). Returns (slope, intercept)."""
    ok = np.isfinite(x) & np.isfinite(y)
    fit = linregress(np.asarray(x, float)[ok], np.asarray(y, float)[ok])
    return float(fit.slope), float(fit.intercept)


def out_of_sample(table: GroupTable, cfg: SimulationConfig, rng: np.random.Generator) -> pd.DataFrame:
    """Policies whose PFI comes from a predictor fitted on one half of the groups, evaluated
    on workloads drawn from the other half, beside the same policies fed the in-sample
    prediction (``pfi_column``, fitted on all groups) and the oracle; repeated over
    ``oos_splits`` stratified random halves. Per (mix, cut, policy, variant): mean and
    spread over splits."""
    g = table.groups
    x, y = g["dram_copy_product"].to_numpy(float), g["pfi_measured"].to_numpy(float)
    uses_pfi = ["pfi-aware", "curve-aware"]
    per_split = []
    for split in range(cfg.oos_splits):
        train = stratified_halves(g, rng)
        slope, intercept = fit_pfi_ols(x[train], y[train])
        pfi_oos = intercept + slope * x
        resid = y[~train] - pfi_oos[~train]
        r2 = 1.0 - (resid ** 2).sum() / ((y[~train] - y[~train].mean()) ** 2).sum()
        test = np.flatnonzero(~train)
        for mix in cfg.mixes:
            index = test[sample_workloads(g.iloc[test].reset_index(drop=True), mix, cfg.oos_workloads,
                                          cfg.jobs_per_workload, rng, cfg.pretraining_fraction)]
            ins = evaluate_policies(table, index, cfg.cuts, cfg, policies=["equal-weight", *uses_pfi, "raw-dcgm", "oracle"])
            oos = evaluate_policies(table, index, cfg.cuts, cfg, pfi=pfi_oos, policies=uses_pfi)
            ins["variant"] = np.where(ins["policy"].isin(uses_pfi), "in-sample", "no PFI")
            oos["variant"] = "out-of-sample"
            both = pd.concat([ins, oos], ignore_index=True)
            both["mix"] = mix
            both["policy"] = both["policy"] + "|" + both["variant"]
            both.loc[both["variant"] == "no PFI", "policy"] = both["policy"].str.split("|").str[0]
            s = summarize(both)
            s["split"], s["test_r2"] = split, r2
            per_split.append(s)
    if not per_split:
        return pd.DataFrame(columns=["mix", "cut", "policy", "variant", "n_splits", "gap_closed_mean"])
    per_split = pd.concat(per_split, ignore_index=True)
    parts = per_split["policy"].str.split("|", expand=True)
    per_split["policy"], per_split["variant"] = parts[0], parts[1].fillna("no PFI")
    agg = per_split.groupby(["mix", "cut", "policy", "variant"], sort=False).agg(
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
    ).reset_index()
    agg.loc[agg["variant"] != "out-of-sample", "pfi_test_r2_mean"] = np.nan
    return agg


def simulate(table: GroupTable, cfg: SimulationConfig) -> dict[str, pd.DataFrame]:
    """The full study: ``results`` (per workload), ``summary``, ``headline``, ``sla``,
    ``out_of_sample``, plus ``diagnostics`` (curve concavity, oracle fallbacks)."""
    rng = np.random.default_rng(cfg.seed)
    indices = {mix: sample_workloads(table.groups, mix, cfg.n_workloads, cfg.jobs_per_workload,
                                     rng, cfg.pretraining_fraction) for mix in cfg.mixes}
    tier_rng = np.random.default_rng([cfg.seed, 1])
    frames, sla_frames = [], []
    for mix, index in indices.items():
        tiers = draw_tiers(index.shape, cfg, tier_rng)
        res = evaluate_policies(table, index, cfg.cuts, cfg, tiers=tiers)
        res["mix"] = mix
        frames.append(res)
        log.info("mix %s: %d workloads x %d cuts x %d policies", mix, len(index), len(cfg.cuts), len(cfg.policies))
        sla = evaluate_policies(table, index, cfg.cuts, cfg, max_slowdown=tiers, tiers=tiers)
        sla["mix"] = mix
        sla_frames.append(sla)
    results = pd.concat(frames, ignore_index=True)
    summary = summarize(results)
    out = {"results": results, "summary": summary,
           "headline": headline(summary, results, cfg, table.backend) if cfg.headline_mix in indices else pd.DataFrame()}
    out["sla"] = sla_study(results, pd.concat(sla_frames, ignore_index=True))
    out["out_of_sample"] = out_of_sample(table, cfg, np.random.default_rng([cfg.seed, 2]))
    oracle_rows = results[results["policy"] == "oracle"]
    out["diagnostics"] = pd.DataFrame([{
        "groups": len(table.groups), "concave_groups": int(is_concave(table.curves).sum()),
        "non_concave_groups": ",".join(table.groups["group"][~is_concave(table.curves)]),
        "oracle_workload_cuts": len(oracle_rows),
        "oracle_milp_fraction": float(oracle_rows["exact_fallback"].mean()),
    }])
    return out
