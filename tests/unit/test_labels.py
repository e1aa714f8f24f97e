"""The emulated/measured label every table sidecar and figure carries (wattflex.labels)."""

import subprocess
import sys

from wattflex.labels import backend_label


def test_backend_label_names_emulated_mixed_and_measured():
    assert backend_label(["emulated"]).startswith("EMULATED")
    assert backend_label("emulated").startswith("EMULATED")
    assert backend_label(["emulated", "nvml"]).startswith("MIXED")
    assert backend_label(["ingest"]) == "measured (ingest)"
    assert backend_label(["cuda", None, float("nan")]) == "measured (cuda)"


def test_plots_draw_the_same_label_and_tables_get_it_without_matplotlib():
    from wattflex.plots.style import backend_label as drawn

    assert drawn is backend_label
    code = "import sys, wattflex.labels; assert 'matplotlib' not in sys.modules and 'pandas' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True)
