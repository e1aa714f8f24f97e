"""The Grafana dashboard in resources/grafana/wattflex.json: valid JSON that Grafana's own
dashboard model (grafana-foundation-sdk, types generated from Grafana's schema) reads back
without dropping or changing a field, and whose panels and event annotations query only
metrics the exporter (wattflex.ops.services.exporter) serves (tests/unit/ops/test_prometheus.py
runs them through a real Prometheus)."""

import json
import re

from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.models.dashboard import Dashboard

from wattflex.ops.services.exporter import metric_names, site_metric_names


def lost_fields(doc, back, path=""):
    """Paths of ``doc`` that the round trip through the model dropped or changed."""
    if isinstance(doc, dict):
        return [
            p
            for k, v in doc.items()
            for p in ([f"{path}/{k}"] if k not in back else lost_fields(v, back[k], f"{path}/{k}"))
        ]
    if isinstance(doc, list):
        return (
            [f"{path}: length"]
            if len(doc) != len(back)
            else [
                p
                for i, (a, b) in enumerate(zip(doc, back))
                for p in lost_fields(a, b, f"{path}[{i}]")
            ]
        )
    return [] if doc == back else [path]


def round_trip(doc):
    return json.loads(json.dumps(Dashboard.from_json(doc), cls=JSONEncoder))


def test_the_dashboard_is_read_by_grafanas_model_without_losing_a_field(repo):
    doc = json.loads((repo / "resources" / "grafana" / "wattflex.json").read_text())
    assert lost_fields(doc, round_trip(doc)) == []
    # the check can fail: a field Grafana's dashboard model does not know is dropped
    bad = {**doc, "panels": [{**doc["panels"][0], "gridPosition": {"x": 0}}, *doc["panels"][1:]]}
    assert lost_fields(bad, round_trip(bad)) == ["/panels[0]/gridPosition"]


def test_every_panel_queries_exported_metrics_and_every_metric_is_shown(repo):
    doc = json.loads((repo / "resources" / "grafana" / "wattflex.json").read_text())
    exported = set(metric_names()) | set(site_metric_names())
    used = set()
    for panel in doc["panels"]:
        assert panel["targets"], panel["title"]
        for t in panel["targets"]:
            names = set(re.findall(r"\bwattflex_[a-z_]+", t["expr"]))
            assert names and names <= exported, (panel["title"], names - exported)
            used |= names
    for a in doc["annotations"]["list"]:
        names = set(re.findall(r"\bwattflex_[a-z_]+", a["expr"]))
        assert names and names <= exported, (a["name"], names - exported)
        used |= names
    assert used == exported
    ids = [p["id"] for p in doc["panels"]]
    assert len(ids) == len(set(ids))
