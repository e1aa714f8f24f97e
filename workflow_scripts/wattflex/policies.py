"""The one registry of power-allocation policies: each policy is an object that carries its
behaviour, what it needs, who can run it and how figures draw it.

Every policy the library knows (the allocation simulation, ``wattflex allocate``, the
closed-loop controller, the cluster simulation's references, the SLURM coordinator's split
and the figures) comes from :data:`REGISTRY`; nobody branches on a policy's name elsewhere.
A new policy is one subclass of :class:`Policy` (or an instance of an existing family)
handed to :func:`register`:

- a **weighted** policy overrides :meth:`Policy.weights`: the cut is water-filled in
  proportion to those per-job weights (:func:`wattflex.allocation.waterfill.water_fill`);
- a **curve** policy sets :attr:`Policy.curves` instead: the exact oracle
  (:mod:`wattflex.allocation.oracle`) runs on the ``"measured"`` curves or on curves
  ``"predicted"`` from the job's PFI (:func:`wattflex.allocation.allocator.predicted_curves`);
  ``learns`` makes the live controller refine those curves from each job's telemetry.

The engines that run them live in :mod:`wattflex.allocation.allocator` and
:mod:`wattflex.ops.controller`; they read these attributes and call these methods.
A config's policy names are checked against the registry (wattflex.config.check_names); it
sits in the core so that the config, the allocation engines, operations and figures all
import it downward.
Deliberately light (no numpy, no pandas at import; a method imports numpy when it runs):
every ``wattflex`` command imports it to build ``--help``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

#: what :attr:`Policy.curves` may say: the curves the oracle runs on (None: weighted)
CURVE_SOURCES = (None, "measured", "predicted")
#: the roles the studies read a policy by (at most one policy each): ``baseline`` (what the
#: gap closed is counted from), ``optimum`` (the exact reference, the gap's other end),
#: ``unlimited`` (no control: the tokens a cut costs) and ``published`` (the paper's policy,
#: beside which the headline puts the published numbers)
ROLES = ("baseline", "optimum", "unlimited", "published")


@dataclass(frozen=True)
class Look:
    """How figures draw a policy: legend label, colour and matplotlib line style."""

    label: str
    color: str
    linestyle: str = "-"


@dataclass(frozen=True, kw_only=True)
class Policy:
    """One policy: its name and look, what it reads, who runs it, and how it splits a cut.

    Subclass it and override :meth:`weights` (a weighted policy) or set ``curves`` (a curve
    policy); then :func:`register` an instance.
    """

    name: str
    look: Look
    feature: str | None = None  # per-job input it reads besides the curves (a features key)
    curves: str | None = None  # None: water-fills by weights(); else the oracle on these curves
    learns: bool = False  # the live controller refines its curves from each job's telemetry
    needs_curves: bool = True  # needs the campaign's curves (P_max, T_max) to split at all
    live_throughput: bool = False  # the live controller needs each job's measured tokens/s
    allocation: bool = False  # run by the allocation simulation and ``wattflex allocate``
    control: bool = False  # run by the closed-loop controller
    cluster_reference: bool = False  # run beside the controllers in the cluster simulation
    split: bool = (
        False  # splits a cluster's budget across SLURM units (wattflex.ops.adapters.slurm)
    )
    out_of_sample: bool = False  # in the study of a predictor fitted on half the groups
    role: str | None = None  # one of ROLES, or None

    def __post_init__(self) -> None:
        """Refuse a policy that cannot run, in one line."""
        if not self.name or self.name != self.name.strip() or "|" in self.name:
            raise ValueError(f"policy name {self.name!r}: a non-empty name without '|'")
        if self.curves not in CURVE_SOURCES:
            raise ValueError(
                f"policy {self.name}: curves must be one of {CURVE_SOURCES}, not {self.curves!r}"
            )
        if self.role is not None and self.role not in ROLES:
            raise ValueError(f"policy {self.name}: role must be one of {ROLES}, not {self.role!r}")
        if self.curves == "predicted" and self.feature is None:
            raise ValueError(f"policy {self.name}: predicted curves need a PFI feature")
        if self.control and self.curves == "measured":
            raise ValueError(f"policy {self.name}: the live controller has no measured curves")
        if self.learns and (self.curves is None or not self.live_throughput):
            raise ValueError(f"policy {self.name}: learning needs curves and live throughput")

    @property
    def weighted(self) -> bool:
        """True when the policy water-fills the cut by :meth:`weights` (no curves)."""
        return self.curves is None and type(self).weights is not Policy.weights

    def weights(self, curves: Any, features: Mapping[str, Any], options: Mapping[str, Any]) -> Any:
        """Per-job weights (..., n) of the cut each job takes (a weighted policy only).

        ``curves``: a :class:`wattflex.allocation.curves.Curves` (its ``ceiling_w`` and
        ``uncapped_throughput``); ``features``: per-job arrays (``feature`` among them);
        ``options``: the allocation settings (e.g. ``moe_ft_share``).
        """
        raise ValueError(
            f"{self.name!r} is not a weighted policy ({', '.join(names(weighted=True))})"
        )


class EqualWeight(Policy):
    """``C_i ∝ P_max_i``: every job gives up the same fraction of its power."""

    def weights(self, curves: Any, features: Mapping[str, Any], options: Mapping[str, Any]) -> Any:
        """Each job's uncapped power."""
        return curves.ceiling_w


