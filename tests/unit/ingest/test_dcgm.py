"""DCGM importers on small captured samples (tests/data/dcgm_*): exporter scrapes and dmon."""

import re

import numpy as np
import pandas as pd
import pytest

from tests.conftest import REPO
from wattflex.ingest.dcgm import DcgmFormatError, parse_labels, read_dcgm_exporter, read_dcgmi_dmon
from wattflex.telemetry import TELEMETRY_COLUMNS, SummaryProtocol, summarize_run

DATA = REPO / "tests" / "data"
EXPORTER = DATA / "dcgm_exporter_h100x2.prom"
DMON = DATA / "dcgm_dmon_h100x2.txt"


def exporter_values(text: str, metric: str, gpu: int) -> list[float]:
    """Every value of one metric for one GPU, in file order (read straight from the text)."""
    pat = re.compile(rf'^{metric}\{{gpu="{gpu}",[^}}]*\}} (\S+)$', re.M)
    return [float(v) for v in pat.findall(text)]


def dmon_column(text: str, name: str, gpu: int) -> list[str]:
    header = next(line.split()[1:] for line in text.splitlines() if line.startswith("#Entity"))
    rows = [line.split()[2:] for line in text.splitlines() if line.startswith(f"GPU {gpu} ")]
    return [r[header.index(name)] for r in rows]


def test_exporter_scrapes_map_to_the_telemetry_schema():
    text = EXPORTER.read_text()
    tel = read_dcgm_exporter([EXPORTER])
    assert list(tel.columns) == TELEMETRY_COLUMNS
    n_scrapes = text.count("# scrape_time")
    assert len(tel) == 2 * n_scrapes and set(tel["gpu"]) == {0, 1}
    assert set(tel["node"]) == {"gpu-node-017"}  # from the Hostname label
    # every GPU of a scrape shares the scrape's time, taken from the marker line
    times = [float(t) for t in re.findall(r"^# scrape_time (\S+)$", text, re.M)]
    assert sorted(tel["t_s"].unique()) == pytest.approx(times)
    gpu0 = tel[tel["gpu"] == 0]
    assert gpu0["power_w"].tolist() == pytest.approx(
        exporter_values(text, "DCGM_FI_DEV_POWER_USAGE", 0)
    )
    # units: MiB -> GiB, mJ -> J; ratios stay ratios
    assert gpu0["fb_used_gib"].tolist() == pytest.approx(
        [v / 1024 for v in exporter_values(text, "DCGM_FI_DEV_FB_USED", 0)]
    )
    assert gpu0["energy_j"].tolist() == pytest.approx(
        [v / 1000 for v in exporter_values(text, "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", 0)]
    )
    assert tel["dram_active"].between(0, 1).all()
    assert gpu0["enforced_limit_w"].tolist() == pytest.approx(
        exporter_values(text, "DCGM_FI_DEV_ENFORCED_POWER_LIMIT", 0)
    )


def test_exporter_keeps_only_the_jobs_gpus():
    tel = read_dcgm_exporter([EXPORTER], gpu_ids=[1])
    assert set(tel["gpu"]) == {1}


def test_exporter_scrape_without_a_time_is_an_error_unless_times_are_given(tmp_path):
    one = (
        EXPORTER.read_text().split("# scrape_time")[1].split("\n", 1)[1]
    )  # first scrape, marker removed
    f1, f2 = tmp_path / "s1.prom", tmp_path / "s2.prom"
    f1.write_text(one)
    f2.write_text(one)
    with pytest.raises(DcgmFormatError, match="scrape_time"):
        read_dcgm_exporter([f1, f2])
    tel = read_dcgm_exporter([f1, f2], times=[100.0, 105.0])
    assert sorted(tel["t_s"].unique()) == [100.0, 105.0]


