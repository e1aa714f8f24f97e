"""The shipped Grafana dashboard as a picture, drawn by a real Prometheus from a grid event.

Usage: python benchmarks/dashboard_picture.py [--out docs/images/dashboard-prometheus.png]

There is no Grafana here (not in Debian's archive), so the picture is the next most honest
thing: Debian's Prometheus (``prometheus`` on PATH, the shipped resources/prometheus/
prometheus.yml, 1 s scrapes) scrapes ``wattflex control`` on two FAKE NVML H200s
(tests/fakes/fake_pynvml.py: the GPUs are fake; controller, exporter and Prometheus are real),
each GPU's job a FAKE trainer following its GPU's power (tests/prometheus_server.py), through a
0.7 event from 50 s to 110 s; the graphs run from 30 s before it to 15 s after it. Then Prometheus's own console page (its console templates and
``prom_console.js`` graphs, served by Prometheus) draws every time-series panel of
resources/grafana/wattflex.json that a node's ``control`` feeds: each panel's queries as the
dashboard has them (variables at "All", ``wattflex.ops.services.dashboard.expand``), its legend
format (``{{label}}`` as the console's ``[[label]]``) and its unit; headless Chromium takes
the screenshot. The ``wattflex_site_*`` panels (cluster-control's coordinator), the stat
panels and Grafana's own look are not in it: the page says so.
"""

from __future__ import annotations

import argparse
import html
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO), str(REPO / "workflow_scripts")]

from tests.fakes import fake_pynvml  # noqa: E402
from tests.prometheus_server import control_during_event  # noqa: E402
from wattflex.ops.services.dashboard import all_values, api, expand  # noqa: E402

EVENT_S = (50.0, 110.0)  # the event, seconds after control starts (which exits at its end)
BEFORE_S, AFTER_S = 30.0, 15.0  # the graphs' range: this long before and after the event
EVENT_ACTIVE = "max(wattflex_cluster_event_active) == 1"
UNITS = {"watt": "W", "hertz": "Hz", "kwatth": "kWh"}  # Grafana unit id: the console's suffix
STATIC = "/classic/static"  # where Debian's Prometheus 2.42 serves its classic UI's files
HEAD = [
    f'<link rel="stylesheet" href="{STATIC}/rickshaw/rickshaw.min.css">',
    f'<link rel="stylesheet" href="{STATIC}/bootstrap4/css/bootstrap.min.css">',
    f'<link rel="stylesheet" href="{STATIC}/css/prom_console.css">',
    f'<script src="{STATIC}/jquery/jquery.min.js"></script>',
    f'<script src="{STATIC}/d3/d3.min.js"></script>',
    f'<script src="{STATIC}/rickshaw/rickshaw.min.js"></script>',
    '<script>var PATH_PREFIX = "";</script>',
    f'<script src="{STATIC}/js/prom_console.js"></script>',
    # Grafana's legend: {{label}} is the label's value, or nothing (prom_console's own [[label]]
    # drops the text after the last label); numbers without prom_console's 0.000e+0
    "<script>function legend(fmt) { return m => fmt.replace(/\\{\\{\\s*(\\w+)\\s*\\}\\}/g, "
    '(_, k) => m[k] || ""); }',
    "function number(x) { return x === 0 ? '0' : Math.abs(x) < 1 ? x.toPrecision(2) : "
    "PromConsole.NumberFormatter.humanize(x); }</script>",
]


def panels(doc: dict[str, Any]) -> list[dict[str, Any]]:
    """The dashboard's time-series panels a node's ``control`` feeds (not the coordinator's
    ``wattflex_site_*``), in the dashboard's order."""
    return [
        p
        for p in doc["panels"]
        if p.get("type") == "timeseries"
        and not all("wattflex_site_" in t["expr"] for t in p.get("targets", []))
    ]


