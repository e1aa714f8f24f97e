"""Runs that failed on their last attempt, and what the analysis does without them.

A real run can fail for reasons no retry fixes (the model does not fit, a node keeps
failing). Rather than stopping the sweep, the last attempt leaves a *failure record* in
the run's directory: ``run.json`` with ``status: "failed"``, the error and the number of
attempts, beside empty telemetry and step tables. Its summary says ``status: failed``;
``collect_runs`` leaves it out of ``runs.parquet`` and lists it in ``missing_runs.csv`` (and
in the metadata of ``runs.parquet``); the PFI of its group is computed from the caps that
exist and names the missing runs (column ``missing_runs`` and ``notes``); a group whose
uncapped run is missing gets status ``missing_uncapped``, one without any run a row with
status ``too_few_caps``. A record is never retried by itself (real runs are expensive):
delete the run's directory to try it again.

A run that ran but cannot be summarised (no training phase, no complete step in it: too
short for its start-up) gets the same failed summary, with ``failed_stage: "summary"``
(``unsummarised_summary``); its group's other runs keep theirs.

A run killed from outside (``scancel``, time limit, node failure) leaves no record: SLURM
reports the job failed, Snakemake retries it or, after the last retry, reports the error.
"""

from __future__ import annotations

import traceback
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from wattflex.metrics import telemetry_columns
from wattflex.provenance import provenance, write_json, write_parquet
from wattflex.telemetry import STEP_COLUMNS

FAILED = "failed"
MISSING_COLUMNS = ["group", "run_id", "cap_w", "repeat", "attempts", "error"]


def record_failed_run(
    spec: dict[str, Any], outdir: str | Path, error: BaseException, attempts: int
) -> Path:
    """Write the failure record of ``spec``'s run into ``outdir`` (run.json written last)."""
    outdir = Path(outdir)
    outdir.mkdir(parents=True, exist_ok=True)
    prov = provenance(params=spec, backend=spec["backend"], status=FAILED)
    ids = {"run_id": spec["run_id"], "group": spec["group"]["id"]}
    write_parquet(
        pd.DataFrame({c: pd.Series(dtype=float) for c in telemetry_columns()}),
        outdir / "telemetry.parquet",
        prov,
        status=FAILED,
        **ids,
    )
    write_parquet(
        pd.DataFrame({c: pd.Series(dtype=float) for c in STEP_COLUMNS}),
        outdir / "steps.parquet",
        prov,
        status=FAILED,
        **ids,
    )
    write_json(
        {
            **ids,
            "cap_w": spec["cap_w"],
            "repeat": spec["repeat"],
            "status": FAILED,
            "attempts": int(attempts),
            "error": f"{type(error).__name__}: {error}",
            "traceback": "".join(traceback.format_exception(error))[-4000:],
            "spec": spec,
        },
        outdir / "run.json",
        prov,
    )
    return outdir


def is_failed(run_record: dict[str, Any]) -> bool:
    """Whether a run record (run.json) says the run failed."""
    return run_record.get("status") == FAILED


def failed_summary(run_record: dict[str, Any]) -> dict[str, Any]:
    """The summary row of a failed run: who it was and why it is missing."""
    return {
        "group": run_record["group"],
        "run_id": run_record["run_id"],
        "cap_w": float(run_record["cap_w"]),
        "repeat": int(run_record["repeat"]),
        "backend": run_record["provenance"].get("backend"),
        "status": FAILED,
        "attempts": int(run_record.get("attempts", 0)),
        "error": run_record.get("error", ""),
    }


def unsummarised_summary(run_record: dict[str, Any], reason: str) -> dict[str, Any]:
    """The summary row of a run that ran but holds no steady state to summarise (``reason``:
    the ``wattflex.telemetry.NoSteadyState``): failed like a failure record, so the group's
    other runs keep their summaries and the analysis leaves it out and names it."""
    error = (
        f"no summary: {reason} (the run is too short for its start-up, or never trained: "
        "a longer run.duration_s, or read the run's log)"
    )
    return {
        **failed_summary({**run_record, "attempts": run_record.get("attempts", 1), "error": error}),
        "failed_stage": "summary",
    }


