"""The site file: the electrical tree, where each node sits, and one-line refusals."""

from __future__ import annotations

import math

import numpy as np
import pytest
import yaml

from tests.fakes.nvml_fixture import fake_nvml, limits_w  # noqa: F401 (fixture)
from wattflex.errors import ConfigError
from wattflex.ops.adapters.topology import parse_site, read_site, slurm_node_features

SITE = {
    "site": "dc1",
    "limit_kw": 2.4,
    "feeds": [
        {
            "name": "a",
            "limit_kw": 2.4,
            "pdus": [
                {
                    "name": "p1",
                    "limit_kw": 2.4,
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


def test_the_tree_and_the_node_map_from_the_file(tmp_path):
    f = tmp_path / "site.yaml"
    f.write_text(yaml.safe_dump(SITE))
    site = read_site(f)
    assert [lv.name for lv in site.levels] == [
        "site:dc1",
        "feed:a",
        "pdu:p1",
        "rack:r1",
        "rack:r2",
        "node:node4",
    ]
    assert site.rack_of == {"node1": "r1", "node2": "r1", "node3": "r2", "node4": "r2"}
    fam = site.laminar(["node1", "node2", "node3", "node4", "node1"])
    assert fam.loads(np.array([400.0, 400.0, 700.0, 600.0, 1.0]))[3] == pytest.approx(
        801.0
    )  # rack r1: 3 units
    assert [v[0] for v in fam.violations(np.array([400.0, 400.0, 700.0, 600.0, 1.0]))] == [
        "rack:r1"
    ]
    assert fam.limit_w[5] == 600.0 and fam.parent[5] == 4
    # a node alone: its equal share of every level (r1's 800 W over its two nodes)
    assert site.node_share_w("node1") == 400.0 and site.node_share_w("node3") == pytest.approx(
        2400 / 4
    )  # the site over 4 nodes (r2: 700 each)
    assert site.node_share_w("node4") == 600.0  # its own limit is the tighter


def test_the_node_map_from_slurm_features_and_names():
    doc = {
        **SITE,
        "feeds": [
            {
                **SITE["feeds"][0],
                "pdus": [
                    {
                        **SITE["feeds"][0]["pdus"][0],
                        "racks": [{"name": "r1", "limit_kw": 0.8}, {"name": "r2", "limit_kw": 1.4}],
                    }
                ],
            }
        ],
    }
    scontrol = {
        "nodes": [
            {"name": "n1", "features": ["h200", "r1"]},
            {"name": "n2", "features": "h200,r2"},
            {"name": "n3", "features": ["h200"]},
        ]
    }
    site = parse_site(
        {**doc, "node_map": {"from": "slurm-features"}}, slurm_nodes=slurm_node_features(scontrol)
    )
    assert site.rack_of == {"n1": "r1", "n2": "r2"}
    site = parse_site(
        {**doc, "node_map": {"from": "slurm-names", "pattern": r"^(?P<rack>r\d)n\d+$"}},
        slurm_nodes={"r1n01": [], "r2n07": [], "login": []},
    )
    assert site.rack_of == {"r1n01": "r1", "r2n07": "r2"}


@pytest.mark.parametrize(
    "change, message",
    [
        (
            lambda d: d["feeds"][0].pop("limit_kw"),
            r"site file: feeds\[0\]: 'limit_kw' is a required property",
        ),
        (
            lambda d: d["feeds"][0]["pdus"][0]["racks"][0].update(limit_kw=-1),
            r"racks\[0\]\.limit_kw: -1",
        ),
        (lambda d: d.update(fedes=[]), "fedes"),
        (
            lambda d: d["feeds"][0]["pdus"][0]["racks"][1]["nodes"].append("node2"),
            "node 'node2' is in two racks",
        ),
        (
            lambda d: d["feeds"][0]["pdus"][0]["racks"][1].update(name="r1"),
            "rack 'r1' is named twice",
        ),
        (
            lambda d: d.update(node_map={"from": "slurm-names"}),
            "slurm-names needs a pattern|but racks list nodes",
        ),
    ],
)
def test_a_bad_site_file_is_refused_in_one_line(change, message):
    import copy

    doc = copy.deepcopy(SITE)
    change(doc)
    with pytest.raises(ConfigError, match=message) as e:
        parse_site(doc, slurm_nodes={})
    assert "\n" not in str(e.value) and str(e.value).startswith("site file")


def test_a_missing_site_file(tmp_path):
    with pytest.raises(ConfigError, match="no such file"):
        read_site(tmp_path / "nope.yaml")
    no_limit = {k: v for k, v in SITE.items() if k != "limit_kw"}
    assert math.isinf(parse_site(no_limit).levels[0].limit_w)  # a site without its own limit


def _write_load(path, load_w):
    from wattflex.ops.adapters.slurm import write_load

    write_load(path, path.name.removesuffix(".load.json"), load_w, [])


def test_the_coordinator_holds_every_rack_and_tells_each_agent_its_limit(tmp_path):
    """Four 1-GPU units, rack r1 (node1, node2) at 0.8 kW: a 30 % event on 2.8 kW (1960 W)
    would give r1 980 W split evenly; with the site r1 gets 800 W and r2 the rest, and every
    budget file carries the unit's share of the limits alone. A unit that has not answered
    yet (an agent starting) still gets its limit share; the others count it uncapped."""
    import json as _json
    import time

    from wattflex.ops.adapters.slurm import SlurmJob, coordinate_once

    site = parse_site(SITE)
    job = SlurmJob("7", "x", {f"node{i}": (0,) for i in range(1, 5)})
    for i in range(1, 5):
        _write_load(tmp_path / f"7.node{i}.load.json", 650.0)
    share = coordinate_once(
        [job], 1960.0, time.time() + 60, tmp_path, 200.0, 700.0, 30.0, site=site
    )
    r1 = share["7.node1"] + share["7.node2"]
    assert r1 == pytest.approx(800.0) and sum(share.values()) == pytest.approx(1960.0)
    assert share["7.node4"] <= 600.0 + 1e-9  # node4's own limit
    docs = {i: _json.loads((tmp_path / f"7.node{i}.budget.json").read_text()) for i in range(1, 5)}
    assert docs[1]["limit_w"] == pytest.approx(400.0) and docs[2]["limit_w"] == pytest.approx(400.0)
    assert docs[4]["limit_w"] == pytest.approx(600.0)
    flat = coordinate_once([job], 1960.0, time.time() + 60, tmp_path, 200.0, 700.0, 30.0)
    assert flat["7.node1"] + flat["7.node2"] > 800.0  # without the site: r1 overloaded
    # no event: only the limits, and a unit no limit binds gets no budget at all
    share = coordinate_once([job], float("inf"), -1.0, tmp_path, 200.0, 700.0, 30.0, site=site)
    assert share["7.node1"] == pytest.approx(400.0) and share["7.node3"] == float("inf")
    # node2's agent has not answered yet: counted uncapped (700 W) for node1, its own limit share kept
    (tmp_path / "7.node2.load.json").unlink()
    coordinate_once([job], float("inf"), -1.0, tmp_path, 200.0, 700.0, 30.0, site=site)
    docs = {i: _json.loads((tmp_path / f"7.node{i}.budget.json").read_text()) for i in range(1, 5)}
    assert docs[1]["limit_w"] == pytest.approx(200.0) and docs[2]["limit_w"] == pytest.approx(400.0)
    assert docs[1]["limit_w"] + docs[2]["limit_w"] <= 800.0


def test_a_paused_job_is_charged_in_its_rack_and_the_caps_hold_the_rest(tmp_path):
    """A knob choice's paused job (3 GPUs on node1, charged 3 x 75 W idle, as
    ``cluster-control --knob-choice`` charges it) counts in rack r1: the job beside it on node2
    gets the 575 W r1 has left, where the split without the site gives it more."""
    import time

    from wattflex.ops.adapters.slurm import SlurmJob, coordinate_once

    site = parse_site(SITE)
    jobs = [SlurmJob("8", "paused", {"node1": (0, 1, 2)})] + [
        SlurmJob(str(8 + i), "x", {f"node{i}": (0,)}) for i in range(2, 5)
    ]
    for i in range(2, 5):
        _write_load(tmp_path / f"{8 + i}.node{i}.load.json", 650.0)
    charged = {"8.node1": 3 * 75.0}
    args = (2200.0, time.time() + 60, tmp_path, 200.0, 700.0, 30.0)
    share = coordinate_once(jobs, *args, site=site, charged=charged)
    assert np.isnan(share["8.node1"]) and share["10.node2"] == pytest.approx(800.0 - 225.0)
    assert share["12.node4"] <= 600.0 + 1e-9 and share["11.node3"] + share["12.node4"] <= 1400.0
    flat = coordinate_once(jobs, *args, charged=charged)
    assert flat["10.node2"] > 575.0  # without the site: r1 over with the paused job's idle power


@pytest.mark.fake_gpu
def test_control_on_one_node_holds_its_share_of_every_level_fake_nvml(fake_nvml, tmp_path, capsys):  # noqa: F811
    from wattflex import cli

    f = tmp_path / "site.yaml"
    f.write_text(yaml.safe_dump(SITE))
    sig = tmp_path / "s.csv"
    sig.write_text("time_s,fraction\n0,0.9\n0.6,0.9\n")  # 0.9 x 1400 W: above node1's 400 W share
    assert (
        cli.main(
            [
                "control",
                "--signal",
                str(sig),
                "--period-s",
                "0.1",
                "--state-dir",
                str(tmp_path / "st"),
                "--site",
                str(f),
                "--node",
                "node1",
                "--mv-out",
                str(tmp_path / "mv"),
            ]
        )
        == 0
    )
    out = capsys.readouterr().out
    assert "node node1's share of the site's limits 400 W" in out
    calls = fake_nvml.state()["set_calls"]
    capped = [mw / 1000 for _, mw in calls if mw < 700_000]
    assert capped and 2 * max(capped) <= 400.0 and limits_w() == [700.0, 700.0]
    from wattflex.provenance import read_json

    (node,) = read_json(tmp_path / "mv" / "mv.json")["levels"]  # the M&V reports the node's level
    assert (
        node["limit_w"] == 400.0 and node["periods_above_limit"] == 0 and 0 < node["max_w"] <= 400.0
    )
    assert (
        cli.main(
            [
                "control",
                "--signal",
                str(sig),
                "--site",
                str(f),
                "--node",
                "nodeX",
                "--state-dir",
                str(tmp_path / "st"),
            ]
        )
        == 2
    )
    assert "node 'nodeX' is not in the site file" in capsys.readouterr().err
