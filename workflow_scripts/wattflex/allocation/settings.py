"""The allocation study's settings (the ``allocation:`` config slice), apart from the study
itself so that the workflow can read them (e.g. the cuts, one job each) without importing
numpy, pandas or scipy at parse time."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any

from wattflex.policies import baseline, names, optimum
from wattflex.schema import section_defaults

# Settings the per-cut simulation does not read: changing them reruns only the merge.
MERGE_ONLY_KEYS = ("cuts", "headline", "published")
# The tables each per-cut job writes and the merge reads (one parquet file each).
PART_TABLES = ("results", "summary", "sla", "out_of_sample")


def cut_label(cut: float) -> str:
    """A cut as a file-name part that reads back as the same float (``repr``)."""
    return repr(float(cut))


# The ``allocation:`` section's nested mappings and the flat fields their keys become.
NESTED_KEYS = {
    "production": {"pretraining_fraction": "pretraining_fraction"},
    "sla": {"tiers": "sla_tiers", "tier_weights": "sla_tier_weights"},
    "out_of_sample": {"splits": "oos_splits", "workloads": "oos_workloads"},
    "headline": {"mix": "headline_mix", "cut": "headline_cut"},
    "published": {
        "tokens_per_s_per_job": "published_tokens_per_s_per_job",
        "gap_closed": "published_gap_closed",
    },
}


def flatten(cfg: Mapping[str, Any]) -> dict[str, Any]:
    """The nested config layout (the schema's allocation:) as SimulationConfig's flat fields; flat keys kept
    (a nested key the schema does not list is left out: the schema refuses it when a config is loaded)."""
    flat: dict[str, Any] = {}
    for key, val in cfg.items():
        if key in NESTED_KEYS:
            flat.update({NESTED_KEYS[key][k]: v for k, v in val.items() if k in NESTED_KEYS[key]})
        else:
            flat[key] = val
    return flat


_DEFAULTS = flatten(section_defaults("allocation"))  # the schema's (the paper's setup)


def _default(name: str) -> Any:
    """A field's default, a fresh copy of a list for each instance."""
    value = _DEFAULTS[name]
    return field(default_factory=lambda: list(value)) if isinstance(value, list) else value


@dataclass
class SimulationConfig:
    """The ``allocation:`` config slice (defaults: the schema's, the paper's setup)."""

    groups_set: str = _default("groups_set")
    n_workloads: int = _default("n_workloads")
    jobs_per_workload: int = _default("jobs_per_workload")
    cuts: list[float] = _default("cuts")
    mixes: list[str] = _default("mixes")
    # Share of pretraining jobs in the "production" mix (count share among training jobs);
    # the schema's comment on allocation.production gives the source and caveat.
    pretraining_fraction: float = _default("pretraining_fraction")
    # every allocation policy of the registry (the schema states no copy of it)
    policies: list[str] = field(default_factory=lambda: list(names(allocation=True)))
    pfi_column: str = _default("pfi_column")
    moe_ft_share: float = _default("moe_ft_share")
    curve_nodes: int = _default("curve_nodes")
    seed: int = _default("seed")
    sla_tiers: list[float] = _default("sla_tiers")
    sla_tier_weights: list[float] = _default("sla_tier_weights")
    oos_splits: int = _default("oos_splits")
    oos_workloads: int = _default("oos_workloads")
    headline_mix: str = _default("headline_mix")
    headline_cut: float = _default("headline_cut")
    published_tokens_per_s_per_job: float = _default("published_tokens_per_s_per_job")
    published_gap_closed: float = _default("published_gap_closed")

    @classmethod
    def from_dict(cls, cfg: Mapping[str, Any] | None) -> SimulationConfig:
        """Accept the nested config layout (the schema's allocation:) or flat keys."""
        flat = flatten(dict(cfg or {}))
        known = {f.name for f in fields(cls)}
        unknown = set(flat) - known
        if unknown:
            raise ValueError(f"unknown allocation config key(s): {', '.join(sorted(unknown))}")
        out = cls(**{k: v for k, v in flat.items() if v is not None})
        known = names(allocation=True)
        bad = set(out.policies) - set(known)
        if bad:
            raise ValueError(
                f"unknown allocation policies {sorted(bad)}; choose from {', '.join(known)}"
            )
        # the gap closed is counted between these two: always simulated
        out.policies = list(dict.fromkeys([baseline(), *out.policies, optimum()]))
        if not 0.0 <= out.pretraining_fraction <= 1.0:
            raise ValueError("allocation.production.pretraining_fraction must be in [0, 1]")
        if any(not 0.0 <= c < 1.0 for c in out.cuts):
            raise ValueError("allocation.cuts must be fractions in [0, 1)")
        return out
