"""Where a user's own training command's throughput comes from: its log lines or a steps file.

A *throughput source* (``group.command.throughput``) is one of

* ``preset``: a shipped regex for a framework's log line (``PRESETS``: torchtitan, megatron,
  nemo, hf-trainer), each tested on a real excerpt in ``tests/data/logs/`` (SOURCE.md there
  names where each comes from) and on lines the framework's own code wrote
  (``tests/data/logs/<framework>/``, README.md there names the upstream file and version);
* ``regex``: the user's own, over each line of stdout/stderr, with named groups:
  ``tokens_per_s``; or ``step_time_s`` / ``step_time_ms`` / ``steps_per_s`` with tokens per
  step (``tokens_per_step``, or a ``samples_per_step`` group or ``samples_per_step`` value
  times ``tokens_per_sample``); or ``samples_per_s`` times ``tokens_per_sample``;
  optional ``step`` and ``loss``;
* ``steps_file``: a CSV or JSONL file the job writes (``step, t_end_s, tokens``; ``t_end_s``
  in Unix seconds, ``time.time()``), relative to the run directory.

``per_gpu: true`` says the logged rate is per GPU, so it is multiplied by the group's GPUs:
torchtitan's ``tps`` is "tokens per second per device" (its MetricsProcessor divides the
rank's tokens since the last log line by the time and by the non-data-parallel degree).

A matched line becomes one step row ``step, t_end_s, tokens, loss`` (``telemetry.STEP_COLUMNS``):
``t_end_s`` is when wattflex read the line (seconds since the run's t0), and ``tokens`` the
logged rate times the time since the previous matched line, so that the steady-state code's
rate (tokens over the time between rows, ``telemetry.step_throughput``) is the rate the job
logged; the first row has no previous one and no rate (as a harness run's first step).
Eval and checkpoint pauses show up as long gaps between rows, found by the same protocol.

Lines are matched without their terminal escapes (torchtitan colours its line by default).
Evaluation is never a step: no preset matches a framework's validation line, a tqdm bar drawn
below another (the HF Trainer's and Lightning's evaluation bars) is skipped, a bar whose total is
not the training bar's is another loop (an ``evaluate()`` between trainings), and a bar redrawn
at the count it showed last (``LineReader``) is no new step.
"""

from __future__ import annotations

import io
import json
import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd

from wattflex.telemetry import STEP_COLUMNS

_NUM = r"[0-9][0-9,]*(?:\.[0-9]+)?(?:[eE][-+]?[0-9]+)?"

