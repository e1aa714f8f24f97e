import pandas as pd
import pytest

from wattflex.pfi import pfi_table
from wattflex.provenance import read_json, read_parquet, read_parquet_meta
from wattflex.runs.failures import (
    FAILED,
    MISSING_COLUMNS,
    annotate_missing,
    expected_uncapped,
    failed_summary,
    is_failed,
    record_failed_run,
    split_failed,
)
from wattflex.telemetry import STEP_COLUMNS, TELEMETRY_COLUMNS


def spec(group="g", run_id="cap500", cap_w=500.0):
    return {
        "campaign": "c",
        "backend": "cuda",
        "run_id": run_id,
        "cap_w": cap_w,
        "repeat": 0,
        "group": {"id": group, "gpus": 8},
        "run": {"duration_s": 600},
    }


def test_failure_record_says_failed_with_error_and_attempts_in_readable_files(tmp_path):
    try:
        raise RuntimeError("CUDA out of memory")
    except RuntimeError as exc:
        record_failed_run(spec(), tmp_path / "cap500", exc, attempts=3)
    run = read_json(tmp_path / "cap500/run.json")
    assert is_failed(run) and run["attempts"] == 3
    assert run["error"] == "RuntimeError: CUDA out of memory" and "Traceback" in run["traceback"]
    tel = read_parquet(tmp_path / "cap500/telemetry.parquet")
    assert tel.empty and list(tel.columns) == TELEMETRY_COLUMNS
    assert list(read_parquet(tmp_path / "cap500/steps.parquet").columns) == STEP_COLUMNS
    assert read_parquet_meta(tmp_path / "cap500/steps.parquet")["status"] == FAILED
    row = failed_summary(run)
    assert row == {
        "group": "g",
        "run_id": "cap500",
        "cap_w": 500.0,
        "repeat": 0,
        "backend": "cuda",
        "status": FAILED,
        "attempts": 3,
        "error": "RuntimeError: CUDA out of memory",
    }


def sweep_rows():
    """Three groups: g_ok complete, g_mid lost its 500-W run, g_top lost its uncapped run."""
    rows = []
    for group in ("g_ok", "g_mid", "g_top"):
        for cap, power, tput in ((300, 2300.0, 700.0), (500, 3800.0, 900.0), (700, 5000.0, 1000.0)):
            rows.append(
                {
                    "group": group,
                    "cap_w": float(cap),
                    "repeat": 0,
                    "run_id": f"cap{cap}",
                    "gpus": 8,
                    "power_w": power,
                    "tokens_per_s": tput,
                    "power_w_sem": 5.0,
                    "tokens_per_s_sem": 1.0,
                }
            )
    failed = [
        failed_summary(
            {
                "group": g,
                "run_id": f"cap{c}",
                "cap_w": c,
                "repeat": 0,
                "attempts": 2,
                "error": "KeyError: 'layers'",
                "provenance": {"backend": "cuda"},
            }
        )
        for g, c in (("g_mid", 500), ("g_top", 700), ("g_gone", 700))
    ]
    keep = [r for r in rows if (r["group"], r["cap_w"]) not in {("g_mid", 500.0), ("g_top", 700.0)}]
    return keep, failed


def test_split_failed_separates_missing_runs():
    keep, failed = sweep_rows()
    ok, missing = split_failed(keep + failed)
    assert ok == keep
    assert list(missing.columns) == MISSING_COLUMNS
    assert list(missing["group"] + "/" + missing["run_id"]) == [
        "g_gone/cap700",
        "g_mid/cap500",
        "g_top/cap700",
    ]


