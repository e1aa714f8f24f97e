"""The monitoring path as an operator runs it: Debian's real Prometheus (2.42,
tests/prometheus_server.py), configured by the shipped resources/prometheus/prometheus.yml,
scrapes a running ``wattflex control`` on FAKE NVML (two fake H200s) during a grid event, and
every query of the shipped Grafana dashboard (panels, event annotations, node/job variables)
goes through Prometheus's HTTP API (wattflex.ops.services.dashboard): each returns a number, and
no legend names a label Prometheus renamed or the series lacks."""

import json
import re
import socket
import subprocess

import pytest

from tests.fakes.nvml_fixture import fake_nvml, limits_w  # noqa: F401 (fixture)
from tests.prometheus_server import SHIPPED, control_during_event
from wattflex.ops.services.dashboard import (
    api,
    check_dashboard,
    legend_problems,
    markdown_table,
)

pytestmark = pytest.mark.fake_gpu


def test_the_shipped_prometheus_config_is_valid_for_promtool():
    out = subprocess.run(
        ["promtool", "check", "config", str(SHIPPED)], capture_output=True, text=True
    )
    assert out.returncode == 0, out.stdout + out.stderr


def test_a_legend_on_a_label_prometheus_renamed_is_a_problem():
    # what Prometheus stores when an exporter sends its own `job`: the scrape's wins
    stored = {"job": "wattflex", "exported_job": "gpu0", "instance": "127.0.0.1:9470"}
    assert legend_problems("{{job}}", stored) == [
        "legend {{job}}: Prometheus renamed the exporter's 'job' to 'exported_job' "
        "(job='wattflex' is the scrape's own)"
    ]
    assert legend_problems("{{workload}}", stored) == [
        "legend {{workload}}: the series has no label 'workload' (drawn empty)"
    ]
    assert legend_problems("{{workload}}", {"workload": "gpu0", "job": "wattflex"}) == []


@pytest.mark.slow  # about 20 s: Prometheus must hold 8 scrapes
def test_every_dashboard_query_returns_data_through_a_real_prometheus_during_an_event(
    fake_nvml, tmp_path, repo
):
    with control_during_event(tmp_path, {0: "4242", 1: "4243"}) as (url, _):
        doc = json.loads((repo / "resources" / "grafana" / "wattflex.json").read_text())
        checked = check_dashboard(url, doc)
        cap = api(url, "/api/v1/query", {"query": "wattflex_job_cap_watts"})["result"]
        # the joules counters follow NVML's energy counter: their rate is the power drawn
        rate = api(
            url,
            "/api/v1/query",
            {"query": "rate(wattflex_gpu_energy_joules_total[5s]) / wattflex_gpu_power_watts"},
        )["result"]
        job = api(
            url,
            "/api/v1/query",
            {
                "query": "sum by (workload) (increase(wattflex_gpu_energy_joules_total[5s])) / "
                "on (workload) increase(wattflex_job_energy_joules_total[5s])"
            },
        )["result"]
    assert len(rate) == 2 and all(float(r["value"][1]) == pytest.approx(1, abs=0.05) for r in rate)
    assert len(job) == 2 and all(float(r["value"][1]) == pytest.approx(1, abs=1e-6) for r in job)
    assert limits_w() == [700.0, 700.0]
    table = markdown_table(checked)
    # cluster-control's site panels have no series from a node's control: they are checked
    # with cluster-control on SLURM (tests/workflow/test_slurm_grid.py)
    site = [
        c for c in checked if set(re.findall(r"\bwattflex_[a-z]+", c.sent)) == {"wattflex_site"}
    ]
    assert site and all(c.problems == ["no series"] for c in site), table
    assert not [c for c in checked if c.problems and c not in site], table
    wheres = {c.query.where for c in checked}
    assert {"annotation Grid events", "variable node", "variable workload"} <= wheres
    assert len(checked) == sum(len(p["targets"]) for p in doc["panels"]) + 4
    # the labels as Prometheus stores them: the exporter's own, next to the scrape's job
    labels = {tuple(sorted(s["metric"].items())) for s in cap}
    assert {(lab["workload"], lab["hpc_job"], lab["job"]) for lab in map(dict, labels)} == {
        ("gpu0", "4242", "wattflex"),
        ("gpu1", "4243", "wattflex"),
    }
    assert not any(k.startswith("exported_") for lab in labels for k, _ in lab)
    legends = {c.query.where: sorted(c.legends) for c in checked}
    node = socket.gethostname()  # the fake GPUs' node: NVML's host
    assert legends["panel Per-job cap"] == [f"{node} gpu0", f"{node} gpu1"]
    assert legends["panel GPU power"] == [f"{node} GPU 0 (gpu0)", f"{node} GPU 1 (gpu1)"]
    assert legends["variable workload"] == ["gpu0", "gpu1"]
