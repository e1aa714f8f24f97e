"""The GPU catalogue is the one place a GPU model is defined: config validation, the default,
SLURM names and peak rates all come from it."""

from pathlib import Path

import pytest

from wattflex.config import ConfigError, check_semantics
from wattflex.gpus import DEFAULT_GPU, GPUS, gpu_spec, peak_bf16_flops

REPO = Path(__file__).resolve().parents[2]


def test_the_schema_states_no_gpu_names_the_catalogue_fills_and_checks_them():
    schema = (REPO / "config" / "schema" / "config.schema.yaml").read_text()
    assert not [name for name in GPUS if name in schema]
    from wattflex.config import groups, prepare

    cfg = {
        "campaign": "c",
        "cap_grids": {"four": [200, 500, 600, 700]},
        "groups": [{"id": "g", "model": "Qwen3-32B", "task": "pt", "gpus": 8, "cap_grid": "four"}],
    }
    assert DEFAULT_GPU in GPUS and groups(prepare(cfg, base=REPO))[0]["gpu"] == DEFAULT_GPU


def test_every_entry_is_physically_consistent():
    for name, gpu in GPUS.items():
        assert gpu.name == name and gpu.slurm_name
        assert 0 < gpu.min_limit_w < gpu.default_limit_w <= gpu.max_limit_w
        assert 0 < gpu.sm_clock_min_mhz < gpu.sm_clock_max_mhz
        assert gpu.mem_idle_w < gpu.idle_w
        assert peak_bf16_flops(f"NVIDIA {name}") == pytest.approx(
            gpu.peak_bf16_tflops * 1e12, rel=1e-3
        )


def test_an_unknown_gpu_is_named_with_the_known_ones():
    with pytest.raises(KeyError, match="unknown GPU model 'H300'; known: H200, H100"):
        gpu_spec("H300")


def test_a_config_cap_is_checked_against_the_catalogue_limits(default_config):
    cfg = {**default_config, "groups": [dict(default_config["groups"][0], caps=[150, 700])]}
    gpu = GPUS[cfg["groups"][0].get("gpu", DEFAULT_GPU)]
    with pytest.raises(
        ConfigError,
        match=rf"cap 150 W is outside the {gpu.name}'s power-limit range "
        rf"{gpu.min_limit_w:g}-{gpu.max_limit_w:g} W",
    ):
        check_semantics(cfg)
