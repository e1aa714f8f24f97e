"""``wattflex calibrate``: the anchor back from sweeps and a GPU-check reading made with a
known one, the paper's default fit, and one-line errors for input it cannot use."""

import json

import numpy as np
import pandas as pd
import pytest

from wattflex import calibration as cal
from wattflex.analysis import fidelity as fid
from wattflex.cli import main
from wattflex.config import load_config
from wattflex.gpus import GPUS
from wattflex.runs.emulator import PHYSICS, power_model_clock_for_cap, voltage

from tests.conftest import REPO

CONFIG = REPO / "config" / "config.yaml"
DENSE = ("dense-ft-mistral24b-x8", "dense-pt-mistral24b-x8", "dense-pt-qwen32b-x8-compile",
         "h100-dense-ft-mistral24b-x8", "dense-ft-llama70b-x8-compile")


@pytest.fixture(scope="module")
def sweeps(tmp_path_factory):
    """Noise-free emulated sweeps of five dense groups made with anchor 1755 MHz, as a CSV."""
    groups = [g for g in cal.config_group_models(load_config(CONFIG)) if g.id in DENSE]
    truth = cal.physics_at_anchor(1755.0)
    rows = []
    for g in groups:
        power, tput = fid.noise_free_curve(g, truth)
        rows += [{"group": g.id, "cap_w": c, "power_w": p, "throughput": t} for c, p, t in zip(g.caps, power, tput)]
    path = tmp_path_factory.mktemp("cal") / "sweeps.csv"
    pd.DataFrame(rows).to_csv(path, index=False)
    return path


def test_calibrate_recovers_the_anchor_of_the_sweeps_and_writes_a_file(sweeps, tmp_path, capsys):
    out = tmp_path / "mine.json"
    assert main(["calibrate", "--runs", str(sweeps), "--holdout", "dense-pt-qwen32b-x8-compile",
                 "-o", str(out)]) == 0
    text = capsys.readouterr().out
    assert text.startswith("anchor 1755 MHz (fitted (sweeps.csv), 4 groups)")
    assert "holdout mean |PFI error| 0.000" in text and "out (holdout)" in text
    c = cal.read_calibration(out)
    assert c.anchor_clock_mhz == 1755.0 and "dense-pt-qwen32b-x8-compile" not in c.fit_groups
    assert c.curve.sm_dyn_w == pytest.approx(cal.fit_power_curve(1755.0).sm_dyn_w)


def test_calibrate_on_the_papers_default_set_gives_the_emulators_anchor(capsys):
    assert main(["calibrate", "--published", cal.DEFAULT_FIT_SET]) == 0
    assert capsys.readouterr().out.startswith(f"anchor {PHYSICS.anchor_clock_mhz:.0f} MHz (fitted (tables7-8-dense), 5")


def test_groups_the_config_does_not_define_are_a_one_line_error(tmp_path, capsys):
    path = tmp_path / "other.csv"
    pd.DataFrame({"group": ["gpt3-xl"] * 2, "cap_w": [200, 300], "power_w": [800, 1100],
                  "throughput": [1.0, 1.2]}).to_csv(path, index=False)
    assert main(["calibrate", "--runs", str(path)]) == 2
    err = capsys.readouterr().err
    assert "group(s) gpt3-xl are not groups of --config" in err and "add them to the config's groups" in err


def test_the_perseus_a100_sweeps_cannot_calibrate_a_hopper_emulator(tmp_path, capsys):
    """The Perseus (SOSP'24) A100/A40 power-limit sweeps shipped in resources/external: ingested
    as a user's would be, then refused with the reason (no A100 in the catalogue)."""
    runs = tmp_path / "runs.parquet"
    assert main(["ingest", "perseus-sosp24", str(REPO / "resources" / "external" / "perseus-sosp24"),
                 "-o", str(runs)]) == 0
    capsys.readouterr()
    assert main(["calibrate", "--runs", str(runs)]) == 2
    err = capsys.readouterr().err
    assert "runs on A100, A40; the emulator models H200, H100 only" in err


def _gemm_reading(anchor_mhz: float, activity: float, gpu: str = "H200") -> dict:
    """What the GPU check would read from a GEMM of ``activity`` on a GPU whose anchor is ``anchor_mhz``."""
    ph = cal.physics_at_anchor(anchor_mhz)
    spec = GPUS[gpu]
    clock = power_model_clock_for_cap(spec, 700, tensor_util=activity, dram_util=ph.calib_dram_util, physics=ph)
    x = clock / spec.sm_clock_max_mhz
    power = (spec.idle_w + spec.mem_dyn_w * ph.calib_dram_util
             + ph.sm_dyn_w * x * voltage(x, ph) ** 2 * (ph.sm_busy_weight + ph.tensor_weight * activity))
    return {"sm_clock_mhz": clock, "power_w": float(power), "power_limit_w": 700.0, "tensor_activity": activity,
            "gpu_model": gpu}


def test_a_gpu_check_anchor_gemm_reading_gives_the_anchor_back(tmp_path, capsys):
    path = tmp_path / "gpu_check.json"
    path.write_text(json.dumps({"steps": {"anchor_gemm": _gemm_reading(1740.0, 0.62)}}))
    assert main(["calibrate", "--gpu-check", str(path), "-o", str(tmp_path / "c.json")]) == 0
    c = cal.read_calibration(tmp_path / "c.json")
    assert abs(c.anchor_clock_mhz - 1740.0) <= 15 and c.source.startswith("measured (")
    assert capsys.readouterr().out.startswith("anchor ")


def test_a_gemm_that_never_reached_the_limit_is_no_calibration(tmp_path, capsys):
    reading = {**_gemm_reading(1740.0, 0.62), "power_w": 540.0}
    path = tmp_path / "gpu_check.json"
    path.write_text(json.dumps({"steps": {"anchor_gemm": reading}}))
    assert main(["calibrate", "--gpu-check", str(path)]) == 2
    assert "the limit did not bind" in capsys.readouterr().err
    path.write_text(json.dumps({"steps": {}}))
    assert main(["calibrate", "--gpu-check", str(path)]) == 2
    assert "no steps.anchor_gemm reading" in capsys.readouterr().err
