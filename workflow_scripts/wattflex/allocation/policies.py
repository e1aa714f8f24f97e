"""The one registry of power-allocation policies: what each is and who can run it.

Every policy name the library knows (the allocation simulation, ``wattflex allocate``, the
closed-loop controller, the cluster simulation's references and the figures) comes from
:data:`REGISTRY`; the tuples below are views of it, in registry order. A config's policy names
are checked against it (wattflex.config.check_names).
The algorithms live in :mod:`wattflex.allocation.allocator` and
:mod:`wattflex.ops.controller`; each policy's label, colour and line style in figures
are in :data:`wattflex.plots.style.POLICY_LOOK` (a test holds the two in step), so that a
colour change reruns only figure rules, never a simulation. Deliberately light (no numpy, no pandas): every
``wattflex`` command imports it to build ``--help``.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Policy:
    """One policy: its name, what it reads and who can run it (its look: plots/style.py)."""

    name: str
    feature: str | None = None  # per-job input it reads besides the curves
    weighted: bool = False  # water-fills the cut in proportion to a per-job weight
    allocation: bool = False  # run by the allocation simulation and ``wattflex allocate``
    control: bool = False  # run by the closed-loop controller
    cluster_reference: bool = False  # run beside the controllers in the cluster simulation
    split: bool = (
        False  # splits a cluster's budget across SLURM units (wattflex.ops.adapters.slurm)
    )
    # the live controller needs each job's measured tokens/s (its curve's scale and, learning,
    # its shape): `wattflex control` refuses it without a throughput source
    live_throughput: bool = False


REGISTRY: dict[str, Policy] = {
    p.name: p
    for p in (
        Policy("equal-weight", weighted=True, allocation=True, control=True, split=True),
        Policy(
            "pfi-aware", feature="pfi", weighted=True, allocation=True, control=True, split=True
        ),
        # the measured PFI: a reference for the predictor, so offline only
        Policy("pfi-aware-measured", feature="pfi_measured", weighted=True, allocation=True),
        Policy("moe-ft-weighted", feature="moe_ft", weighted=True, allocation=True, control=True),
        Policy(
            "raw-dcgm", feature="dram_copy_product", weighted=True, allocation=True, control=True
        ),
        Policy(
            "curve-aware",
            feature="pfi",
            allocation=True,
            control=True,
            split=True,
            live_throughput=True,
        ),
        # refines each job's prior curve (from its PFI) with its own telemetry, so it exists only in the loop
        Policy("online-learning", feature="pfi", control=True, live_throughput=True),
        Policy("oracle", allocation=True, cluster_reference=True, split=True),
        # no control at all: the tokens a cut costs
        Policy("uncapped", cluster_reference=True),
    )
}


def names(**capability: bool) -> tuple[str, ...]:
    """Policy names, in registry order, whose fields equal ``capability`` (e.g. control=True)."""
    return tuple(
        p.name for p in REGISTRY.values() if all(getattr(p, k) == v for k, v in capability.items())
    )


POLICIES = names(allocation=True)  # the allocation simulation's, `wattflex allocate`'s
WEIGHTED_POLICIES = names(allocation=True, weighted=True)  # the water-filled ones among them
POLICY_FEATURES = {p.name: p.feature for p in REGISTRY.values() if p.allocation and p.feature}
CONTROL_POLICIES = names(control=True)  # the closed-loop controller's, `wattflex control`'s
CURVE_POLICIES = names(control=True, weighted=False)  # the controller's that allocate on curves
CLUSTER_REFERENCES = names(cluster_reference=True)  # run beside the controllers, not controllers
SPLIT_POLICIES = names(split=True)  # the cluster coordinator's (wattflex.ops.adapters.slurm)
THROUGHPUT_POLICIES = names(control=True, live_throughput=True)  # need a live tokens/s source