class PfiAware(Policy):
    """``C_i ∝ (P_max_i / T_max_i) * PFI_i``: the paper's policy, PFI from ``feature``."""

    def weights(self, curves: Any, features: Mapping[str, Any], options: Mapping[str, Any]) -> Any:
        """Watts per token/s of each job times its PFI (0 where a job has no throughput)."""
        import numpy as np

        p_max, t_max = curves.ceiling_w, curves.uncapped_throughput
        pfi = np.asarray(features[self.feature], float)
        return np.divide(p_max, t_max, out=np.zeros_like(p_max), where=t_max > 0) * pfi


class MoeFtWeighted(Policy):
    """Equal weight, MoE fine-tuning jobs take ``moe_ft_share`` times the share."""

    def weights(self, curves: Any, features: Mapping[str, Any], options: Mapping[str, Any]) -> Any:
        """Each job's uncapped power, times ``moe_ft_share`` for the MoE-FT jobs."""
        import numpy as np

        moe = np.asarray(features[self.feature], bool)
        return curves.ceiling_w * np.where(moe, options["moe_ft_share"], 1.0)


class RawDcgm(Policy):
    """``C_i ∝`` the DRAM copy product (``dram_active * mem_copy_util``) of each job."""

    def weights(self, curves: Any, features: Mapping[str, Any], options: Mapping[str, Any]) -> Any:
        """The DRAM copy product itself."""
        import numpy as np

        return np.asarray(features[self.feature], float)


class CurvePolicy(Policy):
    """The exact oracle on ``curves`` (measured or predicted); no weights."""


class Reference(Policy):
    """A reference run beside the controllers that allocates nothing (``uncapped``)."""


REGISTRY: dict[str, Policy] = {}


def register(policy: Policy) -> Policy:
    """Add ``policy`` to :data:`REGISTRY` (after the others) and return it.

    Refused in one line: a name already taken, a role another policy holds, a policy that
    neither weights jobs, allocates on curves nor is a reference.
    """
    if not isinstance(policy, Policy):
        raise TypeError(f"register() takes a Policy, not {type(policy).__name__}")
    if policy.name in REGISTRY:
        raise ValueError(f"policy {policy.name!r} is already registered")
    if policy.role is not None and policy.role in _roles():
        raise ValueError(f"policy {policy.name}: role {policy.role} is {_roles()[policy.role]}'s")
    runs = policy.allocation or policy.control or policy.split
    if runs and not (policy.weighted or policy.curves is not None):
        raise ValueError(f"policy {policy.name}: override weights() or set curves")
    REGISTRY[policy.name] = policy
    return policy


def unregister(name: str) -> Policy:
    """Remove the policy ``name`` from :data:`REGISTRY` and return it."""
    return REGISTRY.pop(get(name).name)


def get(name: str, capability: str | None = None) -> Policy:
    """The registered policy ``name``; with ``capability`` (e.g. ``"control"``), one that has it.

    An unknown name raises ValueError naming the choices.
    """
    policy = REGISTRY.get(name)
    if policy is None or (capability is not None and not getattr(policy, capability)):
        what = "policy" if capability is None else f"{capability} policy"
        choices = names() if capability is None else names(**{capability: True})
        raise ValueError(f"unknown {what} {name!r}; choose from {', '.join(choices)}")
    return policy


def names(**capability: Any) -> tuple[str, ...]:
    """Policy names, in registry order, whose attributes equal ``capability`` (control=True)."""
    return tuple(
        p.name for p in REGISTRY.values() if all(getattr(p, k) == v for k, v in capability.items())
    )


