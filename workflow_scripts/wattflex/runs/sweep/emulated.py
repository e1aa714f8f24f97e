"""The emulated one-run sweep: an emulated training run steered by the sweep controller
(``wattflex.runs.sweep.algorithm``) while it runs, and the run directory it leaves.

Nothing here drives real GPUs: the cuda backend's sweep is ``wattflex.runs.sweep.real``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from wattflex.gpus import DEFAULT_GPU, GPUS
from wattflex.runs.emulator.device import EmulatedDevice, run_emulated
from wattflex.runs.runner import atomic_run_dir, write_run_files
from wattflex.runs.spec import RunSpec
from wattflex.runs.sweep.algorithm import run_controller, separate_sweep_seconds, sweep_record
from wattflex.telemetry import job_series


class EmulatedRun:
    """An emulated training run that the controller steers while it runs.

    The emulator simulates a whole trace from a cap schedule; here the schedule grows as
    the controller sets caps at ``now_s``. After each change the run is re-simulated from
    the new schedule (same seeds: per-run factors, silicon and step noise are unchanged),
    and only the part after the change is taken from it: everything revealed before stays
    as it was seen. Telemetry settles after a change with the emulator's transient.
    """

    def __init__(self, spec: RunSpec | Mapping[str, Any], max_duration_s: float) -> None:
        spec = RunSpec.of(spec, backend="emulated")
        self.spec = spec.with_duration(float(max_duration_s))
        self.max_duration_s = float(max_duration_s)
        self.poll_s = spec.sample_period_s
        self.now_s = 0.0
        self.stopped_s: float | None = None
        run = self

        class Device(EmulatedDevice):
            """The virtual GPUs' power-limit interface; a change takes effect at ``now_s``."""

            def set_cap(self, cap_w: float) -> float:
                enforced = super().set_cap(cap_w)
                run._on_cap(self.limit_w)
                return enforced

            def restore(self) -> None:
                super().restore()
                run._on_cap(self.limit_w)

        self.device = Device(GPUS[spec.group.get("gpu", DEFAULT_GPU)])
        self._schedule: list[tuple[float, float]] = [(0.0, float(self.device.limit_w))]
        self._frozen: list[
            tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame]
        ] = []  # (tel, steps, series)
        self._frozen_until = 0.0
        self._sim: tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame, dict[str, Any]] | None = None
        self._cache: dict[str, Any] = {}

    # -- the controller's view ------------------------------------------------------------
    def advance(self, dt_s: float) -> None:
        """Let ``dt_s`` s pass (never past the run's maximum duration).

        Raises RuntimeError once the run has stopped.
        """
        if self.stopped_s is not None:
            raise RuntimeError("the run has stopped")
        self.now_s = min(self.now_s + float(dt_s), self.max_duration_s)

    def series(self) -> pd.DataFrame:
        """The emulated job-level telemetry up to now (emulated, never measured)."""
        return self._revealed()[2]

    def steps(self) -> pd.DataFrame:
        """The emulated step log up to now."""
        return self._revealed()[1]

    def stop(self) -> None:
        """End the run now (the emulated trace ends here)."""
        if self.stopped_s is None:
            self.stopped_s = self.now_s

    # -- the record -----------------------------------------------------------------------
    def artifacts(self) -> tuple[pd.DataFrame, pd.DataFrame, dict[str, Any]]:
        """Telemetry, step log and run facts of what ran, up to the stop."""
        tel, steps, _ = self._revealed()
        tel = tel.sort_values(["t_s", "node", "gpu"]).reset_index(drop=True)
        dt = (
            np.diff(np.r_[0.0, np.unique(tel["t_s"].to_numpy())]).mean()
            if len(tel)
            else self.poll_s
        )
        tel["energy_j"] = (
            tel.groupby(["node", "gpu"])["power_w"].cumsum() * dt
        )  # continuous across splices
        facts = dict(self._current()[3])
        end = self.now_s
        facts["cap_schedule"] = [{"t_s": t, "cap_w": c} for t, c in self._schedule if t <= end]
        facts["events"] = [e for e in facts.get("events", []) if e["t_s"] < end]
        facts["n_steps"] = int(len(steps))
        facts["duration_s"] = end
        for k in ("enforced_limit_w", "model_tokens_per_s", "model_power_w"):
            facts[k] = facts.get(k, [])[: len(facts["cap_schedule"])]
        facts["limit_restored_w"] = float(self.device.limit_w)
        return tel, steps.reset_index(drop=True), facts

    # -- machinery ------------------------------------------------------------------------
    def _on_cap(self, cap_w: float) -> None:
        if self._schedule[-1][1] == cap_w:
            return
        if self.now_s > self._frozen_until:
            tel, steps, series = self._window(self._current(), self._frozen_until, self.now_s)
            self._frozen.append((tel, steps, series))
            self._frozen_until = self.now_s
        self._schedule = [(t, c) for t, c in self._schedule if t < self.now_s] + [
            (self.now_s, float(cap_w))
        ]
        self._sim, self._cache = None, {}

    def _current(self) -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame, dict[str, Any]]:
        if self._sim is None:
            tel, steps, facts = run_emulated(replace(self.spec, cap_schedule=self._schedule))
            self._sim = (tel, steps, job_series(tel), facts)
        return self._sim

    @staticmethod
    def _window(
        sim: tuple, t0: float, t1: float
    ) -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame]:
        tel, steps, series = sim[0], sim[1], sim[2]
        return (
            tel[(tel["t_s"] > t0) & (tel["t_s"] <= t1)],
            steps[(steps["t_end_s"] > t0) & (steps["t_end_s"] <= t1)],
            series[(series["t_s"] > t0) & (series["t_s"] <= t1)],
        )

    def _revealed(self) -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame]:
        end = self.now_s if self.stopped_s is None else self.stopped_s
        if self._cache.get("t") != end:
            parts = self._frozen + [self._window(self._current(), self._frozen_until, end)]
            self._cache = {
                "t": end,
                "data": tuple(
                    pd.concat([p[i] for p in parts], ignore_index=True) for i in range(3)
                ),
            }
        return self._cache["data"]


