"""Which run directories hold a real run, and what the refusal says (wattflex.runs.protection);
the workflow's use of it is tested through real Snakemake in tests/workflow/test_protection_root.py."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from wattflex.runs.protection import (
    holds_real_run,
    kept_real_runs,
    overwrite_refusal,
    recorded_backend,
    redo_command,
    redo_runs,
    run_key,
)


def _run(tmp_path: Path, name: str, text: str | None) -> Path:
    d = tmp_path / "results" / "c" / "runs" / "g" / name
    d.mkdir(parents=True)
    if text is not None:
        (d / "run.json").write_text(text)
    return d


RECORDS = {
    "no run.json": (None, None),
    "emulated": (json.dumps({"provenance": {"backend": "emulated"}}), "emulated"),
    "cuda": (json.dumps({"provenance": {"backend": "cuda"}}), "cuda"),
    "truncated": ('{"provenance": {"back', "unknown"),  # may be a damaged real run: kept
    "a list": ("[]", "unknown"),
    "no provenance": (json.dumps({"group": "g"}), "unknown"),
}


@pytest.mark.parametrize("case", RECORDS, ids=list(RECORDS))
def test_recorded_backend(tmp_path, case):
    text, backend = RECORDS[case]
    d = _run(tmp_path, "cap500", text)
    assert recorded_backend(d) == backend
    assert holds_real_run(d) == (backend not in (None, "emulated"))


def test_only_runs_named_in_the_redo_variable_may_be_overwritten(tmp_path):
    real = [
        _run(tmp_path, f"cap{w}", json.dumps({"provenance": {"backend": "cuda"}}))
        for w in (500, 600)
    ]
    emulated = _run(tmp_path, "cap700", json.dumps({"provenance": {"backend": "emulated"}}))
    assert kept_real_runs([*real, emulated], environ={}) == real
    assert (
        kept_real_runs([*real, emulated], environ={"WATTFLEX_REDO_RUNS": " g/cap500/ , x/y"})
        == real[1:]
    )
    assert redo_runs({"WATTFLEX_REDO_RUNS": "g/cap500, ,h/staircase"}) == {
        "g/cap500",
        "h/staircase",
    }
    assert run_key(real[0]) == "g/cap500"


def test_refusal_is_one_line_with_the_command_that_redoes_one_run():
    dirs = [Path(f"results/c/runs/g/cap{w}") for w in range(100, 800, 100)]
    msg = overwrite_refusal(dirs, "Forced execution")
    assert "\n" not in msg
    assert msg.startswith(
        "refusing to overwrite 7 measured (real-backend) run(s) that Snakemake planned to rerun "
        "(Forced execution): results/c/runs/g/cap100/run.json, "
    )
    assert "cap500/run.json ..." in msg and "cap600/run.json" not in msg.split("...")[0]
    assert redo_command(dirs[0] / "run.json") in msg
    assert redo_command("results/c/runs/g/cap100/run.json") == (
        "WATTFLEX_REDO_RUNS=g/cap100 snakemake --cores all --force results/c/runs/g/cap100/run.json"
    )
    assert msg.endswith(
        "(several: WATTFLEX_REDO_RUNS=" + ",".join(f"g/cap{w}" for w in range(100, 800, 100)) + ")"
    )
