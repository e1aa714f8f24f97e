"""The metric registry (wattflex.metrics) is the one place a telemetry metric is declared:
a metric added there alone reaches the telemetry schema, the NVML sampler's rows (against a
FAKE pynvml: only the NVML library is fake), the emulator's telemetry, the run summary and the
predictor's candidates."""

import dataclasses

import pandas as pd
import pytest

from tests.fakes.nvml_fixture import fake_nvml  # noqa: F401 (fixture)
from wattflex import metrics, telemetry
from wattflex.analysis import predictor
from wattflex.ingest import dcgm as ingest_dcgm
from wattflex.runs.devices import nvml
from wattflex.runs.devices.base import empty_row, telemetry_frame

FAKE = metrics.Metric("nvlink_util", "%", 0.0, 100.0, "NVLink utilisation (%)", predictor=True)


@pytest.fixture
def with_fake_metric(monkeypatch):
    monkeypatch.setattr(metrics, "METRICS", [*metrics.METRICS, FAKE])


def test_a_metric_added_to_the_registry_reaches_the_telemetry_schema(with_fake_metric):
    assert telemetry.TELEMETRY_COLUMNS[-1] == "nvlink_util"
    assert "nvlink_util" in telemetry.ACTIVITY_METRICS
    assert "nvlink_util" in empty_row(0.0, "n0", 0)
    assert "nvlink_util" in telemetry_frame([empty_row(0.0, "n0", 0)]).columns


@pytest.mark.fake_gpu
def test_a_metric_added_to_the_registry_is_a_column_of_the_nvml_samplers_rows(
    fake_nvml, with_fake_metric
):
    row = nvml.NvmlGpu(0).sample(0.0)
    assert (
        "nvlink_util" in row and row["nvlink_util"] != row["nvlink_util"]
    )  # NaN: no NVML source yet


def test_a_metric_added_to_the_registry_is_summarised_and_a_predictor_candidate(with_fake_metric):
    tel = pd.DataFrame(
        {
            "t_s": [0.0, 0.0],
            "power_w": [300.0, 310.0],
            "gpu_util": [90.0, 92.0],
            "nvlink_util": [20.0, 30.0],
        }
    )
    assert telemetry.job_series(tel)["nvlink_util"].tolist() == [25.0]
    assert "nvlink_util" in predictor.resolve_features("all_dcgm")
    assert predictor.feature_definitions()["nvlink_util"] == "NVLink utilisation (%)"
    train = pd.DataFrame({"nvlink_util": [1.0, 2.0, 3.0], "gpu_util": [5.0, 5.0, 5.0]})
    assert predictor.resolve_features("all_dcgm", train) == [
        "nvlink_util"
    ]  # constant gpu_util dropped


def test_a_metric_added_to_the_registry_is_a_column_of_emulated_telemetry(
    default_config, with_fake_metric
):
    from wattflex.config import run_spec
    from wattflex.runs.emulator.device import run_emulated

    spec = run_spec(default_config, "dense-pt-mistral24b-x8", "cap700")
    spec["run"] = {**spec["run"], "duration_s": 300, "eval_at_s": None, "checkpoint_at_s": None}
    tel, _, _ = run_emulated(spec)
    assert list(tel.columns) == telemetry.TELEMETRY_COLUMNS
    assert (
        tel["nvlink_util"].isna().all() and tel["power_w"].notna().all()
    )  # no emulator source: NaN


def test_without_the_fake_metric_nothing_of_it_is_left():
    assert "nvlink_util" not in telemetry.TELEMETRY_COLUMNS
    assert "nvlink_util" not in predictor.resolve_features("all_dcgm")


def test_the_dcgm_parser_tables_come_from_the_registry():
    by_field = {m.dcgm_field: m for m in metrics.METRICS if m.dcgm_field is not None}
    assert set(ingest_dcgm.FIELDS) == set(by_field)
    for fid, (exporter, dmon, column, factor) in ingest_dcgm.FIELDS.items():
        m = by_field[fid]
        assert (exporter, dmon, column, factor) == (
            m.dcgm_exporter,
            m.dcgm_dmon,
            m.name,
            m.dcgm_factor,
        )
        assert ingest_dcgm.EXPORTER_METRICS[exporter] == (column, factor)
        assert ingest_dcgm.DMON_NAMES[dmon] == (column, factor)
    assert (
        ingest_dcgm.range_problem("dram_active", 45.0)
        == "dram_active = 45 is outside 0-1 (a 0-1 ratio, not a percentage)"
    )


def test_every_registry_entry_is_complete_and_unique():
    names = [m.name for m in metrics.METRICS]
    assert len(names) == len(set(names)) and not set(names) & set(metrics.ID_COLUMNS)
    for m in metrics.METRICS:
        assert m.lo < m.hi and m.unit and m.description, m.name
        # a DCGM field needs both of its names: the exporter's and dmon's
        assert (m.dcgm_field is None) == (m.dcgm_exporter is None) == (m.dcgm_dmon is None), m.name
        assert not (m.dcgm_profiling and m.dcgm_field is None), m.name
    assert dataclasses.is_dataclass(metrics.Metric)