def split_failed(rows: Iterable[dict[str, Any]]) -> tuple[list[dict[str, Any]], pd.DataFrame]:
    """Summary rows -> (rows of runs that produced data, table of missing runs)."""
    ok, missing = [], []
    for row in rows:
        (missing if row.get("status") == FAILED else ok).append(row)
    table = pd.DataFrame(
        [{c: r.get(c) for c in MISSING_COLUMNS} for r in missing], columns=MISSING_COLUMNS
    )
    return ok, table.sort_values(["group", "cap_w", "repeat"]).reset_index(drop=True)


def expected_uncapped(runs: pd.DataFrame, missing: pd.DataFrame) -> pd.Series:
    """Per row of ``runs``: the highest cap its group was swept at, missing runs included
    (pass it to ``pfi_table(uncapped_cap_w=...)`` so a missing uncapped run is flagged)."""
    caps = (
        pd.concat([runs[["group", "cap_w"]], missing[["group", "cap_w"]]])
        .groupby("group")["cap_w"]
        .max()
    )
    return runs["group"].map(caps).astype(float)


def annotate_missing(table: pd.DataFrame, missing: pd.DataFrame) -> pd.DataFrame:
    """Name the missing runs of each group in a PFI table (``missing_runs`` column and
    ``notes``) and add a ``too_few_caps`` row for groups left without any run."""
    out = table.copy()
    if missing.empty:
        out["missing_runs"] = ""
        return out
    described = missing.assign(
        what=[f"{r.run_id} ({r.attempts} attempts: {r.error})" for r in missing.itertuples()]
    )
    per_group = described.groupby("group")["what"].agg("; ".join)
    lost = [g for g in per_group.index if g not in set(out["group"])]
    if lost:
        empty = pd.DataFrame(
            {
                "group": lost,
                "n_caps": 0,
                "status": "too_few_caps",
                "robust_status": "too_few_caps",
                "n_binding": 0,
                "notes": "no run of this group succeeded",
            }
        )
        out = pd.concat([out, empty], ignore_index=True)
        out[["n_caps", "n_binding"]] = out[["n_caps", "n_binding"]].astype(int)
    out["missing_runs"] = out["group"].map(per_group).fillna("")
    has = out["missing_runs"] != ""
    notes = out["notes"].fillna("").astype(str)
    out.loc[has, "notes"] = (
        np.where(notes[has] != "", notes[has] + "; ", "")
        + "missing runs: "
        + out.loc[has, "missing_runs"]
    )
    return out


def failure_summary(
    missing: pd.DataFrame, n_total: int, record_paths: Iterable[str | Path] = ()
) -> str:
    """One paragraph on the failed runs of a campaign: how many of ``n_total`` failed, the
    most common root cause (the first line of the error: a failed training process appends
    the end of its log, which differs from run to run) and the first failure record's path
    (read it for the whole error and the traceback)."""
    if missing.empty:
        return f"all {n_total} runs succeeded"

    def cause(error: str) -> str:
        first = (error.strip().splitlines() or ["(no error recorded)"])[0]
        return first if len(first) <= 300 else first[:297] + "..."

    causes = missing["error"].fillna("").astype(str).map(cause)
    counts = causes.value_counts()
    cause, n_cause = counts.index[0], int(counts.iloc[0])
    first = next(iter(record_paths), None)
    where = f"; first failure record: {first} (its 'traceback' has the details)" if first else ""
    head = (
        f"no run of the campaign succeeded: all {len(missing)} runs failed"
        if len(missing) >= n_total
        else f"{len(missing)} of {n_total} runs failed"
    )
    return (
        f"{head} (after their last retry); most common cause ({n_cause} of {len(missing)} runs): {cause}{where}. "
        "A failure record is never retried by itself: fix the cause, then delete the failed runs' "
        "directories (missing_runs.csv lists them) and run snakemake again."
    )
