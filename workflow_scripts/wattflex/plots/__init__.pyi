# The names `wattflex.plots` hands on, loaded on first use (lazy_loader reads this stub).
from .allocation import fig8_figure, out_of_sample_figure
from .analysis import beside_published_scatter, predicted_vs_measured, summary_text, telemetry_grid
from .control import policy_styles, power_figure, tokens_figure
from .fidelity import emulated_vs_published
from .grid import mv_figure, offer_figure, statement_figure
from .ingest import robust_vs_ratio_figure
from .style import apply_style, save_figure
from .sweeps import curves_figure

__all__ = [
    "apply_style",
    "beside_published_scatter",
    "curves_figure",
    "emulated_vs_published",
    "fig8_figure",
    "mv_figure",
    "offer_figure",
    "out_of_sample_figure",
    "policy_styles",
    "power_figure",
    "predicted_vs_measured",
    "robust_vs_ratio_figure",
    "save_figure",
    "statement_figure",
    "summary_text",
    "telemetry_grid",
    "tokens_figure",
]
