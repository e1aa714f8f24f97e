"""Throughput sources of the command launch (wattflex.runs.throughput): each preset parses its
framework's REAL log excerpt (tests/data/logs/, sources in SOURCE.md there) to the tokens/s
worked out by hand from the lines; bad sources are refused with the key named."""

import math
from pathlib import Path

import pytest

from wattflex.runs.throughput import (
    ThroughputError,
    ThroughputSource,
    read_steps_file,
    steps_from_lines,
)

LOGS = Path(__file__).resolve().parents[2] / "data" / "logs"


def parsed(name, **spec):
    src = ThroughputSource.from_spec(
        spec, **{k: spec.pop(k) for k in ("seq_len", "gpus") if k in spec}
    )
    lines = (LOGS / name).read_text(encoding="utf-8").replace("\r", "\n").splitlines()
    return [r for r in map(src.parse, lines) if r is not None]


def test_torchtitan_tps_is_per_gpu():
    rows = parsed("torchtitan.log", preset="torchtitan", gpus=8)
    assert [r[0] for r in rows] == [14, 15, 16, 17]
    assert [r[1] for r in rows] == [7282 * 8, 7334 * 8, 7313 * 8, 7282 * 8]
    assert rows[0][2] == pytest.approx(3.24405)


def test_megatron_global_batch_times_seq_len_over_iteration_time():
    rows = parsed("megatron.log", preset="megatron", seq_len=4096)
    assert [r[0] for r in rows] == [71, 72, 73]
    assert rows[0][1] == pytest.approx(128 * 4096 / 5.3616)
    assert rows[2][1] == pytest.approx(128 * 4096 / 5.8299)
    assert rows[1][2] == pytest.approx(1.820313)


def test_nemo_global_batch_times_seq_len_over_step_timing():
    rows = parsed("nemo.log", preset="nemo", seq_len=1024)
    assert [r[0] for r in rows] == [120, 121, 122]
    assert rows[0][1] == pytest.approx(1 * 1024 / 0.03146)
    assert rows[2][2] == pytest.approx(1.333)


def test_hf_trainer_seconds_per_step_and_steps_per_second():
    rows = parsed("hf_trainer.log", preset="hf-trainer", tokens_per_step=10 * 128)
    assert [r[0] for r in rows] == [2, 3]
    assert [r[1] for r in rows] == pytest.approx([1280 / 5.01, 1280 / 5.97])
    rows = parsed("hf_trainer_its.log", preset="hf-trainer", tokens_per_step=1000)
    assert [r[0] for r in rows] == [2086, 2087] and [r[1] for r in rows] == pytest.approx(
        [1490, 1480]
    )


def test_a_preset_never_matches_another_frameworks_lines():
    factors = {"seq_len": 1024, "gpus": 1, "tokens_per_step": 1000}
    files = {
        "torchtitan": "torchtitan.log",
        "megatron": "megatron.log",
        "nemo": "nemo.log",
        "hf-trainer": "hf_trainer.log",
    }
    for preset in files:
        for other, name in files.items():
            if other != preset:
                assert parsed(name, preset=preset, **factors) == [], (preset, name)


def test_own_regex_samples_per_s():
    src = ThroughputSource.from_spec(
        {"regex": r"(?P<samples_per_s>[0-9.]+) samples/s", "tokens_per_sample": 512}
    )
    assert src.parse("epoch 1: 3.5 samples/s")[1] == pytest.approx(3.5 * 512)
    assert src.parse("nothing here") is None


@pytest.mark.parametrize(
    "spec, words",
    [
        ({}, "exactly one of preset"),
        ({"preset": "deepspeed"}, "unknown preset 'deepspeed'"),
        ({"regex": "(?P<tokens_per_s"}, "not a regular expression"),
        ({"regex": r"loss (?P<loss>\d+)"}, "named group for the rate"),
        ({"regex": r"(?P<step_time_s>[0-9.]+) s/step"}, "needs tokens per step"),
        ({"preset": "hf-trainer"}, "needs tokens per step"),
        ({"preset": "torchtitan", "steps_file": "s.csv"}, "exactly one of"),
    ],
)
def test_bad_sources_name_the_key(spec, words):
    with pytest.raises(ThroughputError, match="command.throughput") as exc:
        ThroughputSource.from_spec(spec)
    assert words in str(exc.value)


def test_steps_from_lines_keeps_the_logged_rate():
    steps = steps_from_lines(
        [(10.0, 1, 100.0, 2.0), (12.0, 2, 150.0, 1.9), (15.0, float("nan"), 200.0, float("nan"))]
    )
    assert list(steps["step"]) == [1, 2, 3]
    assert math.isnan(steps["tokens"][0])
    rate = steps["tokens"] / steps["t_end_s"].diff()
    assert list(rate[1:]) == pytest.approx([150.0, 200.0])


def test_steps_file_csv_and_jsonl(tmp_path):
    (tmp_path / "s.csv").write_text("step,t_end_s,tokens\n1,1000.5,64\n2,1001.5,64\n3,100")
    steps = read_steps_file(tmp_path / "s.csv", t0=1000.0)
    assert list(steps["t_end_s"]) == [0.5, 1.5] and list(steps["tokens"]) == [64, 64]
    (tmp_path / "s.jsonl").write_text('{"step": 1, "t_end_s": 1002, "tokens": 8, "loss": 1.5}\n')
    assert read_steps_file(tmp_path / "s.jsonl", t0=1000.0)["loss"].tolist() == [1.5]
    (tmp_path / "bad.csv").write_text("step,time\n1,2\n")
    with pytest.raises(ThroughputError, match="missing column.*t_end_s"):
        read_steps_file(tmp_path / "bad.csv", t0=0)


def test_lines_read_together_are_one_row_at_their_harmonic_mean_rate():
    steps = steps_from_lines([(1.0, 1, 100.0, 2.0), (2.0, 2, 100.0, 2.0), (2.0, 3, 300.0, 1.5)])
    assert list(steps["step"]) == [1, 3] and steps["loss"].iloc[-1] == 1.5
    assert steps["tokens"].iloc[1] / 1.0 == pytest.approx(2 / (1 / 100 + 1 / 300))