# Each preset: the regex and the factors the framework's line leaves to the config. A ``bar``
# group is a tqdm bar's ``n/total``: the same count again is the bar redrawn, not a new step
# (``LineReader``). Which of its framework's outputs each reads, and at which upstream version
# each is tested: tests/data/logs/<framework>/README.md.
PRESETS: dict[str, dict[str, Any]] = {
    # torchtitan's MetricsProcessor.log (torchtitan/components/metrics.py), coloured by default
    # (escapes stripped first): "step: 14  loss:  3.24405 ... tps: 7,282 ...", tps = tokens per
    # second per device. Not its log_validation line, "validate step:  5  loss: ... tps: ...".
    "torchtitan": {
        "regex": rf"(?<!validate )step:\s*(?P<step>\d+)\s+loss:\s*(?P<loss>{_NUM}).*?\btps:\s*"
        rf"(?P<tokens_per_s>{_NUM})",
        "per_gpu": True,
    },
    # Megatron-LM's training_log line (megatron/training/training.py): "iteration 71/ 100 | ...
    # elapsed time per iteration (ms): 5361.6 | ... global batch size: 128 | lm loss: 1.8E+00 |",
    # the mean over the iterations since the last line; tokens per sample = the sequence length
    # (tokens_per_sample, default group.seq_len). Not evaluate_and_print_results' "validation loss
    # at iteration 4 | lm loss value: ..." (eval interval, and the validation and test sets after
    # training), evaluate's "Evaluating iter 1/2", the timers' "(min, max) time across ranks"
    # nor the memory reports.
    "megatron": {
        "regex": rf"iteration\s+(?P<step>\d+)/\s*\d+\s*\|.*?elapsed time per iteration \(ms\):\s*"
        rf"(?P<step_time_ms>{_NUM}).*?global batch size:\s*(?P<samples_per_step>\d+)"
        rf"(?:.*?lm loss:\s*(?P<loss>{_NUM}))?"
    },
    # NeMo 2, both of its progress callbacks (nemo/lightning/pytorch/callbacks/): ProgressPrinter,
    # "Training epoch 0, iteration 120/149 | ... global_batch_size: 1 | global_step: 120 |
    # reduced_train_loss: 1.233 | train_step_timing in s: 0.03146", and MegatronProgressBar, the
    # tqdm bar "Epoch 0: :  33%|###| 2/6 [00:00<00:00, ... global_batch_size=8.000, global_step=0.000,
    # reduced_train_loss=2.000, train_step_timing in s=0.250]". Not their validation lines or bar.
    "nemo": {
        "regex": rf"(?:(?P<bar>\d+/\d+) \[.*?)?global_batch_size[:=]\s*(?P<samples_per_step>{_NUM})"
        rf"(?:.*?global_step[:=]\s*(?P<step>{_NUM}))?(?:.*?reduced_train_loss[:=]\s*(?P<loss>{_NUM}))?"
        rf".*?train_step_timing in s[:=]\s*(?P<step_time_s>{_NUM})"
    },
    # Hugging Face Trainer: its ProgressCallback's training bar, "  2/203 [00:12<16:46,  5.01s/it" or
    # "... 1.49it/s]" (updates end in \r, read as lines); tokens per step (global batch x sequence
    # length) from the config: the Trainer's own per-step log lines carry no rate. Not its
    # evaluation bar (drawn below the training bar, see NESTED_BAR).
    "hf-trainer": {
        "regex": rf"(?P<bar>(?P<step>\d+)/\d+) \[[0-9:]+<[0-9:?]+,\s*(?:(?P<steps_per_s>{_NUM})it/s|"
        rf"(?P<step_time_s>{_NUM})s/it)"
    },
}
# Terminal escapes (ECMA-48 control sequences: colours, cursor moves), removed before matching.
CSI = re.compile(r"\x1b\[[0-?]*[ -/]*[@-~]")
# A line with a cursor-up: tqdm draws a second bar (an evaluation under the training bar) one
# row down and moves back up after it; the training bar, at the top, never does.
NESTED_BAR = re.compile(r"\x1b\[[0-9]*A")
RATE_GROUPS = ("tokens_per_s", "samples_per_s", "step_time_s", "step_time_ms", "steps_per_s")


class ThroughputError(ValueError):
    """A throughput source that cannot be used: a bad spec, or a line format it cannot read."""

    pass


def _num(text: str | None) -> float:
    return float("nan") if text is None else float(text.replace(",", ""))


