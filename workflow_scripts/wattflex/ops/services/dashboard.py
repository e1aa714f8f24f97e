"""The shipped Grafana dashboard's queries run through a Prometheus HTTP API, each series'
legend drawn the way Grafana draws it: what an operator would see, checked on real data.

Grafana's Prometheus data source sends a panel's ``expr`` (its template variables replaced)
to ``/api/v1/query`` (``query_range`` for a graph: the same series) and names each series by
the target's ``legendFormat``, ``{{label}}`` replaced by the series' label value, or by
nothing where the series has no such label (Grafana's ``renderLegendFormat``). A variable
``label_values(selector, label)`` is answered by ``/api/v1/label/<label>/values``. The
check fails a query that returns no series, a series whose value is not a number (a panel
that draws nothing), a legend naming a label the series lacks (drawn empty), and a legend
naming a label Prometheus renamed (the exporter's ``job`` becomes ``exported_job`` beside
the scrape's own ``job``: the legend then names the scrape job, not the training job).
"""

from __future__ import annotations

import json
import math
import re
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass, field
from typing import Any

LEGEND = re.compile(r"\{\{\s*(.+?)\s*\}\}")  # Grafana's legend template
VARIABLE = re.compile(r"\$\{(\w+)(?::\w+)?\}|\$(\w+)|\[\[(\w+)\]\]")  # $x, ${x}, ${x:fmt}, [[x]]
LABEL_VALUES = re.compile(r"^\s*label_values\((.*),\s*(\w+)\)\s*$")
# Grafana's values of its own variables for a check over a short window: ``$__range`` the
# dashboard's range, ``$__rate_interval`` at least four scrape intervals (Grafana's rule).
GRAFANA_DEFAULTS = {"__range": "1m", "__rate_interval": "15s", "__interval": "5s"}


@dataclass
class Query:
    """One query of the dashboard: where it is drawn, its expression and legend template."""

    where: str  # "panel <title>", "annotation <name>" or "variable <name>"
    ref: str
    expr: str
    legend: str = ""


@dataclass
class Checked:
    """A query as sent, what Prometheus returned and the legends Grafana would draw."""

    query: Query
    sent: str
    values: list[float] = field(default_factory=list)
    legends: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)


def dashboard_queries(doc: dict[str, Any]) -> list[Query]:
    """Every query of a dashboard's JSON model: panel targets, annotations, query variables."""
    out = [
        Query(f"panel {p['title']}", t.get("refId", ""), t["expr"], t.get("legendFormat", ""))
        for p in doc.get("panels", [])
        for t in p.get("targets", [])
    ]
    out += [
        Query(f"annotation {a['name']}", "", a["expr"])
        for a in doc.get("annotations", {}).get("list", [])
        if a.get("expr")
    ]
    out += [
        Query(f"variable {v['name']}", "", v["query"])
        for v in doc.get("templating", {}).get("list", [])
        if v.get("type") == "query"
    ]
    return out


def all_values(doc: dict[str, Any]) -> dict[str, str]:
    """Each query variable at Grafana's "All" (its ``allValue``, else ``.*``) and the
    built-ins at :data:`GRAFANA_DEFAULTS`: the values a fresh dashboard opens with."""
    out = dict(GRAFANA_DEFAULTS)
    for v in doc.get("templating", {}).get("list", []):
        if v.get("type") == "query":
            out[v["name"]] = v.get("allValue") or ".*"
    return out


def expand(expr: str, values: dict[str, str]) -> str:
    """``expr`` with Grafana's variables replaced; an unknown one is an error (Grafana would
    send it as it stands and Prometheus refuse the query)."""

    def sub(m: re.Match) -> str:
        name = next(g for g in m.groups() if g)
        if name not in values:
            raise ValueError(f"{expr!r}: variable ${name} has no value")
        return values[name]

    return VARIABLE.sub(sub, expr)


