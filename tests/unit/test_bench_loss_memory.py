"""benchmarks/bench_loss_memory.py runs at a small size and writes its table: one row per chunk
size (a test may check that a benchmark runs, never what it measures: the chunked loss against
transformers' own is tests/unit/runs/training/test_training_loss.py, the plan's logits term
tests/unit/runs/test_plan.py). The benchmark runs as a user runs it, in its own process."""

import subprocess
import sys

import pytest

from tests.conftest import REPO


@pytest.mark.slow
def test_the_benchmark_runs_and_writes_a_row_per_chunk_size(tmp_path):
    out = tmp_path / "m.md"
    proc = subprocess.run(
        [
            sys.executable,
            str(REPO / "benchmarks" / "bench_loss_memory.py"),
            *("--tokens", "256", "--vocab", "512", "--chunks", "0", "64", "--out", str(out)),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = [
        line.split(" | ")[0] for line in out.read_text().splitlines() if line[:3] in ("| o", "| 6")
    ]
    assert rows == ["| off", "| 64"]
    assert out.read_text() in proc.stdout