def _roles() -> dict[str, str]:
    """Role -> the name of the policy that holds it."""
    return {p.role: p.name for p in REGISTRY.values() if p.role is not None}


def by_role(role: str) -> str:
    """The name of the policy that plays ``role`` (one of :data:`ROLES`)."""
    if role not in ROLES:
        raise ValueError(f"role must be one of {ROLES}, not {role!r}")
    held = _roles()
    if role not in held:
        raise ValueError(f"no registered policy plays the {role} role")
    return held[role]


def baseline() -> str:
    """The policy the gap closed is counted from (``equal-weight``)."""
    return by_role("baseline")


def optimum() -> str:
    """The exact reference, the gap's other end (``oracle``)."""
    return by_role("optimum")


def unlimited() -> str:
    """The no-control reference: the tokens a cut costs (``uncapped``)."""
    return by_role("unlimited")


def published() -> str:
    """The paper's policy, beside which the headline puts the published numbers."""
    return by_role("published")


for _policy in (
    EqualWeight(
        name="equal-weight",
        look=Look("equal weight", "#555555"),
        needs_curves=False,
        allocation=True,
        control=True,
        split=True,
        out_of_sample=True,
        role="baseline",
    ),
    PfiAware(
        name="pfi-aware",
        look=Look("PFI-aware (predicted PFI)", "#1f77b4"),
        feature="pfi",
        allocation=True,
        control=True,
        split=True,
        out_of_sample=True,
        role="published",
    ),
    # the measured PFI: a reference for the predictor, so offline only
    PfiAware(
        name="pfi-aware-measured",
        look=Look("PFI-aware (measured PFI)", "#1f77b4", ":"),
        feature="pfi_measured",
        allocation=True,
    ),
    MoeFtWeighted(
        name="moe-ft-weighted",
        look=Look("MoE-FT-weighted", "#2ca02c"),
        feature="moe_ft",
        allocation=True,
        control=True,
    ),
    RawDcgm(
        name="raw-dcgm",
        look=Look("raw DCGM", "#9467bd"),
        feature="dram_copy_product",
        allocation=True,
        control=True,
        out_of_sample=True,
    ),
    CurvePolicy(
        name="curve-aware",
        look=Look("curve-aware (predicted curves)", "#ff7f0e", "--"),
        feature="pfi",
        curves="predicted",
        live_throughput=True,
        allocation=True,
        control=True,
        split=True,
        out_of_sample=True,
    ),
    # refines each job's prior curve (from its PFI) with its own telemetry: only in the loop
    CurvePolicy(
        name="online-learning",
        look=Look("online learning", "#e377c2"),
        feature="pfi",
        curves="predicted",
        learns=True,
        live_throughput=True,
        control=True,
    ),
    CurvePolicy(
        name="oracle",
        look=Look("oracle", "#d62728"),
        curves="measured",
        allocation=True,
        cluster_reference=True,
        split=True,
        out_of_sample=True,
        role="optimum",
    ),
    # no control at all: the tokens a cut costs
    Reference(
        name="uncapped",
        look=Look("uncapped", "#bbbbbb", ":"),
        needs_curves=False,
        cluster_reference=True,
        role="unlimited",
    ),
):
    register(_policy)
del _policy

_VIEWS = {
    "POLICIES": {"allocation": True},  # the allocation simulation's, `wattflex allocate`'s
    "WEIGHTED_POLICIES": {"allocation": True, "weighted": True},  # water-filled among them
    "CONTROL_POLICIES": {"control": True},  # the closed-loop controller's, `wattflex control`'s
    "CURVE_POLICIES": {"control": True, "weighted": False},  # the controller's on curves
    "CLUSTER_REFERENCES": {"cluster_reference": True},  # run beside the controllers
    "SPLIT_POLICIES": {"split": True},  # the cluster coordinator's (wattflex.ops.adapters.slurm)
    "THROUGHPUT_POLICIES": {"control": True, "live_throughput": True},  # need live tokens/s
}


def __getattr__(attr: str) -> Any:
    """The registry's views by capability (``POLICIES``, ``CONTROL_POLICIES``, ...), read
    when asked, so that a policy registered later is in them; ``POLICY_FEATURES``:
    allocation policy -> the per-job feature it reads."""
    if attr in _VIEWS:
        return names(**_VIEWS[attr])
    if attr == "POLICY_FEATURES":
        return {p.name: p.feature for p in REGISTRY.values() if p.allocation and p.feature}
    raise AttributeError(f"module {__name__!r} has no attribute {attr!r}")