def test_pfi_of_groups_with_missing_runs_names_them_and_flags_a_missing_uncapped_run():
    keep, failed = sweep_rows()
    ok, missing = split_failed(keep + failed)
    runs = pd.DataFrame(ok)
    runs["expected_uncapped_cap_w"] = expected_uncapped(runs, missing)
    table = pfi_table(
        runs,
        throughput_col="tokens_per_s",
        power_sem_col="power_w_sem",
        throughput_sem_col="tokens_per_s_sem",
        mc_samples=200,
        uncapped_cap_w="expected_uncapped_cap_w",
    )
    out = annotate_missing(table, missing).set_index("group")
    assert (
        out.loc["g_ok", "missing_runs"] == ""
        and out.loc["g_ok", "status"] == table.set_index("group").loc["g_ok", "status"]
    )
    # A middle cap missing: the PFI of the caps that exist, and a diagnostic naming the lost run.
    assert out.loc["g_mid", "n_caps"] == 2 and out.loc["g_mid", "pfi_ratio"] == pytest.approx(
        ((1000 - 700) / 1000) ** -1 * ((5000 - 2300) / 5000), rel=1e-9
    )
    assert "cap500 (2 attempts: KeyError: 'layers')" in out.loc["g_mid", "missing_runs"]
    assert "missing runs: cap500" in out.loc["g_mid", "notes"]
    # The uncapped run missing: the reference would be a capped run, and the status says so.
    assert out.loc["g_top", "status"] == "missing_uncapped"
    # No run at all: still a row, with a status and the reason.
    assert out.loc["g_gone", "status"] == "too_few_caps" and out.loc["g_gone", "n_caps"] == 0
    assert "no run of this group succeeded" in out.loc["g_gone", "notes"]


def test_nothing_missing_leaves_pfi_table_unchanged_but_for_an_empty_column():
    keep, _ = sweep_rows()
    runs = pd.DataFrame(keep)
    table = pfi_table(runs, throughput_col="tokens_per_s", mc_samples=200)
    out = annotate_missing(table, pd.DataFrame(columns=MISSING_COLUMNS))
    pd.testing.assert_frame_equal(out.drop(columns="missing_runs"), table)
    assert (out["missing_runs"] == "").all()


@pytest.fixture(scope="module")
def short_runs(tmp_path_factory):
    """Emulated runs too short for the 24B model's start-up: 120 s never reaches training,
    160 s steps only outside its training phase."""
    import copy
    from pathlib import Path

    import yaml

    from wattflex.config import prepare, run_spec
    from wattflex.runs.runner import run_at_cap

    repo = Path(__file__).resolve().parents[3]
    raw = yaml.safe_load((repo / "tests" / "data" / "tiny.yaml").read_text())
    out = {}
    for duration in (120, 160):
        cfg = copy.deepcopy(raw)
        cfg["run"].update(duration_s=duration, eval_at_s=None, checkpoint_at_s=None)
        run = run_spec(prepare(cfg, base=repo), "dense-pt-mistral24b-x8", "cap700")
        d = run_at_cap(run, tmp_path_factory.mktemp(f"d{duration}") / "cap700")
        out[duration] = (d / "telemetry.parquet", d / "steps.parquet", d / "run.json")
    return out


@pytest.mark.parametrize(
    "duration,reason", [(120, "no training phase found"), (160, "no complete training step")]
)
def test_a_run_too_short_to_summarise_is_a_failed_summary_naming_why(short_runs, duration, reason):
    from wattflex.telemetry import NoSteadyState, read_run_files, summarize_run

    run, tel, steps = read_run_files(*short_runs[duration])  # sound files, not a damaged run
    with pytest.raises(NoSteadyState, match=reason) as err:
        summarize_run(tel, steps)
    from wattflex.runs.failures import unsummarised_summary

    row = unsummarised_summary(run, str(err.value))
    assert (
        row["status"] == FAILED and row["failed_stage"] == "summary" and row["run_id"] == "cap700"
    )
    assert row["error"].startswith(f"no summary: {reason}") and "run.duration_s" in row["error"]
    ok, missing = split_failed([row])
    assert (
        ok == []
        and list(missing["run_id"]) == ["cap700"]
        and missing["error"].iat[0] == row["error"]
    )
