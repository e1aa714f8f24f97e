"""``wattflex allocate --site``: every policy holds every level of the site's electrical tree
(the site file cluster-control reads; each job placed by the node column of its curve points)."""

import io
import json

import pandas as pd
import pytest
import yaml

from wattflex.policies import POLICIES

# Two racks: r1 (node1, node2) at 0.8 kW, r2 (node3, node4) at 1.4 kW with node4 at 0.6 kW,
# under a 2.0 kW site. The jobs on node1 and node2 make the most tokens per watt: without the
# site the oracle runs them near the top of their curves, over r1's limit.
SITE = {
    "site": "dc1",
    "limit_kw": 2.0,
    "feeds": [
        {
            "name": "a",
            "limit_kw": 2.0,
            "pdus": [
                {
                    "name": "p1",
                    "limit_kw": 2.0,
                    "racks": [
                        {"name": "r1", "limit_kw": 0.8, "nodes": ["node[1-2]"]},
                        {
                            "name": "r2",
                            "limit_kw": 1.4,
                            "nodes": ["node3", {"name": "node4", "limit_kw": 0.6}],
                        },
                    ],
                }
            ],
        }
    ],
}
SLOPE = {"node1": 3.0, "node2": 2.5, "node3": 1.0, "node4": 0.8}  # tokens/s per W above the floor
RACK = {"node1": "rack:r1", "node2": "rack:r1", "node3": "rack:r2", "node4": "rack:r2"}


def curves(nodes=SLOPE) -> str:
    rows = ["job,node,power_w,throughput,cap_w,gpus,pfi,pfi_measured,cluster,dram_copy_product"]
    for k, (node, slope) in enumerate(nodes.items()):
        for cap in (200, 450, 700):
            t = 100 + slope * (cap - 200) * (1 - (cap - 200) / 2000)
            rows.append(
                f"j{k},{node},{cap},{t:.3f},{cap},1,{1 + k / 4},{1 + k / 4},dense,{0.1 * k}"
            )
    return "\n".join(rows) + "\n"


@pytest.fixture
def inputs(tmp_path):
    (tmp_path / "cv.csv").write_text(curves())
    (tmp_path / "site.yaml").write_text(yaml.safe_dump(SITE))
    return tmp_path


@pytest.mark.parametrize("policy", POLICIES)
def test_no_level_goes_over_its_limit_whatever_the_policy(inputs, run_cli, policy):
    r = run_cli(
        "allocate",
        "cv.csv",
        "--cut",
        "0.1",
        "--site",
        "site.yaml",
        "--policy",
        policy,
        "-o",
        "a.csv",
        cwd=inputs,
    )
    assert r.returncode == 0, r.stderr
    out = pd.read_csv(inputs / "a.csv")
    node = dict(zip(out["job"], pd.read_csv(inputs / "cv.csv").groupby("job")["node"].first()))
    power = dict(zip(out["job"], out["power_w"]))
    load = {"rack:r1": 0.0, "rack:r2": 0.0, "node:node4": power["j3"]}
    for job, p in power.items():
        load[RACK[node[job]]] += p
    tol = 1e-6
    assert load["rack:r1"] <= 800.0 + tol and load["rack:r2"] <= 1400.0 + tol
    assert load["node:node4"] <= 600.0 + tol
    assert sum(power.values()) <= min(0.9 * 2800.0, 2000.0) + tol  # the budget and the site
    levels = json.loads((inputs / "a.csv.totals.json").read_text())["totals"]["levels"]
    for name, level in levels.items():  # the totals report each level, at or under its limit
        assert level["load_w"] <= level["limit_w"] + tol, (name, level)
    assert levels["rack:r1"]["load_w"] == pytest.approx(load["rack:r1"])
    assert "rack:r1:" in r.stderr and "of its 800.0 W limit" in r.stderr


def test_without_the_site_the_oracle_overloads_r1(inputs, run_cli):
    r = run_cli("allocate", "cv.csv", "--cut", "0.1", "-o", "a.csv", cwd=inputs)
    assert r.returncode == 0, r.stderr
    out = pd.read_csv(inputs / "a.csv")
    assert out["power_w"].iloc[:2].sum() > 800.0  # what --site prevents


def test_floors_over_a_racks_limit_and_a_missing_node_column_are_one_line(inputs, run_cli):
    tight = yaml.safe_load(yaml.safe_dump(SITE))
    tight["feeds"][0]["pdus"][0]["racks"][0]["limit_kw"] = 0.3  # r1 below its jobs' 2 x 200 W
    (inputs / "tight.yaml").write_text(yaml.safe_dump(tight))
    r = run_cli("allocate", "cv.csv", "--cut", "0.1", "--site", "tight.yaml", cwd=inputs)
    assert r.returncode == 2
    assert r.stderr.strip().splitlines()[-1] == (
        "wattflex allocate: error: the site's rack:r1 (limit 300.0 W) is below the floors of "
        "its jobs, 400.0 W: no allocation holds it"
    )
    pd.read_csv(inputs / "cv.csv").drop(columns="node").to_csv(inputs / "nonode.csv", index=False)
    r = run_cli("allocate", "nonode.csv", "--cut", "0.1", "--site", "site.yaml", cwd=inputs)
    assert r.returncode == 2 and "need a node column" in r.stderr, r.stderr
    r = run_cli("allocate", "cv.csv", "--cut", "0.1", "--site", "nope.yaml", cwd=inputs)
    assert r.returncode == 2 and "nope.yaml" in r.stderr, r.stderr


def test_a_job_on_a_node_the_site_does_not_name_is_held_by_the_site_only(inputs, run_cli):
    (inputs / "cv.csv").write_text(curves({**SLOPE, "node9": 2.0}))
    r = run_cli("allocate", "cv.csv", "--cut", "0.1", "--site", "site.yaml", cwd=inputs)
    assert r.returncode == 0, r.stderr
    assert "node(s) node9 are not in the site file" in r.stderr
    assert pd.read_csv(io.StringIO(r.stdout))["power_w"].sum() <= 2000.0 + 1e-6
