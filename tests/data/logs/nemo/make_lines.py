"""Runs NeMo's own progress callbacks (nemo_toolkit 2.7.3: nemo/lightning/pytorch/callbacks/
progress_bar.py MegatronProgressBar, progress_printer.py ProgressPrinter, loaded from the wheel's
files) in a real Lightning 2.6.6 Trainer on CPU: 6 steps, validation every 3 (2 batches).
The module logs the progress-bar metrics NeMo's MegatronStrategy / MegatronDataSampler /
TimingCallback log (same names, prog_bar=True), with fixed values so the lines are predictable.
usage: make_lines.py NEMO_CALLBACKS_DIR bar|printer"""

import importlib.util
import sys

import lightning.pytorch as pl
import torch
from lightning.pytorch.strategies import SingleDeviceStrategy


def load(name):
    spec = importlib.util.spec_from_file_location(name, f"{sys.argv[1]}/{name}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


class Strategy(SingleDeviceStrategy):
    @property
    def current_epoch_step(self):  # MegatronStrategy.current_epoch_step (megatron_strategy.py)
        trainer = self.lightning_module.trainer  # MegatronStrategy keeps its own reference
        return max(
            trainer.fit_loop.epoch_loop.automatic_optimization.optim_progress.optimizer.step.current.completed,
            trainer.fit_loop.epoch_loop.manual_optimization.optim_step_progress.current.completed,
        )


class Tiny(pl.LightningModule):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(4, 1)

    def training_step(self, batch, i):
        loss = self.lin(batch).pow(2).mean()
        step = self.trainer.global_step
        for name, value in [
            ("consumed_samples", 8.0 * (step + 1)),
            ("global_batch_size", 8.0),
            ("global_step", float(step)),
            ("reduced_train_loss", 2.0 - 0.125 * step),
            ("train_step_timing in s", 0.25 + 0.125 * (step % 2)),
        ]:
            self.log(name, torch.tensor(value), prog_bar=True, batch_size=1)
        return loss

    def validation_step(self, batch, i):
        self.log("val_loss", torch.tensor(1.5), prog_bar=True, batch_size=1)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.01)

    def train_dataloader(self):
        return torch.utils.data.DataLoader(torch.randn(64, 4), batch_size=8)

    def val_dataloader(self):
        return torch.utils.data.DataLoader(torch.randn(16, 4), batch_size=8)


if sys.argv[2] == "bar":
    callback = load("progress_bar").MegatronProgressBar()
else:
    printer = load("progress_printer")
    printer.get_num_microbatches = lambda: 1  # megatron.core's, one microbatch per step
    callback = printer.ProgressPrinter()
torch.manual_seed(0)
trainer = pl.Trainer(
    max_steps=6,
    val_check_interval=3,
    limit_val_batches=2,
    num_sanity_val_steps=0,
    callbacks=[callback],
    strategy=Strategy(device="cpu"),
    logger=False,
    enable_checkpointing=False,
    enable_model_summary=False,
)
trainer.fit(Tiny())
