"""The training harness and gpt-oss checkpoints: MXFP4 ones are dequantised explicitly. (Sharded
construction, in real 2-process torchrun jobs: tests/workflow/torchrun/test_training_sharded.py.)
"""

from pathlib import Path

import pytest
import yaml

from wattflex.runs.training import models

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/unit/runs/conftest.py
REPO = Path(__file__).resolve().parents[4]
CATALOG = yaml.safe_load((REPO / "config" / "models.yaml").read_text())["models"]


# ---- gpt-oss checkpoints (no processes) ---------------------------------------------------------
def test_mxfp4_checkpoints_are_dequantised_explicitly():
    from transformers import Mxfp4Config

    cfg = models.hf_config(CATALOG["gpt-oss-20b"], tiny=True)
    assert models.quantization_kwargs(cfg) == {}                    # a bf16 checkpoint: nothing passed
    cfg.quantization_config = {"quant_method": "mxfp4", "modules_to_not_convert": ["model.layers.*.self_attn"]}
    kw = models.quantization_kwargs(cfg)
    assert isinstance(kw["quantization_config"], Mxfp4Config) and kw["quantization_config"].dequantize
    cfg.quantization_config = {"quant_method": "fp8"}               # other schemes: transformers' own handling
    assert models.quantization_kwargs(cfg) == {}
