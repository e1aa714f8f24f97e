"""Prometheus exporter of a controlled run (``prometheus_client``), updated every control period.

Metrics (Prometheus base units: watts, hertz, joules; a ``wattflex_`` prefix; labels
``node``, ``gpu``, ``workload`` (the controller's job: its GPUs, e.g. ``gpu0+1``) and
``hpc_job``). The training job is ``workload``, never ``job``: Prometheus attaches its own
``job`` (the scrape job) to every series and renames a clashing exported one to
``exported_job``. ``hpc_job`` is the SLURM job id as dcgm-exporter names it, read the way
dcgm-exporter reads it (``--hpc-job-mapping-dir``: one file per GPU index, one job id a
line, written by the site's prolog/epilog); empty without a mapping.

- per GPU: ``wattflex_gpu_power_watts``, ``wattflex_gpu_power_limit_watts`` (the limit
  set), ``wattflex_gpu_enforced_limit_watts``, ``wattflex_gpu_sm_clock_hertz``,
  ``wattflex_gpu_energy_joules_total`` (NVML's total-energy counter, counted from the
  controller's start);
- per job: ``wattflex_job_tokens_per_second`` (NaN where the job reports none: a GPU does
  not know tokens), ``wattflex_job_cap_watts``, ``wattflex_job_energy_joules_total`` (its
  GPUs' counters summed), ``wattflex_job_pfi{source}`` (``measured``
  from the controller's learned curve once it has observations, else ``predicted``: the
  prior from the job's uncapped telemetry);
- per cluster (the GPUs this controller governs): ``wattflex_cluster_budget_watts`` (NaN
  outside an event), ``wattflex_cluster_power_watts``, ``wattflex_cluster_headroom_watts``
  (budget - load), ``wattflex_cluster_sheddable_watts{max_loss}`` at <= 10 / 25 / 50 %
  throughput loss per job, from the curves the controller allocates on
  (:func:`wattflex.ops.services.offer.sheddable_w`), ``wattflex_cluster_event_active`` (1 while an
  event's budget holds, else 0: the dashboard's event annotations) and
  ``wattflex_control_periods_total``;
- per site (``cluster-control``'s coordinator, :class:`SiteExporter`): ``wattflex_site_budget_watts``
  (NaN: no event), ``wattflex_site_power_watts`` (its units' load, a silent one at its GPUs'
  maximum), ``wattflex_site_headroom_watts``, ``wattflex_site_event_active`` and
  ``wattflex_site_units{state}`` (``answering`` or ``silent``). Its agents export the metrics
  above (``hpc_job`` their SLURM job) on a free port each, listed for Prometheus's
  ``file_sd_configs`` by :func:`write_targets`.

The HTTP server listens on 127.0.0.1 unless told otherwise (a node's metrics are not for
the world; Prometheus scrapes it through the site's usual node-local path).
"""

from __future__ import annotations

import math
import os
import urllib.parse
from pathlib import Path
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, start_http_server

from wattflex.allocation.curves import Curves
from wattflex.ops.services.offer import LOSSES, sheddable_w
from wattflex.provenance import strict_json

GPU_LABELS = ("node", "gpu", "workload", "hpc_job")
JOB_LABELS = ("node", "workload", "hpc_job")
METRICS = {  # name: (help, labels)
    "wattflex_gpu_power_watts": ("GPU power draw", GPU_LABELS),
    "wattflex_gpu_power_limit_watts": ("GPU power limit set", GPU_LABELS),
    "wattflex_gpu_enforced_limit_watts": ("GPU power limit the firmware enforces", GPU_LABELS),
    "wattflex_gpu_sm_clock_hertz": ("GPU SM clock", GPU_LABELS),
    "wattflex_job_tokens_per_second": ("job throughput (NaN: not reported)", JOB_LABELS),
    "wattflex_job_cap_watts": ("per-GPU cap the controller set for the job", JOB_LABELS),
    "wattflex_job_pfi": (
        "job Power Flexibility Index and where it comes from",
        (*JOB_LABELS, "source"),
    ),
    "wattflex_cluster_budget_watts": ("power budget of the event (NaN: no event)", ()),
    "wattflex_cluster_power_watts": ("measured load of the governed GPUs", ()),
    "wattflex_cluster_headroom_watts": ("budget minus measured load (NaN: no event)", ()),
    "wattflex_cluster_sheddable_watts": (
        "power sheddable keeping each job's throughput loss at or below max_loss",
        ("max_loss",),
    ),
    "wattflex_cluster_event_active": ("1 while an event's budget holds, else 0", ()),
}
COUNTERS = {  # name (Prometheus adds _total): (help, labels)
    "wattflex_gpu_energy_joules": ("GPU energy since the controller started", GPU_LABELS),
    "wattflex_job_energy_joules": (
        "job energy (its GPUs) since the controller started",
        JOB_LABELS,
    ),
}


