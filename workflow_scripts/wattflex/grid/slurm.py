"""Cluster-wide events on SLURM: jobs and GPUs from SLURM itself, the event's budget split
over (job, node) units, one agent per unit.

**Discovery.** ``squeue --json --states=RUNNING`` lists the running jobs; a job's nodes come
from its ``nodes`` host list and its GPUs on each node from ``gres_detail``
(``gpu[:type]:N(IDX:0-3)``, one entry per node in host-list order). Nothing here schedules.

**Agents.** One ``wattflex control --budget-file`` per (job, node), started as a job step
inside the job's own allocation: ``srun --overlap --jobid=J --nodes=1 --ntasks=1 -w NODE``
(:func:`agent_command`), asking for the job's GPUs on that node (``--gres``). Why a step,
not a node service: the step sees exactly the job's GPUs (Slurm's cgroup device constraint
and ``CUDA_VISIBLE_DEVICES``), needs no daemon or
root service beside ``slurmd``, is accounted to the job and ends with it, and the caps it
sets are restored on exit and by the epilog's ``wattflex restore-caps`` as for any run
(profiles/slurm). A node service would need its own job-to-GPU map, privileges and
lifecycle, which is what Slurm already keeps per step.

**Budget split.** Every unit writes its measured load to ``<dir>/<unit>.load.json`` each
period. A unit whose load file is older than ``stale_s`` (a node that stops answering) is
counted at its uncapped power (GPUs x maximum limit) and gets no share; the rest of the
budget is water-filled over the answering units above their floors with equal weights
(:func:`wattflex.allocation.allocator.water_fill`, the equal-weight policy), and each
agent splits its unit's share over its GPUs with the controller's policy. Budgets go to
``<dir>/<unit>.budget.json`` with the end of the event; an agent whose budget file goes
stale holds the last budget to that end, then restores.
"""

from __future__ import annotations

import json
import math
import os
import re
import shlex
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np

from wattflex.allocation.allocator import water_fill


@dataclass(frozen=True)
class SlurmJob:
    job_id: str
    name: str
    gpus: dict[str, tuple[int, ...]]      # node -> GPU indices on it

    def units(self) -> list[str]:
        return [unit_name(self.job_id, n) for n in self.gpus]


def unit_name(job_id: str, node: str) -> str:
    return f"{job_id}.{node}"


def expand_hostlist(spec: str) -> list[str]:
    """``node[0-2,5],gpu7`` -> node0, node1, node2, node5, gpu7 (Slurm host-list syntax)."""
    out: list[str] = []
    for m in re.finditer(r"([^,\[]+)(?:\[([^\]]+)\])?", spec):
        prefix, ranges = m.group(1), m.group(2)
        if ranges is None:
            out.append(prefix)
            continue
        for part in ranges.split(","):
            lo, _, hi = part.partition("-")
            width = len(lo)
            out += [f"{prefix}{i:0{width}d}" for i in range(int(lo), int(hi or lo) + 1)]
    return out


def gres_indices(entry: str) -> tuple[int, ...]:
    """GPU indices of one ``gres_detail`` entry, e.g. ``gpu:h200:2(IDX:0-1)`` -> (0, 1)."""
    m = re.search(r"gpu[^()]*\(IDX:([^)]*)\)", entry)
    if not m or m.group(1) in ("", "N/A"):
        return ()
    idx: list[int] = []
    for part in m.group(1).split(","):
        lo, _, hi = part.partition("-")
        idx += list(range(int(lo), int(hi or lo) + 1))
    return tuple(idx)


def _state(job: Mapping[str, Any]) -> str:
    s = job.get("job_state", "")
    return str(s[0] if isinstance(s, list) and s else s)      # a list from Slurm 23.02 on


def parse_squeue(doc: Mapping[str, Any]) -> list[SlurmJob]:
    """Running jobs holding GPUs, from ``squeue --json``."""
    jobs = []
    for j in doc.get("jobs", []):
        if _state(j) != "RUNNING":
            continue
        nodes = expand_hostlist(str(j.get("nodes", "")))
        detail = list(j.get("gres_detail") or [])
        gpus = {n: gres_indices(d) for n, d in zip(nodes, detail)}
        gpus = {n: g for n, g in gpus.items() if g}
        if gpus:
            jobs.append(SlurmJob(str(j["job_id"]), str(j.get("name", "")), gpus))
    return jobs