def console_page(doc: dict[str, Any], window_s: float, end_time: float) -> str:
    """A Prometheus console template drawing :func:`panels`, two to a row, over the
    ``window_s`` seconds up to ``end_time`` (Unix seconds)."""
    values = all_values(doc)
    cells = []
    for i, p in enumerate(panels(doc)):
        unit = p.get("fieldConfig", {}).get("defaults", {}).get("unit")
        graph = {
            "expr": [expand(t["expr"], values) for t in p["targets"]],
            "yUnits": UNITS.get(unit, ""),
            "duration": window_s,
            "endTime": end_time,
            "width": 640,  # half the page, none clipped at its right
            "height": 170,
        }
        if unit == "none":  # a ratio or a rate, never below 0: a constant one stays in view
            graph["min"] = 0
        legends = json.dumps([t.get("legendFormat", "") for t in p["targets"]])
        cells.append(
            f'<div class="col-6"><h6>{html.escape(p["title"])}</h6><div id="g{i}"></div>'
            f"<script>new PromConsole.Graph(Object.assign({json.dumps(graph)}, "
            f'{{node: document.querySelector("#g{i}"), name: {legends}.map(legend), '
            "yAxisFormatter: number}));</script></div>"
        )
    note = (
        "The shipped Grafana dashboard's time-series panels (resources/grafana/wattflex.json: "
        "its queries, legend formats and units) drawn by Prometheus's own console page from a real "
        "Prometheus scraping <code>wattflex control</code> on two FAKE NVML GPUs during a 0.7 "
        "grid event. Not a Grafana screenshot; the stat panels and the cluster-control panels "
        "are left out."
    )
    return (
        "<html><head>" + "".join(HEAD) + '</head><body class="p-2" style="font-size:13px">'
        f'<p class="mb-1">{note}</p><div class="row">' + "".join(cells) + "</div></body></html>"
    ).replace("{{", '{{"{{"}}')  # a literal '{{' in a Go template


def event_start(url: str, timeout_s: float = 180.0) -> float:
    """When Prometheus first holds the event as active (``wattflex_cluster_event_active``,
    the metric of the dashboard's event annotation), in Unix seconds."""
    deadline = time.time() + timeout_s
    while not api(url, "/api/v1/query", {"query": EVENT_ACTIVE})["result"]:
        if time.time() > deadline:
            raise TimeoutError(f"no event seen in {timeout_s:.0f} s")
        time.sleep(0.5)
    return time.time()


def screenshot(url: str, out: Path, height: int) -> None:
    """Headless Chromium's 1400 px wide screenshot of ``url`` (scripts given 8 s) to ``out``."""
    subprocess.run(
        ["chromium", "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars"]
        + [f"--window-size=1400,{height}", "--virtual-time-budget=8000"]
        + [f"--screenshot={out}", url],
        check=True,
        capture_output=True,
        timeout=120,
    )


def main() -> int:
    """Run the event, draw the page, take the screenshot; print what it did."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=str(REPO / "docs/images/dashboard-prometheus.png"))
    args = ap.parse_args()
    doc = json.loads((REPO / "resources/grafana/wattflex.json").read_text())
    rows = (len(panels(doc)) + 1) // 2
    with tempfile.TemporaryDirectory() as tmp:
        consoles = Path(tmp) / "consoles"
        consoles.mkdir()
        fake_pynvml.reset(n_gpus=2, path=Path(tmp) / "gpus.json")
        flags = (f"--web.console.templates={consoles}", f"--web.console.libraries={consoles}")
        t0 = time.time()
        with control_during_event(
            Path(tmp), {0: "4242", 1: "4243"}, samples=5, event_s=EVENT_S, prometheus_flags=flags
        ) as (url, _):
            start = event_start(url)
            end = start + EVENT_S[1] - EVENT_S[0] + AFTER_S
            page = console_page(doc, end - start + BEFORE_S, end)
            (consoles / "dashboard.html").write_text(page)
            time.sleep(max(0.0, end + 2 - time.time()))
            screenshot(f"{url}/consoles/dashboard.html", Path(args.out), 70 + 245 * rows)
    version = subprocess.run(
        ["prometheus", "--version"], capture_output=True, text=True
    ).stdout.splitlines()[0]
    print(f"{args.out}: {len(panels(doc))} panels, {version}, {time.time() - t0:.0f} s wall")
    return 0


if __name__ == "__main__":
    sys.exit(main())