class Served:
    """A registry served over HTTP on ``addr:port`` (port 0: a free one, see ``port``)."""

    registry: CollectorRegistry

    def serve(self, port: int, addr: str) -> None:
        """Start the HTTP server of ``self.registry`` (OSError: the port is not free)."""
        self.server, self.thread = start_http_server(port, addr, registry=self.registry)
        self.addr, self.port = addr, int(self.server.server_port)

    @property
    def url(self) -> str:
        return f"http://{self.addr}:{self.port}/metrics"

    def close(self) -> None:
        """Stop serving."""
        self.server.shutdown()
        self.server.server_close()


class ControlExporter(Served):
    """A registry of the metrics above served on ``addr:port`` (port 0: a free one, see
    ``port``); ``hpc_job_dir``: dcgm-exporter's GPU-to-job mapping folder (None: no ``hpc_job``)."""

    def __init__(
        self,
        port: int = 0,
        addr: str = "127.0.0.1",
        hpc_job_dir: str | Path | None = None,
        hpc_job: str = "",
    ):
        self.registry = CollectorRegistry()
        self.gauges = {
            name: Gauge(name, doc, labels, registry=self.registry)
            for name, (doc, labels) in METRICS.items()
        }
        self.counters = {
            name: Counter(name, doc, labels, registry=self.registry)
            for name, (doc, labels) in COUNTERS.items()
        }
        self.hpc_job_dir = Path(hpc_job_dir) if hpc_job_dir else None
        self.hpc_job_id = hpc_job  # the job of every GPU here (a cluster-control agent's)
        self._energy_j: dict[tuple[str, str], float] = {}  # (node, gpu): last energy_j counted
        self.periods = Counter(
            "wattflex_control_periods", "control periods run", registry=self.registry
        )
        self.serve(port, addr)

    def hpc_job(self, gpus: list[str]) -> str:
        """The SLURM job ids on these GPUs from the mapping folder (``,``-joined, sorted):
        dcgm-exporter's ``hpc_job``, rewritten by the prolog per job; without a folder, the
        job this controller was given (empty: none)."""
        if self.hpc_job_dir is None:
            return self.hpc_job_id
        ids = set()
        for gpu in gpus:
            try:
                ids |= set((self.hpc_job_dir / gpu).read_text().split())
            except (FileNotFoundError, NotADirectoryError):
                continue  # no job on this GPU now
        return ",".join(sorted(ids))

    def _count_energy(self, lab: tuple[str, ...], row: dict) -> float:
        """Joules the GPU used since its last period (its NVML counter's step; 0 on a reset or
        a missing reading), added to its counter."""
        e = float(row.get("energy_j", math.nan))
        key = lab[:2]
        last = self._energy_j.get(key)
        step = e - last if last is not None and math.isfinite(e) and e >= last else 0.0
        if math.isfinite(e):
            self._energy_j[key] = e
        self.counters["wattflex_gpu_energy_joules"].labels(*lab).inc(step)
        return step

    def update(self, rec: Any, jobs: Any) -> None:
        """From a :class:`wattflex.ops.services.node_agent.LoopRecord` after a period and its jobs."""
        g = self.gauges
        ctl = rec.controller
        caps = rec.caps_w[-1]
        job_labels = []
        for job, raw, cap in zip(jobs, rec.last_readings, caps):
            rows = raw.get("gpus", [])
            node = str(rows[0].get("node", "")) if rows else ""
            hpc = self.hpc_job([str(r.get("gpu", "")) for r in rows])
            jlab = (node, job.job_id, hpc)
            job_labels.append(jlab)
            energy = 0.0
            for row in rows:
                lab = (str(row.get("node", "")), str(row.get("gpu", "")), job.job_id, hpc)
                energy += self._count_energy(lab, row)
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
            self.counters["wattflex_job_energy_joules"].labels(*jlab).inc(energy)
            g["wattflex_job_tokens_per_second"].labels(*jlab).set(
                float(raw.get("tokens_per_s", math.nan))
            )
            g["wattflex_job_cap_watts"].labels(*jlab).set(float(cap))
        if ctl is not None:
            est = ctl.estimates()
            for s, jlab in enumerate(job_labels):
                measured = est["n_obs"][0, s] > 0
                src, other = ("measured", "predicted") if measured else ("predicted", "measured")
                g["wattflex_job_pfi"].labels(*jlab, src).set(
                    float(est["pfi_learned"][0, s] if measured else est["pfi_prior"][s])
                )
                if (*jlab, other) in _label_sets(g["wattflex_job_pfi"]):
                    g["wattflex_job_pfi"].remove(*jlab, other)  # one source per job at a time
            curves = Curves(ctl.knots_w, ctl.curves_t[0])
            shed = sheddable_w(curves, LOSSES).sum(0)
            for loss, w in zip(LOSSES, shed):
                g["wattflex_cluster_sheddable_watts"].labels(f"{loss:.2f}").set(float(w))
        budget, power = rec.budget_w[-1], rec.power_w[-1]
        g["wattflex_cluster_budget_watts"].set(budget if math.isfinite(budget) else math.nan)
        g["wattflex_cluster_power_watts"].set(power)
        g["wattflex_cluster_event_active"].set(1.0 if math.isfinite(budget) else 0.0)
        g["wattflex_cluster_headroom_watts"].set(
            budget - power if math.isfinite(budget) else math.nan
        )
        self.periods.inc()