def discover(squeue: str = "squeue") -> list[SlurmJob]:
    """The running GPU jobs as SLURM reports them now."""
    out = subprocess.run([squeue, "--json", "--states=RUNNING"], capture_output=True, text=True, timeout=60)
    if out.returncode != 0:
        raise RuntimeError(f"{squeue} --json failed ({out.returncode}): {out.stderr.strip()[:200]}")
    return parse_squeue(json.loads(out.stdout))


def agent_command(job: SlurmJob, node: str, budget_dir: Path, period_s: float, duration_s: float,
                  policy: str = "equal-weight", wattflex: str = "wattflex", state_dir: str | None = None) -> list[str]:
    """The job step that runs the agent of (job, node) inside the job's allocation
    (``state_dir``: its cap state folder, ``{node}`` replaced; default: the node's own)."""
    unit = unit_name(job.job_id, node)
    where = ["--state-dir", state_dir.replace("{node}", node)] if state_dir else []
    return ["srun", "--overlap", f"--jobid={job.job_id}", "--nodes=1", "--ntasks=1", f"--nodelist={node}",
            f"--gres=gpu:{len(job.gpus[node])}", f"--job-name=wattflex-agent-{unit}", wattflex, "control",
            "--budget-file", str(budget_dir / f"{unit}.budget.json"),
            "--load-file", str(budget_dir / f"{unit}.load.json"),
            "--period-s", f"{period_s:g}", "--duration-s", f"{duration_s:g}", "--policy", policy, *where]


# ---------------------------------------------------------------------------------------
# The split, and the files between coordinator and agents
# ---------------------------------------------------------------------------------------

def split_budget(budget_w: float, floor_w: np.ndarray, ceiling_w: np.ndarray, alive: np.ndarray) -> np.ndarray:
    """Per-unit budgets (W): a unit not answering is charged its ceiling (uncapped) and gets
    NaN; the rest water-filled (equal weights) between the answering units' floors and
    ceilings. ``inf`` (no event): every unit inf."""
    floor_w, ceiling_w, alive = (np.asarray(a) for a in (floor_w, ceiling_w, alive))
    if not math.isfinite(budget_w):
        return np.full(len(floor_w), np.inf)
    left = budget_w - ceiling_w[~alive].sum()
    cut = ceiling_w[alive].sum() - left
    share = np.full(len(floor_w), np.nan)
    head = np.where(alive, ceiling_w - floor_w, 0.0)
    shed = water_fill(np.array(max(cut, 0.0)), head, np.where(alive, 1.0, 0.0))
    share[alive] = (ceiling_w - shed)[alive]
    return share


def write_json_atomic(path: Path, doc: Mapping[str, Any]) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(doc))
    tmp.replace(path)


def read_fresh(path: Path, stale_s: float, now: float | None = None) -> dict[str, Any] | None:
    """The JSON document at ``path`` if it was written less than ``stale_s`` ago, else None."""
    try:
        doc = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    now = time.time() if now is None else now
    return doc if now - float(doc.get("t_unix", -math.inf)) <= stale_s else None


class BudgetFile:
    """The agent's side: ``budget_at(t)`` reads the coordinator's file; a stale or missing
    file holds the last budget until the event end it named, then no budget (restore)."""

    def __init__(self, path: str | Path, stale_s: float):
        self.path, self.stale_s = Path(path), stale_s
        self.last: dict[str, Any] = {"budget_w": None, "hold_until_unix": -math.inf}
        self.stale_periods = 0

    def budget_at(self, _t_s: float) -> float:
        doc = read_fresh(self.path, self.stale_s)
        if doc is not None:
            self.last = doc
        else:
            self.stale_periods += 1
            if time.time() >= float(self.last.get("hold_until_unix") or -math.inf):
                return math.inf
        b = self.last.get("budget_w")
        return math.inf if b is None else float(b)


def write_load(path: str | Path, unit: str, load_w: float, caps_w: Sequence[float]) -> None:
    write_json_atomic(Path(path), {"unit": unit, "load_w": float(load_w), "caps_w": [float(c) for c in caps_w],
                                   "t_unix": time.time()})


