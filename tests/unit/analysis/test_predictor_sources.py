"""The predictor refuses a campaign whose runs mix telemetry sources unless told
(``predictor.telemetry_sources``, ``predictor.allow_mixed_sources``)."""

import pandas as pd
import pytest

from wattflex.analysis import predictor


def runs(*sources):
    return pd.DataFrame({"group": [f"g{i}" for i in range(len(sources))], "cap_w": 700.0,
                         "telemetry_source": list(sources)})


def test_one_source_is_returned():
    assert predictor.telemetry_sources(runs("dcgm", "dcgm", "dcgm")) == ["dcgm"]


def test_mixed_sources_are_refused_naming_each_and_the_switch():
    with pytest.raises(ValueError, match=r"mix telemetry sources \(dcgm: 1 run\(s\), nvml: 2 run\(s\)\).*"
                                         r"predictor.allow_mixed_sources: true"):
        predictor.telemetry_sources(runs("nvml", "dcgm", "nvml"))


def test_mixed_sources_are_fitted_when_allowed():
    assert predictor.telemetry_sources(runs("nvml", "dcgm"), allow_mixed=True) == ["dcgm", "nvml"]


def test_tables_without_the_column_are_not_checked():
    assert predictor.telemetry_sources(runs("nvml").drop(columns="telemetry_source")) == []
