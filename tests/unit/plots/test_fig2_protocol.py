"""Fig. 2 shades the phases with the summary protocol the run's numbers used."""

import numpy as np
import pandas as pd
import pytest

from wattflex.plots import sweeps
from wattflex.telemetry import SummaryProtocol


def _run():
    """60 s loading at 40 % utilisation (full power), then 100 s training at 97 %."""
    t = np.arange(0.0, 160.0, 1.0)
    util = np.select([t < 10, t < 70], [0.0, 40.0], 97.0)
    power = np.where(t < 10, 90.0, 650.0)
    telemetry = pd.DataFrame(
        {
            "t_s": t,
            "node": "node0",
            "gpu": 0,
            "power_w": power,
            "gpu_util": util,
            "fb_used_gib": np.where(t >= 5, 60.0, 0.5),
        }
    )
    steps = pd.DataFrame(
        {"step": np.arange(1, 141), "t_end_s": np.linspace(12, 159, 140), "tokens": 4096}
    )
    return telemetry, steps


def _shaded_s(fig) -> float:
    """Seconds of the power panel covered by phase shading (axvspan patches, x in minutes)."""
    ax = fig.axes[0]
    return 60 * sum(p.get_width() for p in ax.patches)


@pytest.mark.parametrize(
    "threshold, shaded_s, training_min", [(50.0, 70.0, 1.5), (30.0, 10.0, 2.5)]
)
def test_train_util_threshold_moves_the_shading(threshold, shaded_s, training_min):
    telemetry, steps = _run()
    fig = sweeps.timeseries_figure(
        telemetry, steps, "g0", "emulated", protocol=SummaryProtocol(train_util_threshold=threshold)
    )
    # 40 % is below a 50 % threshold (startup, shaded) and above a 30 % one (training, not)
    assert _shaded_s(fig) == pytest.approx(shaded_s, abs=1.0)
    assert f"training phase {training_min:.1f} min" in fig.axes[0].get_title()