def coordinate_once(jobs: Sequence[SlurmJob], budget_w: float, hold_until_unix: float, budget_dir: Path,
                    min_w: float, max_w: float, stale_s: float) -> dict[str, float]:
    """One coordinator period: read every unit's load file, split ``budget_w`` (units not
    answering counted at ``max_w`` per GPU), write every unit's budget file."""
    units = [(j, n) for j in jobs for n in j.gpus]
    names = [unit_name(j.job_id, n) for j, n in units]
    gpus = np.array([len(j.gpus[n]) for j, n in units], float)
    alive = np.array([read_fresh(budget_dir / f"{u}.load.json", stale_s) is not None for u in names], bool)
    share = split_budget(budget_w, gpus * min_w, gpus * max_w, alive)
    now = time.time()
    for u, b in zip(names, share):
        write_json_atomic(budget_dir / f"{u}.budget.json",
                          {"budget_w": None if not np.isfinite(b) else float(b), "t_unix": now,
                           "hold_until_unix": hold_until_unix})
    return dict(zip(names, share))


def shell(cmd: Sequence[str]) -> str:
    return " ".join(shlex.quote(c) for c in cmd)


# ---------------------------------------------------------------------------------------
# The coordinator loop
# ---------------------------------------------------------------------------------------

@dataclass
class ClusterRecord:
    """Per coordinator period: time, the cluster budget, the cluster load (answering units'
    measured load + the others at their uncapped power) and how many units answered."""
    t_s: list[float]
    budget_w: list[float]
    power_w: list[float]
    alive: list[int]
    caps_w: list[list[float]]      # (none: caps are the agents'; kept for the M&V writer)


def run_coordinator(source: Any, basis: str, budget_dir: Path, duration_s: float, period_s: float,
                    discover_jobs: Any, launch: Any, *, min_w: float, max_w: float, stale_s: float,
                    clock: Any = time.monotonic, sleep: Any = time.sleep) -> ClusterRecord:
    """Follow ``source`` (a schedule or signal: ``budget(t, basis_w)``, ``active(t)``) over the
    jobs ``discover_jobs()`` reports, ``launch(job, node)`` starting each new unit's agent.
    The basis is ``nominal`` (GPUs x ``max_w``) or ``measured`` (the cluster load of the last
    period before an event). At the end every unit is told: no budget (restore)."""
    rec = ClusterRecord([], [], [], [], [])
    launched: set[str] = set()
    t0, t0_unix = clock(), time.time()
    measured = math.nan
    jobs: list[SlurmJob] = []
    while (t := clock() - t0) <= duration_s:
        jobs = list(discover_jobs())
        for j in jobs:
            for n in j.gpus:
                if unit_name(j.job_id, n) not in launched:
                    launch(j, n)
                    launched.add(unit_name(j.job_id, n))
        units = [(j, n) for j in jobs for n in j.gpus]
        gpus = np.array([len(j.gpus[n]) for j, n in units], float)
        loads = [read_fresh(budget_dir / f"{unit_name(j.job_id, n)}.load.json", stale_s) for j, n in units]
        load = sum(float(d["load_w"]) if d is not None else g * max_w for d, g in zip(loads, gpus))
        in_event = bool(np.asarray(source.active(t)))
        if not in_event:
            measured = load
        basis_w = float(gpus.sum() * max_w) if basis == "nominal" else measured
        budget = float(source.budget(t, basis_w)) if math.isfinite(basis_w) else math.inf
        end = _event_end(source, t)
        coordinate_once(jobs, budget, t0_unix + end if end is not None else -math.inf, budget_dir, min_w, max_w,
                        stale_s)
        rec.t_s.append(t)
        rec.budget_w.append(budget)
        rec.power_w.append(load)
        rec.alive.append(sum(d is not None for d in loads))
        rec.caps_w.append([])
        sleep(max(0.0, t0 + (len(rec.t_s)) * period_s - clock()))
    coordinate_once(jobs, math.inf, -math.inf, budget_dir, min_w, max_w, stale_s)
    return rec


def _event_end(source: Any, t_s: float) -> float | None:
    """End (s) of the event in force at ``t_s``: a schedule's event, or the end of a signal's
    curtailment span (searched on a 1-s grid)."""
    event_at = getattr(source, "event_at", None)
    if event_at is not None:
        e = event_at(t_s)
        return None if e is None else e.end_s
    if not bool(np.asarray(source.active(t_s))):
        return None
    grid = np.arange(t_s, t_s + 7 * 86400.0, 1.0)
    off = np.flatnonzero(~np.asarray(source.active(grid), bool))
    return float(grid[off[0]]) if len(off) else float(grid[-1])