@dataclass(frozen=True)
class ThroughputSource:
    """A compiled throughput source (``from_spec``); ``parse(line)`` -> (step, tokens_per_s, loss) or None."""

    name: str
    regex: re.Pattern | None = None
    tokens_per_step: float | None = None
    samples_per_step: float | None = None
    tokens_per_sample: float | None = None
    gpu_factor: float = 1.0
    steps_file: str | None = None

    @classmethod
    def from_spec(
        cls,
        spec: dict[str, Any],
        where: str = "command.throughput",
        seq_len: int | None = None,
        gpus: int = 1,
    ) -> ThroughputSource:
        """The source a group's ``command.throughput`` spec describes: a preset, a regex, or a steps
        file; ``seq_len`` and ``gpus`` turn samples/s or step times into tokens/s.

        Raises ThroughputError naming ``where`` for a spec that is not exactly one of those, or
        lacks what its rate needs.
        """
        spec = dict(spec or {})
        kinds = [k for k in ("preset", "regex", "steps_file") if spec.get(k)]
        if len(kinds) != 1:
            raise ThroughputError(
                f"{where}: give exactly one of preset ({', '.join(PRESETS)}), regex or "
                f"steps_file (got {', '.join(kinds) or 'none'})"
            )
        if spec.get("steps_file"):
            return cls(name=f"steps_file {spec['steps_file']}", steps_file=str(spec["steps_file"]))
        if spec.get("preset"):
            if spec["preset"] not in PRESETS:
                raise ThroughputError(
                    f"{where}.preset: unknown preset {spec['preset']!r}; "
                    f"expected one of {', '.join(PRESETS)} (or give your own regex)"
                )
            spec = {**PRESETS[spec["preset"]], **{k: v for k, v in spec.items() if k != "regex"}}
        try:
            rx = re.compile(spec["regex"])
        except re.error as exc:
            raise ThroughputError(f"{where}.regex: not a regular expression ({exc})") from None
        groups = set(rx.groupindex)
        if not groups & set(RATE_GROUPS):
            raise ThroughputError(
                f"{where}.regex: needs a named group for the rate, one of "
                f"{', '.join(RATE_GROUPS)} (e.g. (?P<tokens_per_s>[0-9.]+))"
            )
        tps_sample = spec.get("tokens_per_sample") or seq_len
        src = cls(
            name=f"preset {spec['preset']}" if spec.get("preset") else f"regex {rx.pattern}",
            regex=rx,
            tokens_per_step=spec.get("tokens_per_step"),
            samples_per_step=spec.get("samples_per_step"),
            tokens_per_sample=tps_sample,
            gpu_factor=float(gpus) if spec.get("per_gpu") else 1.0,
        )
        per_step = groups & {"step_time_s", "step_time_ms", "steps_per_s"}
        if per_step and not (
            src.tokens_per_step
            or ((src.samples_per_step or "samples_per_step" in groups) and src.tokens_per_sample)
        ):
            raise ThroughputError(
                f"{where}: a step-time regex needs tokens per step: tokens_per_step, or "
                f"samples_per_step (value or regex group) and tokens_per_sample"
            )
        if "samples_per_s" in groups and not src.tokens_per_sample:
            raise ThroughputError(
                f"{where}: samples_per_s needs tokens_per_sample (or the group's seq_len)"
            )
        return src

    def match(self, line: str) -> re.Match | None:
        """The regex's match in ``line`` without its terminal escapes; None for a bar drawn below
        another (``NESTED_BAR``) or no match."""
        if self.regex is None or NESTED_BAR.search(line):
            return None
        return self.regex.search(CSI.sub("", line))

    def parse(self, line: str) -> tuple[float, float, float] | None:
        """(step or NaN, tokens per second of the job, loss or NaN) from one log line, or None."""
        m = self.match(line)
        return None if m is None else self.row(m)

    def row(self, m: re.Match) -> tuple[float, float, float] | None:
        """``parse``'s answer for a match (None where it carries no positive rate)."""
        g = {k: v for k, v in m.groupdict().items() if v is not None}
        per_step = self.tokens_per_step
        if per_step is None and self.tokens_per_sample:
            samples = (
                _num(g["samples_per_step"]) if "samples_per_step" in g else self.samples_per_step
            )
            per_step = samples * self.tokens_per_sample if samples else None
        if "tokens_per_s" in g:
            tps = _num(g["tokens_per_s"])
        elif "samples_per_s" in g:
            tps = _num(g["samples_per_s"]) * float(self.tokens_per_sample)
        elif "steps_per_s" in g:
            tps = _num(g["steps_per_s"]) * float(per_step)
        elif "step_time_s" in g:
            tps = float(per_step) / _num(g["step_time_s"])
        elif "step_time_ms" in g:
            tps = float(per_step) / (_num(g["step_time_ms"]) / 1000.0)
        else:
            return None
        if not math.isfinite(tps) or tps <= 0:
            return None
        return _num(g.get("step")), tps * self.gpu_factor, _num(g.get("loss"))

    def reader(self) -> LineReader:
        """A new line reader for this source (a tqdm bar's redraw is not a new step)."""
        return LineReader(self)

    def describe(self) -> dict[str, Any]:
        """The source for run.json: its name and its tokens/samples per step and GPU factor."""
        return {
            "source": self.name,
            "tokens_per_step": self.tokens_per_step,
            "samples_per_step": self.samples_per_step,
            "tokens_per_sample": self.tokens_per_sample,
            "gpu_factor": self.gpu_factor,
        }


