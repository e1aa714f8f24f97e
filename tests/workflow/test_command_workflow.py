"""A user's own, unmodified training script swept through the workflow (``group.command`` on
the cuda backend, wattflex.runs.command_run): tests/data/own_job/train_tiny_lm.py, a plain
torch loop on the CPU that logs torchtitan-style ``tps:`` lines, at 3 caps on FAKE NVML GPUs
(tests/fakes/fake_pynvml.py, imported as ``pynvml`` by the rule scripts through
tests/fakes/pynvml_path; the only fake). Real Snakemake, real subprocesses, real parsing."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import yaml

from tests.fakes import fake_pynvml
from wattflex.provenance import read_json, read_parquet

from .conftest import REPO, SNAKEMAKE

pytestmark = [pytest.mark.slow, pytest.mark.fake_gpu]
OWN_JOB = REPO / "tests" / "data" / "own_job" / "train_tiny_lm.py"
GROUPS = ["dense-pt-own-tinylm-x2", "moe-pt-own-tinylm-x2", "moe-ft-own-tinylm-x2"]
# The separate sweep's caps: an uncapped and a capped run give each group its PFI (two caps are
# what the PFI needs); the staircase steps through three, so it visits a middle cap as well.
SEPARATE_CAPS = [300, 700]
CAPS = [300, 500, 700]
# The staircase's job runs until the controller stops it, so its CPU is the staircase's seconds
# times the host's share of a step. Its steps last 0.1 s (the script's --step-s: the host waits
# out the device's time, as on a GPU): ~10x the ~8 ms of CPU a step computes here (measured),
# so the compute's jitter under load barely moves the step time the staircase must measure.
STAIRCASE_STEP_S = 0.1


def own_group(
    gid: str, model: str, task: str, cluster: str, dim: int, steps: int, step_s: float
) -> dict:
    """A group whose job is the shipped script, launched as a user would launch their own."""
    return {
        "id": gid,
        "model": model,
        "task": task,
        "cluster": cluster,
        "gpus": 2,
        "command": {
            "launch": [
                sys.executable,
                str(OWN_JOB),
                "--steps",
                str(steps),
                "--batch",
                "{nproc_per_node}",
                "--seq",
                "64",
                "--dim",
                str(dim),
                "--eval-freq",
                "20",
                "--step-s",
                str(step_s),
            ],
            "throughput": {"preset": "torchtitan"},
        },
    }


def campaign(
    tmp: Path,
    caps: list[int],
    n_groups: int,
    sweep: str = "separate",
    steps: int = 60,
    step_s: float = 0.0,
) -> Path:
    """The campaign of the first ``n_groups`` of ``GROUPS``, each the shipped script at ``caps``."""
    config = {
        "campaign": "own",
        "backend": "cuda",
        "sweep": sweep,
        "models_catalog": str(REPO / "config" / "models.yaml"),
        "seed": 1,
        "run": {
            "duration_s": 60,
            "sample_period_s": 0.2,
            "eval_at_s": 0,
            "checkpoint_at_s": 0,
            "gap_s": 0,
        },
        "summary": {"warmup_fb_gib": 0},
        "pfi": {"mc_samples": 2000, "ci": 0.95, "seed": 7},
        "figures": {"dpi": 60},
        # as tests/data/tiny.yaml: a small allocation study, no out-of-sample splits (3 groups);
        # of the cuts only no cut and the headline's (config schema: allocation.headline.cut),
        # one simulate_allocation_cut job each: the others add jobs, not checks.
        "allocation": {
            "n_workloads": 20,
            "jobs_per_workload": 20,
            "cuts": [0.0, 0.3],
            "out_of_sample": {"splits": 0, "workloads": 10},
        },
        "cap_grids": {"grid": caps},
        "group_defaults": {
            "gpu": "H200",
            "set": "headline",
            "seq_len": 64,
            "batch": 8,
            "ep": 1,
            "compile": False,
            "grad_checkpointing": False,
            "cap_grid": "grid",
        },
        "groups": [
            own_group(GROUPS[0], "Mistral-Small-24B-Base-2501", "pt", "dense", 64, steps, step_s),
            own_group(GROUPS[1], "gpt-oss-20b", "pt", "moe-pt", 96, steps, step_s),
            own_group(GROUPS[2], "Qwen3-30B-A3B", "lora", "moe-ft", 48, steps, step_s),
        ][:n_groups],
        "repeats": [],
        "cuda": {
            "device": "cuda",
            "cap_control": "nvml",
            "sampler": True,
            "sampler_period_s": 0.2,
            "nproc_per_node": 2,
            "state_dir": str(tmp / "caps"),
        },
        "staircase": {"min_settle_s": 1, "min_samples": 4, "min_steps": 3, "max_dwell_s": 8},
    }
    path = tmp / "own.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def run_snakemake(tmp: Path, config: Path, *targets: str) -> Path:
    fake_pynvml.reset(n_gpus=2, path=tmp / "gpus.json")
    fake_pynvml.reset()
    work = tmp / "work"
    env = {
        **os.environ,
        "FAKE_PYNVML_STATE": str(tmp / "gpus.json"),
        "PYTHONPATH": os.pathsep.join(
            [str(REPO / "tests" / "fakes" / "pynvml_path"), str(REPO / "workflow_scripts")]
        ),
    }
    env.pop("CUDA_VISIBLE_DEVICES", None)
    cmd = [
        *SNAKEMAKE,
        "-s",
        str(REPO / "Snakefile"),
        "--directory",
        str(work),
        *targets,
        "--cores",
        "2",
        "--resources",
        "gpu=2",  # the node's 2 GPUs: one run at a time on them
        "--configfile",
        str(config),
    ]
    proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=900)
    logs = "\n".join(p.read_text(errors="replace")[-2000:] for p in sorted(work.rglob("*.log")))
    assert proc.returncode == 0, f"{proc.stdout[-3000:]}\n{proc.stderr[-5000:]}\n{logs[-6000:]}"
    return work / "results" / "own"


def fake_limits_w(tmp: Path) -> list[float]:
    import json

    return [g["limit_mw"] / 1000 for g in json.loads((tmp / "gpus.json").read_text())["gpus"]]


def test_fake_nvml_own_script_two_caps_to_pfi_summaries_and_report(tmp_path):
    """3 groups (the report's statistics and predictor need 3), each the shipped script at 2 caps;
    the only test that builds the report from runs of a real backend."""
    out = run_snakemake(
        tmp_path,
        campaign(tmp_path, SEPARATE_CAPS, n_groups=3),
        "results/own/pfi.parquet",
        "results/own/report.html",
    )
    for gid in GROUPS:
        for cap in SEPARATE_CAPS:
            run = read_json(out / "runs" / gid / f"cap{cap}" / "run.json")
            assert run["launch"] == "command" and run["training"]["command"][1] == str(OWN_JOB)
            assert run["training"]["command"][5] == "2"  # {nproc_per_node} filled
            assert (
                run["enforced_limit_w"] == [float(cap)] * 2 and run["training"]["exit_status"] == 0
            )
            assert (
                read_json(out / "runs" / gid / f"cap{cap}" / "summary.json").get("status")
                != "failed"
            )
    runs = read_parquet(out / "runs.parquet")
    assert (
        len(runs) == 3 * len(SEPARATE_CAPS)
        and sorted(set(runs["cap_w"])) == SEPARATE_CAPS
        and set(runs["backend"]) == {"cuda"}
    )
    assert (runs["tokens_per_s"] > 0).all() and (runs["power_w"] <= runs["cap_w"] * 2 * 1.01).all()
    pfi = read_parquet(out / "pfi.parquet")
    assert sorted(pfi["group"]) == sorted(GROUPS) and np.isfinite(pfi["pfi_ratio"]).all()
    html = (out / "report.html").read_text()
    assert all(g in html for g in GROUPS)
    assert fake_limits_w(tmp_path) == [700.0, 700.0]


def test_fake_nvml_own_script_staircase_one_run_to_pfi_and_core_figures(tmp_path):
    """The same through sweep: staircase: one long run of the script, its caps stepped while it
    trains, the script stopped when every cap is measured. One group: each group's run is the
    same code on another name (one run per group is planned and checked on the emulated
    backend, test_sweep_modes.py). To the PFI and the core figures; what reads them downstream
    (statistics, predictor, allocation, the report) is the same for both sweep modes and is run
    from the command runs in the test above."""
    config = campaign(
        tmp_path, CAPS, n_groups=1, sweep="staircase", steps=1_000_000, step_s=STAIRCASE_STEP_S
    )
    out = run_snakemake(
        tmp_path, config, "results/own/pfi.parquet", "results/own/figures/curves_normalized.png"
    )
    for gid in GROUPS[:1]:
        run = read_json(out / "runs" / gid / "staircase" / "run.json")
        assert run["launch"] == "command" and run["stop_reason"] == "all_caps_measured"
        assert [v["cap_w"] for v in run["visits"]] == CAPS and run["training"][
            "stopped_by_wattflex"
        ]
        assert run["original_limit_w"] == [700.0, 700.0] and run["enforced_limit_w"] == [
            700.0,
            700.0,
        ]
        for cap in CAPS:
            assert (
                read_json(out / "runs" / gid / "staircase" / f"cap{cap}" / "summary.json").get(
                    "status"
                )
                != "failed"
            )
    runs = read_parquet(out / "runs.parquet")
    assert (
        len(runs) == len(CAPS)
        and set(runs["sweep_mode"]) == {"staircase"}
        and (runs["tokens_per_s"] > 0).all()
    )
    pfi = read_parquet(out / "pfi.parquet")
    assert list(pfi["group"]) == GROUPS[:1] and np.isfinite(pfi["pfi_ratio"]).all()
    assert (out / "figures" / "curves_normalized.png").stat().st_size > 0
    assert fake_limits_w(tmp_path) == [700.0, 700.0]
