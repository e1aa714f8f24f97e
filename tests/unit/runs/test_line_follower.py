"""wattflex.runs.command_run.LineFollower's live step log, which the one-run sweep of a command
reads while the job trains: a job logging faster than the follower polls train.log."""

import time

import numpy as np
import pandas as pd

from wattflex.runs.command_run import FOLLOW_POLL_S, LineFollower
from wattflex.runs.sweep.real import read_live_steps
from wattflex.runs.sweep.steady import step_table
from wattflex.runs.throughput import ThroughputSource

LINE = (
    "[titan] 2026-12-02 19:45:57,670 - root - INFO - step: {step:2d}  loss:  6.4241  memory:  0.00GiB(0.00%)  "
    "tps: 5,740  tflops: 0.0057  mfu: 0.00%\n"
)


def follow_bursts(tmp_path, bursts: int, per_burst: int) -> LineFollower:
    """Lines written ``per_burst`` at a time, 3 polls apart: the follower reads each burst at once."""
    log, live = tmp_path / "train.log", tmp_path / "steps.live.csv"
    follower = LineFollower(
        log, ThroughputSource.from_spec({"preset": "torchtitan"}, seq_len=64), time.time(), live
    ).start()
    step = 0
    with open(log, "a") as f:
        for _ in range(bursts):
            for _ in range(per_burst):
                step += 1
                f.write(LINE.format(step=step))
            f.flush()
            time.sleep(3 * FOLLOW_POLL_S)
    follower.stop()
    return follower


def test_lines_read_together_are_one_live_row_as_in_the_final_steps(tmp_path):
    follower = follow_bursts(tmp_path, bursts=5, per_burst=4)
    assert len(follower.rows) == 20
    live = read_live_steps(tmp_path / "steps.live.csv")
    final = follower.steps()
    assert len(live) == len(final) == 5 and live["step"].tolist() == [4, 8, 12, 16, 20]
    pd.testing.assert_frame_equal(live, final, check_dtype=False)


def test_the_staircase_sees_every_step_of_a_fast_logging_job(tmp_path):
    """Before: a row per line, so lines of one read had one time, the median step took 0 s and
    every real step counted as a stall: the staircase saw no step and each visit ran to its
    max_dwell ("too_few_steps")."""
    follow_bursts(tmp_path, bursts=6, per_burst=5)
    table = step_table(read_live_steps(tmp_path / "steps.live.csv"))
    later = table.iloc[1:]  # the first row has no duration
    assert not later["stalled"].any() and np.isfinite(later["tokens_per_s"]).all()
    assert (later["t_end_s"] - later["t_start_s"] > FOLLOW_POLL_S).all()