class LineReader:
    """One log's lines read in order with ``source``: as ``source.parse``, but a bar's line with the
    count of the bar's previous line is that bar redrawn (after an evaluation, or around the
    Trainer's printed metrics), not a step of its own; and a bar whose total is not the training
    bar's (the first bar the preset reads: the HF Trainer's ``tqdm(total=max_steps)``, drawn at
    ``on_train_begin`` before any evaluation) is another loop, never a step: the Trainer's
    prediction bar ``tqdm(total=len(eval_dataloader))`` of an ``evaluate()`` between trainings,
    drawn with no training bar to nest under."""

    def __init__(self, source: ThroughputSource) -> None:
        self.source = source
        self._last_bar: str | None = None
        self._total: str | None = None

    def parse(self, line: str) -> tuple[float, float, float] | None:
        """``source.parse`` of ``line`` as the next line of the log (None: not a step)."""
        m = self.source.match(line)
        if m is None:
            return None
        bar = m.groupdict().get("bar")
        if bar is not None:
            total = bar.rsplit("/", 1)[1]
            if self._total is None:
                self._total = total
            if total != self._total or bar == self._last_bar:
                return None
            self._last_bar = bar
        return self.source.row(m)


def steps_from_lines(rows: list[tuple[float, float, float, float]]) -> pd.DataFrame:
    """Step rows from matched lines ``(t_s, step, tokens_per_s, loss)`` (module docstring).
    Lines read at the same time (they arrived together: one read of the log) are one row,
    at the harmonic mean of their rates (each line covers as many tokens: the rate over
    their whole time) with the last one's step and loss; their own times are not known."""
    merged: list[list[Any]] = []
    for t_s, step, tps, loss in rows:
        if merged and merged[-1][0] == t_s:
            merged[-1][1:4] = [step, merged[-1][2] + [tps], loss]
        else:
            merged.append([t_s, step, [tps], loss])
    out = []
    for k, (t_s, step, rates, loss) in enumerate(merged):
        tps = len(rates) / sum(1.0 / r for r in rates)
        dt = t_s - merged[k - 1][0] if k else float("nan")
        out.append(
            {
                "step": step if math.isfinite(step) else k + 1,
                "t_end_s": t_s,
                "tokens": tps * dt if k else float("nan"),
                "loss": loss,
            }
        )
    return pd.DataFrame(out, columns=STEP_COLUMNS).astype(float)


def read_steps_file(path: str | Path, t0: float) -> pd.DataFrame:
    """A job's own steps file (CSV, or JSONL when it ends in .jsonl/.json): ``step, t_end_s
    (Unix seconds), tokens[, loss]``, on the run's clock (minus ``t0``)."""
    path = Path(path)
    text = path.read_text()
    text = text[: text.rfind("\n") + 1]  # a half-written last line is not a step yet
    if path.suffix in (".jsonl", ".json"):
        frame = pd.DataFrame([json.loads(s) for s in text.splitlines() if s.strip()])
    else:
        frame = pd.read_csv(io.StringIO(text)) if text.strip() else pd.DataFrame()
    missing = [c for c in ("step", "t_end_s", "tokens") if c not in frame.columns]
    if missing:
        raise ThroughputError(
            f"steps file {path}: missing column(s) {', '.join(missing)}; expected "
            f"step, t_end_s (Unix seconds), tokens[, loss]"
        )
    frame = frame.assign(t_end_s=frame["t_end_s"].astype(float) - t0)
    if "loss" not in frame:
        frame["loss"] = float("nan")
    return frame[STEP_COLUMNS].astype(float).reset_index(drop=True)
