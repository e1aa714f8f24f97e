"""The resource plan through real Snakemake: every campaign gets tables/resource_plan.csv, a
real campaign with a group that cannot fit is refused by `snakemake -n`, and a real run's
SLURM time limit holds its planned start-up (wattflex.runs.plan)."""

import math
import re

import pytest
import yaml

from wattflex.config import groups, prepare
from wattflex.provenance import read_csv
from wattflex.runs import plan

from .conftest import REPO, snakemake
from .test_run_scheduling import run_resources

LLAMA_X1 = {"id": "dense-pt-llama70b-x1", "model": "Llama-3.1-70B", "task": "pt", "gpus": 1}


def cuda_config(tmp_path, tiny_config, extra_groups=()):
    cfg = yaml.safe_load(tiny_config.read_text())
    cfg.update(
        backend="cuda",
        cuda={"random_init": True, "cap_control": "observe"},
        repeats=[],
        groups=cfg["groups"][:1] + list(extra_groups),
    )
    path = tmp_path / "cuda.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path, cfg


@pytest.mark.slow
def test_dry_run_refuses_a_real_group_that_cannot_fit_naming_it_and_the_numbers(
    tmp_path, tiny_config
):
    path, _ = cuda_config(tmp_path, tiny_config, [LLAMA_X1])
    proc = snakemake("-n", "--cores", "1", "--configfile", str(path), cwd=tmp_path, check=False)
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0
    assert "config error at groups: 1 group(s) cannot fit" in out
    assert "group dense-pt-llama70b-x1 (Llama-3.1-70B pt on 1 H200): GPU memory: needs" in out
    assert (
        "133.9 GiB usable" in out and "dense-pt-mistral24b-x8" not in out.split("cannot fit", 1)[1]
    )
    assert "rule run_at_cap" not in out  # refused before any job is planned


@pytest.mark.slow
def test_a_real_runs_time_limit_holds_its_planned_start_up(tmp_path, tiny_config):
    path, cfg = cuda_config(tmp_path, tiny_config)
    proc = snakemake("-n", "--cores", "1", "--configfile", str(path), cwd=tmp_path)
    res = run_resources(proc.stdout)
    prepared = prepare(
        yaml.safe_load(path.read_text()) | {"models_catalog": str(REPO / "config/models.yaml")},
        base=REPO,
    )
    [p] = plan.plan_campaign(prepared, groups(prepared))
    run = cfg["run"]  # 420-s runs, checkpoint at 330 s, no gap
    seconds = p.startup_s + max(run["duration_s"], run["checkpoint_at_s"] + p.checkpoint_write_s)
    assert p.startup_s > 60 and p.fits
    expected = math.ceil(seconds / 60) + 20
    assert {r["runtime"] for r in res.values()} == {str(expected)}
    assert expected > 27  # the emulated campaign's limit: 420 s + 20 min


@pytest.mark.slow
def test_every_campaign_gets_its_resource_plan_table(tiny_run):
    table = read_csv(tiny_run / "tables" / "resource_plan.csv")
    assert list(table["group"]) == [
        "dense-pt-mistral24b-x8",
        "moe-pt-gptoss20b-x8-ep8",
        "moe-ft-qwen30ba3b-x8",
    ]
    # tiny's Qwen3-30B-A3B LoRA at 16 x 4096 tokens per GPU fits through the chunked loss alone:
    # one 8192-token chunk's logits (cuda.loss_chunk_tokens), not the whole 65,536 tokens'
    assert list(table["fits"]) == [True, True, True]
    qwen = table.set_index("group").loc["moe-ft-qwen30ba3b-x8"]
    assert qwen["logits_gib"] == pytest.approx(12 * 8192 * 151936 / 2**30, rel=0.01)
    assert (table["gpu_need_gib"] > table["states_gib"]).all()


@pytest.mark.slow
def test_a_real_one_run_sweeps_time_limit_holds_one_start_up_and_all_its_caps(
    tmp_path, tiny_config
):
    path, cfg = cuda_config(tmp_path, tiny_config)
    doc = yaml.safe_load(path.read_text())
    doc.update(
        sweep="staircase",
        cuda={
            **doc["cuda"],
            "cap_control": "command",
            "cap_command": "sudo /usr/local/bin/setcap {gpu} {watts}",
        },
    )
    path.write_text(yaml.safe_dump(doc))
    out = snakemake("-n", "--cores", "1", "--configfile", str(path), cwd=tmp_path).stdout
    block = out.split("rule run_staircase:", 1)[1]
    runtime = re.search(r"resources: .*?runtime=(\d+)", block).group(1)
    prepared = prepare(doc | {"models_catalog": str(REPO / "config/models.yaml")}, base=REPO)
    [p] = plan.plan_campaign(prepared, groups(prepared))
    loop = (
        len(groups(prepared)[0]["caps"]) * cfg["run"]["duration_s"]
    )  # 4 caps x 420 s, one start-up
    assert runtime == str(
        math.ceil(plan.run_limit_s(p, loop, 0, cfg["run"]["checkpoint_at_s"]) / 60) + 20
    )
    assert int(runtime) > math.ceil(loop / 60) + 20