def _label_sets(gauge: Gauge) -> set[tuple[str, ...]]:
    return {tuple(s.labels.values()) for m in gauge.collect() for s in m.samples}


def metric_names() -> list[str]:
    """Every metric of a controller (``control``, an agent) as Prometheus exposes it."""
    return sorted([*METRICS, *(f"{c}_total" for c in COUNTERS), "wattflex_control_periods_total"])


SITE_METRICS = {  # name: (help, labels)
    "wattflex_site_budget_watts": ("the site's event budget (NaN: no event)", ()),
    "wattflex_site_power_watts": ("the site's GPU load (a silent unit at its maximum)", ()),
    "wattflex_site_headroom_watts": ("site budget minus load (NaN: no event)", ()),
    "wattflex_site_event_active": ("1 while an event's budget holds, else 0", ()),
    "wattflex_site_units": ("cluster-control's units (job x node) by state", ("state",)),
}


class SiteExporter(Served):
    """``cluster-control``'s coordinator metrics (:data:`SITE_METRICS`) on ``addr:port``."""

    def __init__(self, port: int = 0, addr: str = "127.0.0.1"):
        self.registry = CollectorRegistry()
        self.gauges = {
            name: Gauge(name, doc, labels, registry=self.registry)
            for name, (doc, labels) in SITE_METRICS.items()
        }
        self.serve(port, addr)

    def update(self, rec: Any, loads: list[dict | None]) -> None:
        """From a :class:`wattflex.ops.services.coordinator.ClusterRecord` after a period and its units'
        load files (None: silent)."""
        g = self.gauges
        budget, power = rec.budget_w[-1], rec.power_w[-1]
        event = math.isfinite(budget)
        g["wattflex_site_budget_watts"].set(budget if event else math.nan)
        g["wattflex_site_power_watts"].set(power)
        g["wattflex_site_headroom_watts"].set(budget - power if event else math.nan)
        g["wattflex_site_event_active"].set(1.0 if event else 0.0)
        answering = sum(d is not None for d in loads)
        g["wattflex_site_units"].labels("answering").set(answering)
        g["wattflex_site_units"].labels("silent").set(len(loads) - answering)


def write_targets(path: str | Path, loads: list[dict | None]) -> None:
    """The agents' metrics endpoints (``metrics_url`` of their load files) as a Prometheus
    ``file_sd_configs`` file (JSON: one group, its ``targets`` host:port), written whole
    (Prometheus rereads it when it changes)."""
    hosts = sorted(
        {
            urllib.parse.urlsplit(d["metrics_url"]).netloc
            for d in loads
            if d is not None and d.get("metrics_url")
        }
    )
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    tmp.write_text(strict_json([{"targets": hosts, "labels": {}}], indent=1) + "\n")
    tmp.replace(path)


def site_metric_names() -> list[str]:
    """Every metric of cluster-control's coordinator (:class:`SiteExporter`)."""
    return sorted(SITE_METRICS)