def test_exporter_sample_timestamps_and_old_metric_names(tmp_path):
    f = tmp_path / "old.prom"
    f.write_text(
        "# TYPE dcgm_power_usage gauge\n"
        'dcgm_power_usage{gpu="0",uuid="GPU-a"} 250.5 1700000000000\n'
        'dcgm_power_usage{gpu="1",uuid="GPU-b"} 240.0 1700000000000\n'
        'dcgm_fb_used{gpu="0",uuid="GPU-a"} 2048 1700000000000\n'
    )
    tel = read_dcgm_exporter([f], node="n7")
    assert tel["t_s"].unique().tolist() == [1_700_000_000.0]
    assert tel.set_index("gpu")["power_w"].to_dict() == {0: 250.5, 1: 240.0}
    assert tel.loc[tel["gpu"] == 0, "fb_used_gib"].item() == 2.0
    assert set(tel["node"]) == {"n7"}


@pytest.mark.parametrize(
    "line, message",
    [
        ('DCGM_FI_PROF_DRAM_ACTIVE{gpu="0"} 45.0', r"line 3: dram_active = 45 is outside 0-1"),
        ('DCGM_FI_DEV_POWER_USAGE{gpu="1"} 250000', r"line 3: power_w = 250000 is outside"),
        ('DCGM_FI_DEV_POWER_USAGE{gpu="0"} 251.0', r"line 3: second DCGM_FI_DEV_POWER_USAGE"),
        ('DCGM_FI_DEV_POWER_USAGE{gpu="0" 251.0', r"line 3: not a Prometheus sample line"),
        (
            'DCGM_FI_DEV_POWER_USAGE{UUID="GPU-x"} 251.0',
            r"line 3: DCGM_FI_DEV_POWER_USAGE has no gpu label",
        ),
    ],
)
def test_exporter_bad_lines_are_named(tmp_path, line, message):
    f = tmp_path / "bad.prom"
    f.write_text(f'# scrape_time 1700000000\nDCGM_FI_DEV_POWER_USAGE{{gpu="0"}} 250.0\n{line}\n')
    with pytest.raises(DcgmFormatError, match=message):
        read_dcgm_exporter([f])


def test_label_values_with_escapes():
    labels = parse_labels(r'gpu="0",modelName="NVIDIA \"H100\" 80GB",path="C:\\x"', "here")
    assert labels == {"gpu": "0", "modelName": 'NVIDIA "H100" 80GB', "path": "C:\\x"}


def test_dmon_output_maps_to_the_telemetry_schema():
    text = DMON.read_text()
    tel = read_dcgmi_dmon(DMON, period_s=5, node="n1")
    assert list(tel.columns) == TELEMETRY_COLUMNS
    n_samples = len(dmon_column(text, "POWER", 0))
    assert len(tel) == 2 * n_samples  # the repeated header is not a sample
    assert sorted(tel["t_s"].unique()) == [5.0 * k for k in range(n_samples)]
    gpu1 = tel[tel["gpu"] == 1]
    assert gpu1["power_w"].tolist() == pytest.approx(
        [float(v) for v in dmon_column(text, "POWER", 1)]
    )
    assert gpu1["fb_used_gib"].tolist() == pytest.approx(
        [float(v) / 1024 for v in dmon_column(text, "FBUSD", 1)]
    )
    na = [v == "N/A" for v in dmon_column(text, "TENSO", 1)]
    assert any(na) and gpu1["tensor_active"].isna().tolist() == na


def test_dmon_timestamped_lines_share_one_time_per_sample(tmp_path):
    f = tmp_path / "ts.txt"
    f.write_text(
        "#Entity   POWER   GPUTL\nID        W\n"
        "2026-11-29T10:00:00.010 GPU 0   300.0   100\n"
        "2026-11-29T10:00:00.012 GPU 1   310.0   100\n"
        "2026-11-29T10:00:05.011 GPU 0   305.0   100\n"
        "2026-11-29T10:00:05.013 GPU 1   301.0   100\n"
    )
    tel = read_dcgmi_dmon(f)
    assert tel.groupby("t_s")["gpu"].apply(sorted).tolist() == [[0, 1], [0, 1]]
    assert np.diff(sorted(tel["t_s"].unique())) == pytest.approx([5.001])


