"""Writes torchtitan's own metrics lines (MetricsProcessor.log and .log_validation of the
torchtitan 0.3.0 wheel, its logger's format from init_logger) for a short run: steps 1-5,
validation at step 5, steps 6-7; each step 8,192 tokens on a clock advanced by hand.
usage: PYTHONPATH=<torchtitan 0.3.0 wheel, unpacked> make_lines.py color|plain"""

import importlib.abc
import importlib.machinery
import sys
from unittest import mock

# torchtitan's import-time dependencies that the metrics code does not use here.
STUB = (
    "tyro",
    "tensorboard",
    "spmd_types",
    "torchdata",
    "torch_checkpointing",
    "wandb",
    "einops",
    "datasets",
    "tokenizers",
)


class Stubs(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, name, path, target=None):
        if name.split(".")[0] in STUB or name.startswith("torch.utils.tensorboard"):
            return importlib.machinery.ModuleSpec(name, self, is_package=True)

    def create_module(self, spec):
        m = mock.MagicMock(name=spec.name)
        m.__path__ = []
        m.__spec__ = spec
        return m

    def exec_module(self, module):
        pass


sys.meta_path.insert(0, Stubs())

import torchtitan.components.metrics as metrics
from torchtitan.tools.logging import init_logger

color = sys.argv[1] == "color"


class Memory:  # an H100's peak stats (no GPU here)
    device_name = "NVIDIA H100 80GB HBM3"

    def get_peak_stats(self):
        return metrics.DeviceMemStats(40.1, 50.7, 45.3, 57.21, 0, 0)

    def reset_peak_stats(self):
        pass


clock = [1000.0]
metrics.time = mock.Mock(perf_counter=lambda: clock[0])
metrics.build_device_memory_monitor = Memory
init_logger()
proc = metrics.MetricsProcessor(
    metrics.MetricsProcessor.Config(disable_color_printing=not color, log_freq=1),
    parallel_dims=mock.Mock(non_data_parallel_size=1),
)
proc.num_flops_per_token = 6 * 8_000_000_000
for step, secs, loss in [
    (1, 2.0, 10.5),
    (2, 1.1, 9.8),
    (3, 1.12, 9.1),
    (4, 1.09, 8.61),
    (5, 1.1, 8.2),
    ("val", 0.5, 8.4),
    (6, 1.13, 7.95),
    (7, 1.1, 7.7),
]:
    clock[0] += secs
    proc.ntokens_since_last_log = 8192 if step != "val" else 4096
    proc.data_loading_times = [0.01]
    if step == "val":
        proc.log_validation(loss=loss, step=5)
    else:
        proc.log(step, loss, loss + 0.3, 1.25)