def draw_legend(fmt: str, labels: dict[str, str]) -> str:
    """The series name Grafana draws: ``{{label}}`` replaced by its value, or by nothing."""
    return LEGEND.sub(lambda m: labels.get(m.group(1), ""), fmt)


def legend_problems(fmt: str, labels: dict[str, str]) -> list[str]:
    """What is wrong with a legend on a series: a label it lacks, or one Prometheus renamed."""
    out = []
    for name in LEGEND.findall(fmt):
        if f"exported_{name}" in labels:
            out.append(
                f"legend {{{{{name}}}}}: Prometheus renamed the exporter's {name!r} to "
                f"'exported_{name}' ({name}={labels.get(name)!r} is the scrape's own)"
            )
        elif name not in labels:
            out.append(f"legend {{{{{name}}}}}: the series has no label {name!r} (drawn empty)")
    return out


def api(base_url: str, path: str, params: dict[str, str], timeout_s: float = 10.0) -> Any:
    """GET a Prometheus HTTP API path; its ``data``, or ValueError with Prometheus's error."""
    url = f"{base_url.rstrip('/')}{path}?{urllib.parse.urlencode(params)}"
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as r:
            body = json.load(r)
    except urllib.error.HTTPError as exc:  # 400/422: a bad query, the reason in the body
        body = json.load(exc)
    if body.get("status") != "success":
        raise ValueError(f"{path} {params}: {body.get('errorType')}: {body.get('error')}")
    return body["data"]


def check_query(base_url: str, q: Query, values: dict[str, str]) -> Checked:
    """Run one query as Grafana would and say what it draws and what is wrong with it."""
    sent = expand(q.expr, values)
    out = Checked(q, sent)
    lv = LABEL_VALUES.match(sent)
    try:
        if lv:
            found = api(base_url, f"/api/v1/label/{lv.group(2)}/values", {"match[]": lv.group(1)})
            out.legends = list(found)
            if not found:
                out.problems.append("no label values")
            return out
        data = api(base_url, "/api/v1/query", {"query": sent})
    except ValueError as exc:
        out.problems.append(str(exc))
        return out
    series = data["result"] if data["resultType"] == "vector" else []
    if not series:
        out.problems.append("no series")
    for s in series:
        labels = {k: v for k, v in s["metric"].items() if k != "__name__"}
        value = float(s["value"][1])
        out.values.append(value)
        out.legends.append(draw_legend(q.legend, labels) if q.legend else "")
        out.problems += legend_problems(q.legend, labels)
        if not math.isfinite(value):
            out.problems.append(f"{labels}: value {s['value'][1]} (the panel draws nothing)")
    return out


def check_dashboard(
    base_url: str, doc: dict[str, Any], values: dict[str, str] | None = None
) -> list[Checked]:
    """Every query of the dashboard (:func:`dashboard_queries`) checked (:func:`check_query`)
    with the variables at ``values`` (default :func:`all_values`)."""
    vals = all_values(doc) if values is None else values
    return [check_query(base_url, q, vals) for q in dashboard_queries(doc)]


def markdown_table(checked: list[Checked]) -> str:
    """The checks as a Markdown table: where, query as sent, values, legends as drawn, problems."""
    cell = lambda s: str(s).replace("|", "\\|")  # noqa: E731
    rows = [
        "| where | query (as sent) | result | legend as drawn | problems |",
        "|---|---|---|---|---|",
    ]
    for c in checked:
        vals = ", ".join(f"{v:.4g}" for v in c.values) if c.values else f"{len(c.legends)} values"
        legends = ", ".join(f"`{x}`" for x in c.legends) or "-"
        rows.append(
            f"| {cell(c.query.where)} | `{cell(c.sent)}` | {cell(vals)} | {cell(legends)} "
            f"| {cell('; '.join(c.problems)) or 'none'} |"
        )
    return "\n".join(rows) + "\n"
