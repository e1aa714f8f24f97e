"""One run's spec, parsed once: ``RunSpec``.

``wattflex.config.run_spec`` builds a run's spec as a JSON-able dict: the ``run_at_cap``
rule's params, the file ``wattflex run-at-cap SPEC.json`` reads. ``RunSpec.of`` parses it once
where a run starts (``runs.runner.run_at_cap``; ``real_run.run_real`` and
``command_run.run_command`` when called on their own); everything below it reads the fields.

| field | from the dict | parsed by |
|:--|:--|:--|
| ``options`` | ``cuda``, ``run``, ``group.gpus`` | ``real_run.RunOptions.from_spec`` (cuda) |
| ``train`` | ``group``, ``run``, ``cuda``, ``model_facts``, ``seed`` | ``TrainConfig.from_spec`` (cuda, no command) |
| ``steady`` | ``staircase`` (one-run sweep) | ``sweep.steady.SteadyCriteria.from_config`` |
| ``sweep_settings`` | ``staircase`` (one-run sweep) | ``sweep.steady.SweepSettings.from_config`` |
| ``phases`` | ``phases`` (one-run sweep) | ``telemetry.SummaryProtocol.from_config`` |
| the rest | the keys of the same name | this module |

``raw`` is the dict itself: it goes unchanged into run.json and the provenance, and into
``spec.json`` for the node agents of a multi-node run, each of which parses it once again
(another process). ``train`` is built with ``outdir`` ``.``; ``train_config(outdir)`` gives
the one a run writes.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from wattflex.schema import section_defaults

if TYPE_CHECKING:
    from wattflex.runs.options import RunOptions
    from wattflex.runs.sweep.steady import SteadyCriteria, SweepSettings
    from wattflex.runs.training.train_config import TrainConfig
    from wattflex.telemetry import SummaryProtocol

BACKENDS = ("emulated", "cuda")
ONE_RUN_SWEEPS = ("staircase", "adaptive")  # sweep: the modes run as one run (wattflex.runs.sweep)
_TOP = section_defaults()  # the campaign's top-level defaults (seed, sweep)
_RUN = section_defaults("run")


@dataclass(frozen=True)
class RunSpec:
    """A run spec's fields, typed; ``options`` and ``train`` only on the cuda backend."""

    raw: Mapping[str, Any]
    backend: str
    run_id: str | None
    campaign: str | None
    cap_w: float | None  # as given (a JSON number): run.json repeats it
    repeat: int | None
    seed: int
    group: Mapping[str, Any]
    model_facts: Mapping[str, Any]
    run: Mapping[str, Any]
    command: Mapping[str, Any] | None  # group.command: the group's own training command
    calibration: Any  # emulator.calibration: the calibration's JSON
    cap_schedule: list[Any] | None  # emulated cap steps [(t_s, cap_w), ...] of a sweep
    sweep: str  # separate (one run per cap) | a one-run sweep's name
    clock_mhz: float | None = None  # a clock group's SM clock, as given: run.json repeats it
    options: RunOptions | None = None
    train: TrainConfig | None = None
    # a one-run sweep's (sweep: staircase | adaptive) cap grid, as given, and controller
    caps: list[Any] | None = None
    steady: SteadyCriteria | None = None
    sweep_settings: SweepSettings | None = None
    phases: SummaryProtocol | None = None

    @classmethod
    def of(cls, spec: RunSpec | Mapping[str, Any], backend: str | None = "cuda") -> RunSpec:
        """``spec`` parsed (a ``RunSpec`` as it is); ``backend``: the one a dict without a
        ``backend`` key is for (the entry point's own)."""
        if isinstance(spec, RunSpec):
            return spec
        backend = spec.get("backend", backend)
        if backend not in BACKENDS:
            raise ValueError(f"unknown backend {backend!r} (emulated | cuda)")
        group = spec.get("group") or {}
        options = train = None
        if backend == "cuda":
            # Imported here: an emulated run (one job each) never loads the real backend.
            from wattflex.runs.options import RunOptions
            from wattflex.runs.training.train_config import TrainConfig

            options = RunOptions.from_spec(spec)
            if not group.get("command"):
                train = TrainConfig.from_spec(spec, ".")
        sweep = str(spec.get("sweep", _TOP["sweep"]))
        return cls(
            raw=spec,
            backend=backend,
            run_id=spec.get("run_id"),
            campaign=spec.get("campaign"),
            cap_w=spec.get("cap_w"),
            repeat=spec.get("repeat"),
            seed=int(spec.get("seed", _TOP["seed"])),
            group=group,
            model_facts=spec.get("model_facts") or {},
            run=spec.get("run") or {},
            command=group.get("command"),
            calibration=(spec.get("emulator") or {}).get("calibration"),
            cap_schedule=spec.get("cap_schedule"),
            sweep=sweep,
            clock_mhz=spec.get("clock_mhz"),
            options=options,
            train=train,
            **(_one_run_sweep(spec) if sweep in ONE_RUN_SWEEPS else {}),
        )

    @property
    def group_id(self) -> str | None:
        """The group's id, None when the spec's group has none."""
        return self.group.get("id")

    @property
    def duration_s(self) -> float:
        """``run.duration_s`` (0 when absent)."""
        return float(self.run.get("duration_s", 0))

    @property
    def sample_period_s(self) -> float:
        """``run.sample_period_s`` (the schema's default when absent)."""
        return float(self.run.get("sample_period_s", _RUN["sample_period_s"]))

    @property
    def clock_fields(self) -> dict[str, Any]:
        """run.json's knob fields of a clock run (``knob: clock``); none for a cap run."""
        return {} if self.clock_mhz is None else {"knob": "clock", "clock_mhz": self.clock_mhz}

    def train_config(self, outdir: str | Path) -> TrainConfig:
        """The training job of this run, writing into ``outdir``."""
        if self.train is None:
            raise ValueError(
                f"run {self.run_id}: no training job to configure "
                f"({'the group runs its own command' if self.command else f'backend {self.backend}'})"
            )
        return dataclasses.replace(self.train, outdir=str(outdir))

    def with_duration(self, duration_s: float) -> RunSpec:
        """This spec with ``run.duration_s`` replaced (the one-run sweep trains as long as the
        separate sweep would); ``raw`` too, as run.json records it."""
        run = {**self.run, "duration_s": duration_s}
        train = (
            None
            if self.train is None
            else dataclasses.replace(self.train, duration_s=float(duration_s))
        )
        return dataclasses.replace(self, raw={**self.raw, "run": run}, run=run, train=train)


def _one_run_sweep(spec: Mapping[str, Any]) -> dict[str, Any]:
    """The fields of a one-run sweep's spec (``sweep.algorithm.sweep_spec``): the cap grid, and
    the controller's settings from ``staircase`` and ``phases``. Imported here: a run of a
    separate sweep (one job each) never loads the controller."""
    from wattflex.runs.sweep.steady import SteadyCriteria, SweepSettings
    from wattflex.telemetry import SummaryProtocol

    return {
        "caps": spec.get("caps"),
        "steady": SteadyCriteria.from_config(spec.get("staircase")),
        "sweep_settings": SweepSettings.from_config(spec.get("staircase")),
        "phases": SummaryProtocol.from_config(spec.get("phases")),
    }