def run_sweep(
    spec: RunSpec | Mapping[str, Any],
) -> tuple[pd.DataFrame, pd.DataFrame, dict[str, Any]]:
    """Run one group's whole emulated sweep in one run: telemetry, step log and the run
    record (run facts + the controller's visits)."""
    spec = _emulated(spec)
    caps = [float(c) for c in spec.caps]
    run = EmulatedRun(spec, max_duration_s=separate_sweep_seconds(spec))
    result = run_controller(run, spec, caps, separate_sweep_seconds(spec))
    tel, steps, facts = run.artifacts()
    record = {
        **facts,
        **sweep_record(spec, result),
        "original_limit_w": float(run.device.original_limit_w),
    }
    return tel, steps, record


def write_sweep_run(spec: RunSpec | Mapping[str, Any], outdir: str | Path) -> Path:
    """``run_sweep`` and its files (telemetry.parquet, steps.parquet, run.json) written
    atomically into ``outdir`` (``runner.atomic_run_dir``)."""
    spec = _emulated(spec)
    with atomic_run_dir(outdir) as tmp:
        tel, steps, record = run_sweep(spec)
        write_run_files(tmp, spec, tel, steps, record, cap_w=max(spec.caps), repeat=0)
    return Path(outdir)


def _emulated(spec: RunSpec | Mapping[str, Any]) -> RunSpec:
    """``spec`` parsed (a dict without a backend is emulated); the cuda backend refused."""
    spec = RunSpec.of(spec, backend="emulated")
    if spec.backend == "cuda":
        raise ValueError(
            "backend cuda: a real sweep runs through wattflex.runs.sweep.real.write_real_sweep_run"
        )
    return spec
