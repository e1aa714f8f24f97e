"""The allocation study's settings (the ``allocation:`` config slice), apart from the study
itself so that the workflow can read them (e.g. the cuts, one job each) without importing
numpy, pandas or scipy at parse time."""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any, Mapping

from wattflex.allocation.policies import POLICIES

# Settings the per-cut simulation does not read: changing them reruns only the merge.
MERGE_ONLY_KEYS = ("cuts", "headline", "published")
# The tables each per-cut job writes and the merge reads (one parquet file each).
PART_TABLES = ("results", "summary", "sla", "out_of_sample")


def cut_label(cut: float) -> str:
    """A cut as a file-name part that reads back as the same float (``repr``)."""
    return repr(float(cut))


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
