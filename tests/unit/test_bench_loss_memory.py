"""benchmarks/bench_loss_memory.py at a small size: chunked and whole-sequence losses agree and
the table carries the plan's logits term for each chunk size (the measured peaks are its result)."""

import importlib.util

import pytest

from tests.conftest import REPO
from wattflex.runs.plan import LOGIT_BYTES


@pytest.mark.slow
def test_the_benchmark_measures_each_chunk_size_in_its_own_process(tmp_path):
    spec = importlib.util.spec_from_file_location(
        "bench_loss_memory", REPO / "benchmarks" / "bench_loss_memory.py"
    )
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    text = mod.main(
        [
            "--tokens",
            "256",
            "--vocab",
            "512",
            "--chunks",
            "0",
            "64",
            "--out",
            str(tmp_path / "m.md"),
        ]
    )
    rows = [
        line.split(" | ")
        for line in text.splitlines()
        if line.startswith("| off") or line.startswith("| 64")
    ]
    assert [r[0] for r in rows] == ["| off", "| 64"]
    assert float(rows[0][1]) == pytest.approx(float(rows[1][1]), rel=1e-5)  # the same loss
    assert float(rows[1][3]) == pytest.approx(LOGIT_BYTES * 64 * 512 / 2**30, abs=0.01)
    assert (tmp_path / "m.md").read_text() == text
