# The names `wattflex.analysis` hands on, loaded on first use (lazy_loader reads this stub).
from .clock_scaling import fit_clock_scaling
from .paper_tables import beside_published, read_campaign
from .predictor import is_fitted, predict, scores
from .published import load_published, table6_comparison
from .stats import cluster_tests_table, kruskal_dunn, telemetry_correlations

__all__ = [
    "beside_published",
    "cluster_tests_table",
    "fit_clock_scaling",
    "is_fitted",
    "kruskal_dunn",
    "load_published",
    "predict",
    "read_campaign",
    "scores",
    "table6_comparison",
    "telemetry_correlations",
]
