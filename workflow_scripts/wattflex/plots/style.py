"""The look shared by every wattflex figure: backend labels, cluster colours, the style.

Every figure made from emulated runs carries a visible "EMULATED" label (``label_backend``)
so an emulated plot can never pass for a measurement.
"""

from __future__ import annotations

from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

from wattflex.labels import backend_label  # noqa: F401 (re-exported: plots draw it)

CLUSTER_COLORS = {"dense": "#1f77b4", "moe-pt": "#ff7f0e", "moe-ft": "#2ca02c"}
CLUSTER_ORDER = ["dense", "moe-pt", "moe-ft"]
# label, colour, line style of every policy in wattflex.allocation.policies.REGISTRY
POLICY_LOOK = {
    "equal-weight": ("equal weight", "#555555", "-"),
    "pfi-aware": ("PFI-aware (predicted PFI)", "#1f77b4", "-"),
    "pfi-aware-measured": ("PFI-aware (measured PFI)", "#1f77b4", ":"),
    "moe-ft-weighted": ("MoE-FT-weighted", "#2ca02c", "-"),
    "raw-dcgm": ("raw DCGM", "#9467bd", "-"),
    "curve-aware": ("curve-aware (predicted curves)", "#ff7f0e", "--"),
    "online-learning": ("online learning", "#e377c2", "-"),
    "oracle": ("oracle", "#d62728", "-"),
    "uncapped": ("uncapped", "#bbbbbb", ":"),
}


def label_backend(fig: plt.Figure, backends: Any) -> None:
    text = backend_label(backends)
    color = "#b00020" if "EMULATED" in text else "#333333"
    fig.text(0.995, 0.005, text, ha="right", va="bottom", fontsize=8, color=color, weight="bold")


def apply_style(cfg: dict[str, Any] | None) -> None:
    """The ``figures`` config's style; figures are laid out at the dpi they are saved at, so
    tight_layout and savefig share one renderer and its text-extent cache."""
    cfg = cfg or {}
    plt.style.use(cfg.get("style", "default"))
    plt.rcParams["figure.dpi"] = plt.rcParams["savefig.dpi"] = int(cfg.get("dpi", 110))
