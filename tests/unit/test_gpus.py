"""The GPU catalogue is the one place a GPU model is defined: the config schema, the default,
SLURM names and peak rates all come from it."""

from pathlib import Path

import pytest
import yaml

from wattflex.config import ConfigError, check_semantics
from wattflex.gpus import DEFAULT_GPU, GPUS, gpu_spec, peak_bf16_flops

REPO = Path(__file__).resolve().parents[2]


def test_the_schema_gpu_enum_is_the_catalogue():
    schema = yaml.safe_load((REPO / "config" / "schema" / "config.schema.yaml").read_text())
    enums = []

    def walk(node):
        if isinstance(node, dict):
            if isinstance(node.get("gpu"), dict) and "enum" in node["gpu"]:
                enums.append(node["gpu"]["enum"])
            for v in node.values():
                walk(v)
        elif isinstance(node, list):
            for v in node:
                walk(v)

    walk(schema)
    assert enums and all(e == list(GPUS) for e in enums)
    assert DEFAULT_GPU in GPUS


def test_every_entry_is_physically_consistent():
    for name, gpu in GPUS.items():
        assert gpu.name == name and gpu.slurm_name
        assert 0 < gpu.min_limit_w < gpu.default_limit_w <= gpu.max_limit_w
        assert 0 < gpu.sm_clock_min_mhz < gpu.sm_clock_max_mhz
        assert gpu.mem_idle_w < gpu.idle_w
        assert peak_bf16_flops(f"NVIDIA {name}") == pytest.approx(gpu.peak_bf16_tflops * 1e12, rel=1e-3)


def test_an_unknown_gpu_is_named_with_the_known_ones():
    with pytest.raises(KeyError, match="unknown GPU model 'H300'; known: H200, H100"):
        gpu_spec("H300")


def test_a_config_cap_is_checked_against_the_catalogue_limits(default_config):
    cfg = {**default_config, "groups": [dict(default_config["groups"][0], caps=[150, 700])]}
    gpu = GPUS[cfg["groups"][0].get("gpu", DEFAULT_GPU)]
    with pytest.raises(ConfigError, match=rf"cap 150 W is outside the {gpu.name}'s power-limit range "
                                          rf"{gpu.min_limit_w:g}-{gpu.max_limit_w:g} W"):
        check_semantics(cfg)