@pytest.mark.parametrize(
    "body, period_s, message",
    [
        ("\nGPU 0   300.0\n", 5, r"line 2: data before the '#Entity' header"),
        ("#Entity POWER GPUTL\nGPU 0   300.0\n", 5, r"line 2: 1 values for 2 fields"),
        ("#Entity POWER\nGPU 0   abc\n", 5, r"line 2: POWER value 'abc' is not a number"),
        ("#Entity POWER\nError: unable to watch fields\n", 5, r"line 2: not a dcgmi dmon line"),
        ("#Entity POWER\nGPU 0   300\n", None, r"line 2: .*no time: give period_s"),
    ],
)
def test_dmon_bad_lines_are_named(tmp_path, body, period_s, message):
    f = tmp_path / "bad.txt"
    f.write_text(body)
    with pytest.raises(DcgmFormatError, match=message):
        read_dcgmi_dmon(f, period_s=period_s)


@pytest.mark.parametrize("capture", ["exporter", "dmon"])
def test_captures_summarise_with_the_run_protocol(capture):
    """Captured telemetry + step log -> summarize_run, checked against the raw samples."""
    if capture == "exporter":
        tel = read_dcgm_exporter([EXPORTER])
        tel["t_s"] -= tel["t_s"].min()
        steps = pd.read_csv(DATA / "dcgm_steps_cap700.csv")
    else:
        tel = read_dcgmi_dmon(DMON, period_s=5)
        steps = pd.read_csv(DATA / "dcgm_steps_cap400.csv")
    summary = summarize_run(tel, steps, SummaryProtocol(aggregate="mean"))
    job = tel.groupby("t_s").agg(power_w=("power_w", "sum"), util=("gpu_util", "mean"))
    training = job[job["util"] >= 50]
    assert summary["power_w"] == pytest.approx(training["power_w"].mean())
    assert summary["gpus_seen"] == 2
    assert summary["dram_active"] == pytest.approx(
        tel.loc[tel["gpu_util"] >= 50, "dram_active"].mean()
    )
    rate = steps["tokens"] / steps["t_end_s"].diff()
    assert rate.min() <= summary["tokens_per_s"] <= rate.max()


def exporter_capture(path, step_back_s: float = 0.0, n: int = 12):
    """Scrapes every 5 s of two busy GPUs at 300 and 310 W; from the middle scrape on the
    clock is ``step_back_s`` behind (an NTP step)."""
    lines = []
    for k in range(n):
        lines.append(
            f"# scrape_time {1795956000 + 5 * k - (step_back_s if k >= n // 2 else 0):.3f}"
        )
        for g in (0, 1):
            lines += [
                f'DCGM_FI_DEV_POWER_USAGE{{gpu="{g}",Hostname="n1"}} {300 + 10 * g}',
                f'DCGM_FI_DEV_GPU_UTIL{{gpu="{g}",Hostname="n1"}} 99',
            ]
    path.write_text("\n".join(lines) + "\n")
    return path


def test_exporter_samples_whose_clock_goes_back_are_left_out_with_a_note(tmp_path):
    tel = read_dcgm_exporter([exporter_capture(tmp_path / "back.prom", step_back_s=15.0)])
    # scrapes 6-8 (stamped 15, 20, 25 s) are not later than scrape 5 (25 s): 9 scrapes kept
    assert len(tel) == 2 * 9 and not tel.duplicated(["t_s", "node", "gpu"]).any()
    assert (
        tel.groupby("t_s")["power_w"].sum() == 610
    ).all()  # never two samples of a GPU at one instant
    (note,) = tel.attrs["notes"]
    assert "back.prom: the clock goes back" in note and "left out 6 sample(s)" in note
    assert read_dcgm_exporter([exporter_capture(tmp_path / "mono.prom")]).attrs["notes"] == []
