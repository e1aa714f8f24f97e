"""Prometheus exporter of a controlled run (``prometheus_client``), updated every control period.

Metrics (Prometheus base units: watts, hertz; a ``wattflex_`` prefix; labels ``node``,
``gpu``, ``job``):

- per GPU: ``wattflex_gpu_power_watts``, ``wattflex_gpu_power_limit_watts`` (the limit
  set), ``wattflex_gpu_enforced_limit_watts``, ``wattflex_gpu_sm_clock_hertz``;
- per job: ``wattflex_job_tokens_per_second`` (NaN where the job reports none: a GPU does
  not know tokens), ``wattflex_job_cap_watts``, ``wattflex_job_pfi{source}`` (``measured``
  from the controller's learned curve once it has observations, else ``predicted``: the
  prior from the job's uncapped telemetry);
- per cluster (the GPUs this controller governs): ``wattflex_cluster_budget_watts`` (NaN
  outside an event), ``wattflex_cluster_power_watts``, ``wattflex_cluster_headroom_watts``
  (budget - load), ``wattflex_cluster_sheddable_watts{max_loss}`` at <= 10 / 25 / 50 %
  throughput loss per job, from the curves the controller allocates on
  (:func:`wattflex.grid.offer.sheddable_w`), and ``wattflex_control_periods_total``.

The HTTP server listens on 127.0.0.1 unless told otherwise (a node's metrics are not for
the world; Prometheus scrapes it through the site's usual node-local path).
"""

from __future__ import annotations

import math
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, start_http_server

from wattflex.allocation.curves import Curves
from wattflex.grid.offer import LOSSES, sheddable_w

GPU_LABELS = ("node", "gpu", "job")
METRICS = {  # name: (help, labels)
    "wattflex_gpu_power_watts": ("GPU power draw", GPU_LABELS),
    "wattflex_gpu_power_limit_watts": ("GPU power limit set", GPU_LABELS),
    "wattflex_gpu_enforced_limit_watts": ("GPU power limit the firmware enforces", GPU_LABELS),
    "wattflex_gpu_sm_clock_hertz": ("GPU SM clock", GPU_LABELS),
    "wattflex_job_tokens_per_second": ("job throughput (NaN: not reported)", ("job",)),
    "wattflex_job_cap_watts": ("per-GPU cap the controller set for the job", ("job",)),
    "wattflex_job_pfi": ("job Power Flexibility Index and where it comes from", ("job", "source")),
    "wattflex_cluster_budget_watts": ("power budget of the event (NaN: no event)", ()),
    "wattflex_cluster_power_watts": ("measured load of the governed GPUs", ()),
    "wattflex_cluster_headroom_watts": ("budget minus measured load (NaN: no event)", ()),
    "wattflex_cluster_sheddable_watts": (
        "power sheddable keeping each job's throughput loss at or below max_loss",
        ("max_loss",),
    ),
}


class ControlExporter:
    """A registry of the metrics above served on ``addr:port`` (port 0: a free one, see ``port``)."""

    def __init__(self, port: int = 0, addr: str = "127.0.0.1"):
        self.registry = CollectorRegistry()
        self.gauges = {
            name: Gauge(name, doc, labels, registry=self.registry)
            for name, (doc, labels) in METRICS.items()
        }
        self.periods = Counter(
            "wattflex_control_periods", "control periods run", registry=self.registry
        )
        self.server, self.thread = start_http_server(port, addr, registry=self.registry)
        self.addr, self.port = addr, int(self.server.server_port)

    @property
    def url(self) -> str:
        return f"http://{self.addr}:{self.port}/metrics"

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()

    def update(self, rec: Any, jobs: Any) -> None:
        """From a :class:`wattflex.control.loop.LoopRecord` after a period and its jobs."""
        g = self.gauges
        ctl = rec.controller
        caps = rec.caps_w[-1]
        for job, raw, cap in zip(jobs, rec.last_readings, caps):
            for row in raw.get("gpus", []):
                lab = (str(row.get("node", "")), str(row.get("gpu", "")), job.job_id)
                g["wattflex_gpu_power_watts"].labels(*lab).set(float(row.get("power_w", math.nan)))
                g["wattflex_gpu_power_limit_watts"].labels(*lab).set(
                    float(row.get("power_limit_w", math.nan))
                )
                g["wattflex_gpu_enforced_limit_watts"].labels(*lab).set(
                    float(row.get("enforced_limit_w", math.nan))
                )
                g["wattflex_gpu_sm_clock_hertz"].labels(*lab).set(
                    float(row.get("sm_clock_mhz", math.nan)) * 1e6
                )
            g["wattflex_job_tokens_per_second"].labels(job.job_id).set(
                float(raw.get("tokens_per_s", math.nan))
            )
            g["wattflex_job_cap_watts"].labels(job.job_id).set(float(cap))
        if ctl is not None:
            est = ctl.estimates()
            for s, job in enumerate(jobs):
                measured = est["n_obs"][0, s] > 0
                src, other = ("measured", "predicted") if measured else ("predicted", "measured")
                g["wattflex_job_pfi"].labels(job.job_id, src).set(
                    float(est["pfi_learned"][0, s] if measured else est["pfi_prior"][s])
                )
                if (job.job_id, other) in _label_sets(g["wattflex_job_pfi"]):
                    g["wattflex_job_pfi"].remove(job.job_id, other)  # one source per job at a time
            curves = Curves(ctl.knots_w, ctl.curves_t[0])
            shed = sheddable_w(curves, LOSSES).sum(0)
            for loss, w in zip(LOSSES, shed):
                g["wattflex_cluster_sheddable_watts"].labels(f"{loss:.2f}").set(float(w))
        budget, power = rec.budget_w[-1], rec.power_w[-1]
        g["wattflex_cluster_budget_watts"].set(budget if math.isfinite(budget) else math.nan)
        g["wattflex_cluster_power_watts"].set(power)
        g["wattflex_cluster_headroom_watts"].set(
            budget - power if math.isfinite(budget) else math.nan
        )
        self.periods.inc()


def _label_sets(gauge: Gauge) -> set[tuple[str, ...]]:
    return {tuple(s.labels.values()) for m in gauge.collect() for s in m.samples}


def metric_names() -> list[str]:
    """Every exported metric's name as Prometheus exposes it."""
    return sorted([*METRICS, "wattflex_control_periods_total"])
