"""How runs are scheduled (any executor): SLURM requests from the group, one run of a group
at a time, retries, and a run that fails on every attempt not stopping the sweep."""

import copy
import re

import pandas as pd
import pytest
import yaml

from wattflex.config import load_config, run_spec
from wattflex.provenance import read_json, read_parquet

from .conftest import REPO, snakemake


def write_config(tmp_path, tiny_config, **changes):
    cfg = yaml.safe_load(tiny_config.read_text())
    for key, value in changes.items():
        cfg[key] = value
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


def run_resources(stdout: str) -> dict[str, dict[str, str]]:
    """{group/run: resources} of the run_at_cap jobs a dry run plans."""
    out = {}
    for block in stdout.split("rule run_at_cap:")[1:]:
        wc = re.search(r"wildcards: group=([\w.-]+), run=(\w+)", block)
        res = re.search(r"resources: (.*)", block).group(1)
        out[f"{wc.group(1)}/{wc.group(2)}"] = dict(kv.split("=", 1) for kv in res.split(", "))
    return out


@pytest.mark.parametrize("mode", ["constraint", "gpu_model"])
def test_run_jobs_ask_for_the_groups_gpus_nodes_model_and_time(tmp_path, tiny_config, mode):
    cfg = yaml.safe_load(tiny_config.read_text())
    x16 = {
        "id": "h100-dense-pt-x16",
        "model": "Mistral-Small-24B-Base-2501",
        "task": "pt",
        "gpus": 16,
        "gpu": "H100",
    }
    config = write_config(tmp_path, tiny_config, groups=cfg["groups"][:1] + [x16], repeats=[])
    proc = snakemake(
        "-n",
        "--cores",
        "1",
        "--configfile",
        str(config),
        "--config",
        f"slurm_gpu_model={mode}",
        "slurm_gpus_per_node=8",
        cwd=tmp_path,
    )
    res = run_resources(proc.stdout)
    assert len(res) == 8
    big = res["h100-dense-pt-x16/cap200"]
    # 2 nodes x 8 GPUs, split per node (--gres counts per node), not a total SLURM may split unevenly
    small = res["dense-pt-mistral24b-x8/cap200"]
    if mode == "constraint":
        assert (big["gres"], big["nodes"], big["constraint"]) == ("gpu:8", "2", "h100")
        assert (small["gpu"], small["nodes"], small["constraint"]) == ("8", "1", "h200")
    else:  # the model in the per-node gres; one node: --gpus=<model>:<n>
        assert (big["gres"], big["nodes"]) == ("gpu:h100:8", "2") and "gpu_model" not in big
        assert (small["gpu"], small["nodes"], small["gpu_model"]) == ("8", "1", "h200")
    assert "gpu" not in big
    # 420-s runs + 20-min margin; 1 retry by default; each run holds its group's slot.
    assert small["runtime"] == "27" and small["run_attempts"] == "2"
    assert small["sweep_dense_pt_mistral24b_x8"] == "1" and "sweep_h100_dense_pt_x16" not in small
    assert big["sweep_h100_dense_pt_x16"] == "1"
    # Multi-node: the jobstep plugin's MPI route (no srun -n1 wrapper), one task per node;
    # one node: the plugin's default step (wattflex.runs.real_run).
    assert (big["mpi"], big["tasks"], big["tasks_per_gpu"]) == ("srun", "2", "0")
    assert big["slurm_extra"] == "--ntasks-per-node=1"
    assert not {"mpi", "tasks", "tasks_per_gpu", "gres", "slurm_extra"} & set(small)


def test_parallel_within_group_drops_the_group_slot(tmp_path, tiny_config):
    run = {
        **yaml.safe_load(tiny_config.read_text())["run"],
        "parallel_within_group": True,
        "retries": 3,
    }
    config = write_config(tmp_path, tiny_config, run=run)
    res = run_resources(
        snakemake("-n", "--cores", "1", "--configfile", str(config), cwd=tmp_path).stdout
    )
    assert res and not any(k.startswith("sweep_") for r in res.values() for k in r)
    assert {r["run_attempts"] for r in res.values()} == {"4"}


def test_scheduling_keys_never_change_a_runs_spec(tiny_config):
    cfg = load_config(tiny_config, base=REPO)
    other = copy.deepcopy(cfg)
    other["run"].update(parallel_within_group=True, retries=5)
    assert run_spec(cfg, "dense-pt-mistral24b-x8", "cap500") == run_spec(
        other, "dense-pt-mistral24b-x8", "cap500"
    )


@pytest.mark.slow
def test_run_failing_on_every_attempt_is_recorded_and_the_sweep_finishes(tmp_path, tiny_config):
    """A model whose catalog entry lacks its layer count fails in every attempt; the other
    group's runs, runs.parquet and the PFI table are still produced, naming what is missing."""
    catalog = yaml.safe_load((REPO / "config/models.yaml").read_text())
    broken = {
        k: v for k, v in catalog["models"]["Mistral-Small-24B-Base-2501"].items() if k != "layers"
    }
    catalog["models"]["Broken-24B"] = broken
    (tmp_path / "models.yaml").write_text(yaml.safe_dump(catalog))
    cfg = yaml.safe_load(tiny_config.read_text())
    good = {**cfg["groups"][0], "caps": [500, 700]}
    bad = {**cfg["groups"][0], "id": "broken-x8", "model": "Broken-24B", "caps": [700]}
    config = write_config(
        tmp_path,
        tiny_config,
        groups=[good, bad],
        repeats=[],
        models_catalog=str(tmp_path / "models.yaml"),
    )
    snakemake("results/tiny/pfi.parquet", "--cores", "1", "--configfile", str(config), cwd=tmp_path)
    log = (tmp_path / "logs/tiny/runs/broken-x8/cap700.log").read_text()
    assert "(attempt 2 of 2)" in log and "KeyError: 'layers'" in log  # the log of the last attempt
    record = read_json(tmp_path / "results/tiny/runs/broken-x8/cap700/run.json")
    assert record["status"] == "failed" and record["attempts"] == 2
    runs = read_parquet(tmp_path / "results/tiny/runs.parquet")
    assert set(runs["group"]) == {good["id"]} and len(runs) == 2
    missing = pd.read_csv(tmp_path / "results/tiny/missing_runs.csv")
    assert list(missing["group"] + "/" + missing["run_id"]) == ["broken-x8/cap700"]
    pfi = read_parquet(tmp_path / "results/tiny/pfi.parquet").set_index("group")
    assert pfi.loc[good["id"], "pfi_ratio"] > 0 and pfi.loc[good["id"], "missing_runs"] == ""
    assert pfi.loc["broken-x8", "status"] == "too_few_caps"
    assert "KeyError: 'layers'" in pfi.loc["broken-x8", "missing_runs"]
