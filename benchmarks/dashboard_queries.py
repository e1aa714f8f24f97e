"""Every query of the shipped Grafana dashboard through a real Prometheus: the table of what
an operator sees during a grid event.

Usage: python benchmarks/dashboard_queries.py [--out benchmarks/results/dashboard_queries.md]

Debian's Prometheus (``prometheus`` on PATH), configured by resources/prometheus/prometheus.yml
(targets replaced, 1 s scrapes), scrapes ``wattflex control`` on two FAKE NVML H200s
(tests/fakes/fake_pynvml.py: the GPUs are fake, controller, exporter and Prometheus real),
each GPU's job a FAKE trainer (tests/fakes/fake_trainer.py, 20,000 and 8,000 tokens/s
uncapped) whose torchtitan log the controller follows (--throughput-log), during a 0.7 event (queried once Prometheus holds 58 s of it, so every window is full),
dcgm-exporter's GPU-to-job mapping naming SLURM jobs 4242 and 4243; then
every panel target, event annotation and variable of resources/grafana/wattflex.json goes
through the HTTP API (``wattflex.ops.services.dashboard.check_dashboard``, variables at "All").
Writes a Markdown table to ``--out``: where, query as sent, result, legend as drawn, problems.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO), str(REPO / "workflow_scripts")]

from tests.fakes import fake_pynvml  # noqa: E402
from tests.prometheus_server import control_during_event  # noqa: E402
from wattflex.ops.services.dashboard import check_dashboard, markdown_table  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=str(REPO / "benchmarks/results/dashboard_queries.md"))
    args = ap.parse_args()
    doc = json.loads((REPO / "resources/grafana/wattflex.json").read_text())
    version = subprocess.run(
        ["prometheus", "--version"], capture_output=True, text=True
    ).stdout.splitlines()[0]
    with tempfile.TemporaryDirectory() as tmp:
        fake_pynvml.reset(n_gpus=2, path=Path(tmp) / "gpus.json")
        t0 = time.time()
        # 58 scrapes (of at most 60 a minute): every window of the dashboard ([1m] the longest) full of samples
        with control_during_event(Path(tmp), {0: "4242", 1: "4243"}, samples=58) as (url, _):
            checked = check_dashboard(url, doc)
        wall = time.time() - t0
    bad = [c for c in checked if c.problems]
    text = (
        "# The Grafana dashboard's queries through a real Prometheus\n\n"
        "Command: `python benchmarks/dashboard_queries.py` (module docstring: the setup). "
        f"{version}; `wattflex control` on two FAKE NVML H200s (fake GPUs, real controller, "
        "exporter and Prometheus), following two FAKE trainers' torchtitan logs, during a 0.7 event, 0.2 s periods, 1 s scrapes, queried "
        "after 58 scrapes; "
        "variables at All, `$__range` 1m, `$__rate_interval` 15s; instant queries. "
        f"{len(checked)} queries, {len(bad)} with a problem; {wall:.0f} s wall. The "
        "`wattflex_site_*` queries are cluster-control's coordinator's: a node's `control` "
        "serves none (no series here); tests/workflow/test_slurm_grid.py runs every query on "
        "a two-node SLURM event, agents and coordinator scraped.\n\n" + markdown_table(checked)
    )
    Path(args.out).write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
