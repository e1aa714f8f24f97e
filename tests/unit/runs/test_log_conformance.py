"""The throughput presets against lines the frameworks' own code wrote (tests/data/logs/<framework>/,
README.md there names each upstream file and version), read as a command run reads its log
(wattflex.runs.command_run.LineFollower): torchtitan's default coloured line, evaluation never
a step (torchtitan's validate line, Megatron-LM's validation and test-set blocks, the HF
Trainer's and Lightning's evaluation bars), a bar's redraw no new step, and both of NeMo's
progress callbacks. The HF Trainer is really run here."""

import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from wattflex.runs.command_run import LineFollower
from wattflex.runs.throughput import ThroughputSource

LOGS = Path(__file__).resolve().parents[2] / "data" / "logs"


def followed(path, **spec):
    """(step, tokens/s, loss) of each step the command backend's follower finds in ``path``."""
    src = ThroughputSource.from_spec(
        spec, **{k: spec.pop(k) for k in ("seq_len", "gpus") if k in spec}
    )
    follower = LineFollower(path, src, time.time()).start()
    follower.stop()
    return [hit for _, *hit in follower.rows]


TORCHTITAN_TPS = [
    4096,
    7447,
    7314,
    7516,
    7447,
    7250,
    7447,
]  # steps 1-7; "validate step: 5" has 8,192


@pytest.mark.parametrize("name", ["metrics_color.log", "metrics_plain.log"])
def test_torchtitan_default_coloured_line_parses_and_validation_is_no_step(name):
    rows = followed(LOGS / "torchtitan" / name, preset="torchtitan", gpus=2)
    assert [r[0] for r in rows] == [1, 2, 3, 4, 5, 6, 7]
    assert [r[1] for r in rows] == [2 * t for t in TORCHTITAN_TPS]
    assert rows[4][2] == pytest.approx(8.2) and rows[5][2] == pytest.approx(7.95)


# Megatron-LM's training_log lines in megatron/training_log.log: --log-interval 2 and the first
# iteration; the line's time is the mean over the iterations since the last line, and the first
# line does not reset it, so iteration 2's mean holds iteration 1's 9.0 s (make_lines.py STEP_S).
MEGATRON_MS = {1: 9000.0, 2: 6750.0, 4: 4500.0, 6: 4550.0, 8: 4500.0}
MEGATRON_LOSS = [11.9, (11.9 + 10.8) / 2, (9.7 + 8.9) / 2, (8.1 + 7.6) / 2, (7.2 + 6.9) / 2]


def test_megatron_training_log_lines_are_the_steps_and_validation_and_test_are_not():
    """Global batch 32 x sequence 8192 tokens per iteration over the logged mean iteration time;
    the validation blocks (eval interval 4, and the validation and test sets after training),
    the evaluate timer, the memory reports and "Evaluating iter 1/2" are no steps."""
    log = LOGS / "megatron" / "training_log.log"
    rows = followed(log, preset="megatron", seq_len=8192)
    assert [r[0] for r in rows] == list(MEGATRON_MS)
    assert [r[1] for r in rows] == pytest.approx(
        [32 * 8192 / (ms / 1000) for ms in MEGATRON_MS.values()]
    )
    assert [r[2] for r in rows] == pytest.approx(MEGATRON_LOSS, rel=1e-6)  # float32 sums
    src = ThroughputSource.from_spec({"preset": "megatron"}, seq_len=8192)
    others = [x for x in log.read_text().splitlines() if "elapsed time per iteration" not in x]
    assert [x for x in others if src.parse(x)] == []
    validation = [x for x in others if x.startswith(" validation loss at iteration ")]
    assert len(validation) == 4 and validation[-1].startswith(
        " validation loss at iteration 8 on test set | lm loss value: "
    )
    assert sum(x.startswith("Evaluating iter ") for x in others) == 4


def test_nemo_preset_reads_both_progress_callbacks_without_validation_or_redraws():
    """ProgressPrinter's lines, and MegatronProgressBar's: the bar shows the previous step's
    metrics, and after each validation (its own bar, one row down) it is redrawn at the same
    count (3/6, 6/6), which is no step."""
    rows = followed(LOGS / "nemo" / "progress_printer.log", preset="nemo", seq_len=1024)
    assert [r[0] for r in rows] == [0, 1, 2, 3, 4, 5]
    assert [r[1] for r in rows] == pytest.approx([8 * 1024 / t for t in (0.25, 0.375) * 3])
    assert rows[2][2] == pytest.approx(1.75)
    rows = followed(LOGS / "nemo" / "megatron_progress_bar.log", preset="nemo", seq_len=1024)
    assert [r[0] for r in rows] == [0, 1, 2, 3, 4]
    assert [r[1] for r in rows] == pytest.approx(
        [8 * 1024 / t for t in (0.25, 0.375, 0.25, 0.375, 0.25)]
    )
    assert [r[2] for r in rows] == pytest.approx([2.0, 1.88, 1.75, 1.62, 1.5])


def test_hf_trainer_stored_run_training_bar_only():
    rows = followed(
        LOGS / "hf_trainer" / "trainer_eval.log", preset="hf-trainer", tokens_per_step=16
    )
    assert [r[0] for r in rows] == [1, 2, 3, 4, 5, 6]
    assert [r[1] for r in rows] == pytest.approx(
        [16 * r for r in (76.19, 18.14, 18.14, 10.52, 10.52, 10.52)]
    )


@pytest.mark.conformance  # the Trainer really run: ~15 s each (tests/tiers.py)
def test_hf_trainer_really_run_its_evaluation_bar_is_no_step(tmp_path):
    """The Trainer (default callbacks, eval every 3 of 6 steps) run now, its output to a file: the
    training bar's counts only, each once (an evaluation bar's 5/5, or a redraw, breaks the order)."""
    log = tmp_path / "trainer.log"
    with open(log, "w") as out:
        subprocess.run(
            [sys.executable, str(LOGS / "hf_trainer" / "run_trainer.py"), str(tmp_path / "out")],
            stdout=out,
            stderr=subprocess.STDOUT,
            check=True,
            timeout=120,
        )
    text = log.read_text()
    assert text.count("'eval_loss'") == 2 and text.count("0/5 [") == 2, (
        text
    )  # two evaluations, with their bar
    steps = [r[0] for r in followed(log, preset="hf-trainer", tokens_per_step=16)]
    # tqdm skips a step's draw within 0.1 s of its last one (mininterval); the last is drawn at close
    assert steps == sorted(set(steps)) and set(steps) <= {1, 2, 3, 4, 5, 6} and steps[-1] == 6, (
        log.read_text()
    )


@pytest.mark.conformance  # the Trainer really run: ~15 s each (tests/tiers.py)
def test_hf_trainer_evaluate_between_trainings_is_no_step(tmp_path):
    """train(), evaluate(), train() (run_trainer.py --evaluate-between): the prediction bar drawn on
    its own (total 5, no training bar to nest under) is never a step, in the stored run and now."""
    log = tmp_path / "trainer.log"
    with open(log, "w") as out:
        subprocess.run(
            [
                sys.executable,
                str(LOGS / "hf_trainer" / "run_trainer.py"),
                str(tmp_path / "out"),
                "--evaluate-between",
            ],
            stdout=out,
            stderr=subprocess.STDOUT,
            check=True,
            timeout=120,
        )
    for path in (LOGS / "hf_trainer" / "trainer_evaluate_between.log", log):
        text = path.read_text()
        # the prediction bar's last draw on its own: no cursor-up after it (a nested one has)
        assert re.search(r"\| 5/5 \[[^\r\n\x1b]*\](?!\x1b\[A)", text), text
        steps = [r[0] for r in followed(path, preset="hf-trainer", tokens_per_step=16)]
        first, second = steps[: steps.index(6) + 1], steps[steps.index(6) + 1 :]
        for run in (first, second):  # each training's counts, once each, ending at 6
            assert run == sorted(set(run)) and set(run) <= {1, 2, 3, 4, 5, 6} and run[-1] == 6, text
