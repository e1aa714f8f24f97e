"""Cluster-wide events on SLURM: jobs and GPUs from SLURM itself, the event's budget split
over (job, node) units, one agent per unit.

**Discovery.** ``squeue --json --states=RUNNING`` lists the running jobs (of the partitions
asked for, if any); a job's nodes come from its ``nodes`` host list and its GPUs on each node from ``gres_detail``
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
budget is split over the answering units (:func:`split_budget`). With the default
``equal-weight`` it is water-filled above their floors with equal weights
(:func:`wattflex.allocation.allocator.water_fill`). With another split policy
(:data:`SPLIT_POLICIES`, from the allocation registry) and the campaign's curves
(:class:`GroupCurves`, ``runs.parquet``: each group's measured power and tokens/s per cap,
taken per GPU and scaled to the unit's GPUs), the units whose job has a curve (matched by
SLURM job name or an explicit map, :class:`ClusterSplit`) share their part of the cut
through :func:`wattflex.allocation.allocator.allocate` (PFI-aware weights, the curve-aware
prediction or the oracle, on the curves' PFI as measured); a unit without a curve keeps its
equal-weight share. Each agent splits its unit's share over its GPUs with the controller's
policy. Budgets go to
``<dir>/<unit>.budget.json`` with the end of the event and the unit's share of its ramp
limit (in proportion to its GPUs), to which the agent holds its cap changes; an agent whose
budget file goes stale holds the last budget to that end, then restores.

**One bad answer stops nothing.** A budget or load file that cannot be used (not JSON, a
field that is not a finite number) is reported once and counted as stale: the agent holds
its last good budget to the end it named, the coordinator counts the unit as not answering.
A failed ``squeue`` (exit status, no answer, not a job list) is retried with backoff within
the period, then the last known job set is held (and asked again the next period); a job
``squeue`` describes badly (no ``job_id``, odd ``gres_detail``) is skipped with a report.
The coordinator's loop is :func:`wattflex.ops.services.coordinator.run_coordinator`.
"""

from __future__ import annotations

import json
import logging
import math
import os
import re
import shlex
import subprocess
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from wattflex.allocation.allocator import allocate, water_fill
from wattflex.allocation.curves import Curves, cap_rows, curves_from_points
from wattflex.allocation.nested import nested_water_fill
from wattflex.ingest.reader import read_csv_named
from wattflex.pfi import pfi_ratio
from wattflex.policies import get, names
from wattflex.provenance import strict_json

log = logging.getLogger("wattflex.ops.adapters.slurm")


class SqueueError(RuntimeError):
    """``squeue --json`` failed or answered no job list (transient: asked again)."""


@dataclass(frozen=True)
class SlurmJob:
    job_id: str
    name: str
    gpus: dict[str, tuple[int, ...]]  # node -> GPU indices on it

    def units(self) -> list[str]:
        return [unit_name(self.job_id, n) for n in self.gpus]


def unit_name(job_id: str, node: str) -> str:
    """A unit's name, ``<job id>.<node>``: its budget and load files are named by it."""
    return f"{job_id}.{node}"


# Bounds on what one squeue answer may name, checked before a range is expanded into a list (a
# range of 10^9 filled the memory): Slurm's own MAX_SLURM_NODES is 64,000 (slurm.h.in, 100,000
# in newer releases); no node has more than 1024 GPUs (as control.MAX_GPU_INDEX).
MAX_HOSTS = 100_000
MAX_GPU_INDEX = 1023
# A job id as squeue prints it (``123``, an array task ``123_4``, a het component ``123+1``) and a
# host name (RFC 1123 letters, digits, ``-``, ``.``, ``_``): both become file names in the budget
# folder, so anything else (``../x``) is refused.
_JOB_ID = re.compile(r"^\d+(?:_\d+)?(?:\+\d+)?$")
_HOST = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")


def _range(part: str, top: int, what: str) -> range:
    """``lo-hi`` or ``lo`` of a Slurm list as a range, refused when it runs backwards or past
    ``top``."""
    lo, _, hi = part.partition("-")
    first, last = int(lo), int(hi or lo)
    if last < first or last > top:
        raise ValueError(f"{what} range {part!r} runs backwards or past {top}")
    return range(first, last + 1)


def expand_hostlist(spec: str) -> list[str]:
    """``node[0-2,5],gpu7`` -> node0, node1, node2, node5, gpu7 (Slurm host-list syntax); a
    host name with characters no host has, or more than ``MAX_HOSTS`` of them, is refused."""
    out: list[str] = []
    for m in re.finditer(r"([^,\[]+)(?:\[([^\]]+)\])?", spec):
        prefix, ranges = m.group(1), m.group(2)
        if ranges is None:
            out.append(prefix)
            continue
        for part in ranges.split(","):
            width = len(part.partition("-")[0])
            out += [f"{prefix}{i:0{width}d}" for i in _range(part, MAX_HOSTS, "host")]
            if len(out) > MAX_HOSTS:
                raise ValueError(f"host list {spec[:60]!r} names over {MAX_HOSTS} hosts")
    bad = [h for h in out if not _HOST.match(h)]
    if bad:
        raise ValueError(f"host name {bad[0][:60]!r} is not a host name")
    return out


def gres_indices(entry: str) -> tuple[int, ...]:
    """GPU indices of one ``gres_detail`` entry, e.g. ``gpu:h200:2(IDX:0-1)`` -> (0, 1); an
    index past ``MAX_GPU_INDEX`` or a range that runs backwards is refused."""
    m = re.search(r"gpu[^()]*\(IDX:([^)]*)\)", entry)
    if not m or m.group(1) in ("", "N/A"):
        return ()
    idx: list[int] = []
    for part in m.group(1).split(","):
        idx += list(_range(part, MAX_GPU_INDEX, "GPU index"))
    return tuple(idx)


def _state(job: Mapping[str, Any]) -> str:
    s = job.get("job_state", "")
    return str(s[0] if isinstance(s, list) and s else s)  # a list from Slurm 23.02 on


class SqueueHung(SqueueError):
    """``squeue`` answered nothing within its bound: not retried within the period (a hung
    controller answers no sooner 50 ms later), the last known jobs held."""


def parse_squeue(
    doc: Mapping[str, Any], partitions: Sequence[str] | None = None, report: Any = None
) -> list[SlurmJob]:
    """Running jobs holding GPUs, from ``squeue --json``; only those running in one of
    ``partitions``, if given. A job described in a way this cannot read is skipped and said
    to ``report`` (default: logged); a document that is no job list is a :class:`SqueueError`."""
    listed = doc.get("jobs") if isinstance(doc, dict) else None
    if not isinstance(listed, list):
        what = (
            f"a JSON {type(doc).__name__}"
            if not isinstance(doc, dict)
            else "no 'jobs'"
            if listed is None
            else f"'jobs' is a JSON {type(listed).__name__}"
        )
        raise SqueueError(f"squeue --json answered no job list ({what})")
    jobs: dict[str, SlurmJob] = {}
    for k, j in enumerate(listed):
        try:
            job = _gpu_job(j, partitions)
            if job is not None and job.job_id in jobs:
                raise ValueError("listed twice (the first kept)")
        except (AttributeError, KeyError, TypeError, ValueError) as exc:
            what = j.get("job_id", f"#{k}") if isinstance(j, dict) else f"#{k}"
            why = str(exc) if isinstance(exc, ValueError) else f"{type(exc).__name__}: {exc}"
            (report or log.warning)(f"squeue job {what} skipped: cannot read it ({why})")
            continue
        if job is not None:
            jobs[job.job_id] = job
    return list(jobs.values())


def _gpu_job(j: Mapping[str, Any], partitions: Sequence[str] | None) -> SlurmJob | None:
    """One ``squeue --json`` job as a :class:`SlurmJob`; None if not running here with GPUs."""
    if _state(j) != "RUNNING":
        return None
    if partitions and not set(str(j.get("partition", "")).split(",")) & set(partitions):
        return None
    if j.get("job_id") in (None, ""):
        raise ValueError("no job_id")
    if isinstance(j["job_id"], bool) or not _JOB_ID.match(str(j["job_id"])):
        raise ValueError(f"job_id {str(j['job_id'])[:40]!r} is not a Slurm job id")
    if "gres_detail" not in j:
        raise ValueError("no gres_detail: which GPUs it holds is not known")
    nodes = expand_hostlist(str(j.get("nodes", "")))
    detail = j.get("gres_detail") or []
    if not isinstance(detail, list):
        raise TypeError(f"gres_detail is a {type(detail).__name__}, not a list")
    gpus = {n: gres_indices(str(d)) for n, d in zip(nodes, detail)}
    gpus = {n: g for n, g in gpus.items() if g}
    return SlurmJob(str(j["job_id"]), str(j.get("name", "")), gpus) if gpus else None


def discover(
    squeue: str = "squeue",
    partitions: Sequence[str] | None = None,
    report: Any = None,
    timeout_s: float = 60.0,
) -> list[SlurmJob]:
    """The running GPU jobs as SLURM reports them now (of ``partitions`` only, if given: filtered
    here, since ``squeue --json`` of some Slurm releases, 22.05 among them, ignores its filters).
    :class:`SqueueError` when ``squeue`` fails, answers nothing in ``timeout_s`` or its answer
    is no job list."""
    try:
        out = subprocess.run(
            [squeue, "--json", "--states=RUNNING"],
            capture_output=True,
            text=True,
            timeout=timeout_s,
        )
    except subprocess.TimeoutExpired:
        raise SqueueHung(f"{squeue} --json answered nothing in {timeout_s:g} s") from None
    except OSError as exc:
        raise SqueueError(f"{squeue} --json: {exc}") from None
    if out.returncode != 0:
        raise SqueueError(f"{squeue} --json failed ({out.returncode}): {out.stderr.strip()[:200]}")
    try:
        doc = json.loads(out.stdout)
    except ValueError as exc:
        raise SqueueError(f"{squeue} --json answered no JSON ({exc})") from None
    return parse_squeue(doc, partitions, report)


def jobs_or_last(
    discover_jobs: Any, last: list[SlurmJob], sleep: Any, backoff_s: Sequence[float]
) -> tuple[list[SlurmJob], str | None]:
    """``discover_jobs()``, retried after each of ``backoff_s`` when SLURM fails (not when it
    hung: :class:`SqueueHung`); when every try failed, the last known job set (held safe: its
    units keep their shares) and why, with the number of tries."""
    for wait in (*backoff_s, None):
        try:
            return list(discover_jobs()), None
        except SqueueHung as exc:  # asked again the next period, not within this one
            return last, f"{exc}; not asked again within the period"
        except SqueueError as exc:
            why = f"{len(backoff_s) + 1} tries, the last: {exc}"
            if wait is not None:
                sleep(wait)
    return last, why


def agent_command(
    job: SlurmJob,
    node: str,
    budget_dir: Path,
    period_s: float,
    duration_s: float,
    policy: str = "equal-weight",
    wattflex: str = "wattflex",
    state_dir: str | None = None,
    metrics_addr: str | None = None,
) -> list[str]:
    """The job step that runs the agent of (job, node) inside the job's allocation
    (``state_dir``: its cap state folder, ``{node}`` replaced; default: the node's own;
    ``metrics_addr``: it serves its metrics there on a free port, ``hpc_job`` its job)."""
    unit = unit_name(job.job_id, node)
    where = ["--state-dir", state_dir.replace("{node}", node)] if state_dir else []
    if metrics_addr:
        where += ["--metrics-port", "0", "--metrics-addr", metrics_addr, "--hpc-job", job.job_id]
    return [
        "srun",
        "--overlap",
        f"--jobid={job.job_id}",
        "--nodes=1",
        "--ntasks=1",
        f"--nodelist={node}",
        f"--gres=gpu:{len(job.gpus[node])}",
        f"--job-name=wattflex-agent-{unit}",
        wattflex,
        "control",
        "--budget-file",
        str(budget_dir / f"{unit}.budget.json"),
        "--load-file",
        str(budget_dir / f"{unit}.load.json"),
        "--period-s",
        f"{period_s:g}",
        "--duration-s",
        f"{duration_s:g}",
        "--policy",
        policy,
        *where,
    ]


# ---------------------------------------------------------------------------------------
# The split, and the files between coordinator and agents
# ---------------------------------------------------------------------------------------

# SPLIT_POLICIES (the registry's split=True): the allocation policies that can split across units,
# those reading no per-job feature but the curves and their PFI (measured here, from the campaign's curves)


@dataclass(frozen=True)
class GroupCurves:
    """The campaign's groups as per-GPU curves: ``per_gpu`` (G, K) power and tokens/s of one
    GPU at each measured cap (the group's totals / its GPUs), ``pfi`` its measured PFI
    (paper Eq. 1, :func:`wattflex.pfi.pfi_ratio`)."""

    groups: tuple[str, ...]
    per_gpu: Curves
    pfi: np.ndarray

    def index(self, group: str) -> int | None:
        return self.groups.index(group) if group in self.groups else None


def group_curves(runs: Any) -> GroupCurves:
    """Per-GPU curves from ``runs.parquet`` rows (``group, gpus, cap_w, power_w,
    tokens_per_s``; repeats averaged)."""
    need = {"group", "gpus", "cap_w", "power_w", "tokens_per_s"} - set(runs.columns)
    if need:
        raise ValueError(f"curves need column(s) {', '.join(sorted(need))} (a runs.parquet)")
    pts = (
        cap_rows(runs)
        .groupby(["group", "cap_w"], sort=True, as_index=False)[["gpus", "power_w", "tokens_per_s"]]
        .mean()
    )
    names, curves = curves_from_points(
        pts["group"], pts["power_w"] / pts["gpus"], pts["tokens_per_s"] / pts["gpus"], pts["cap_w"]
    )
    pfi = np.array([pfi_ratio(p, t) for p, t in zip(curves.power_w, curves.throughput)])
    return GroupCurves(tuple(map(str, names)), curves, pfi)


def read_group_curves(path: str | Path) -> GroupCurves:
    """:func:`group_curves` of a runs table (``.parquet`` or ``.csv``)."""
    import pandas as pd

    p = Path(path)
    if not p.is_file():
        raise FileNotFoundError(f"--curves {p}: no such file (give a campaign's runs.parquet)")
    runs = (
        pd.read_parquet(p)
        if p.suffix in (".parquet", ".pq")
        else read_csv_named(p, "--curves", dtype={"group": str})  # `01` and `1`: two groups
    )
    try:
        return group_curves(runs)
    except ValueError as e:
        raise ValueError(f"--curves {p}: {e}") from None


@dataclass(frozen=True)
class ClusterSplit:
    """How the coordinator splits across units: a policy of :data:`SPLIT_POLICIES`, the
    campaign's curves, and which group each job is (``job_group``: job id or SLURM job name
    -> group; otherwise a job whose name is a group's is that group)."""

    policy: str = "equal-weight"
    curves: GroupCurves | None = None
    job_group: Mapping[str, str] | None = None

    def __post_init__(self) -> None:
        if self.policy not in names(split=True):
            raise ValueError(
                f"split policy {self.policy!r}: choose from {', '.join(names(split=True))}"
            )
        if get(self.policy).needs_curves and self.curves is None:
            raise ValueError(
                f"split policy {self.policy} needs the campaign's curves (--curves runs.parquet)"
            )
        missing = sorted(
            set((self.job_group or {}).values()) - set(self.curves.groups if self.curves else ())
        )
        if missing:
            raise ValueError(f"--job-map names group(s) {', '.join(missing)} not in the curves")

    def group_of(self, job: SlurmJob) -> str | None:
        """The job's campaign group, None if it has no curve (it then gets an equal-weight share)."""
        if self.curves is None:
            return None
        m = self.job_group or {}
        g = m.get(job.job_id, m.get(job.name, job.name))
        return g if self.curves.index(g) is not None else None

    def unit_curves(
        self, units: Sequence[tuple[SlurmJob, str]]
    ) -> tuple[Curves | None, np.ndarray]:
        """Each unit's curve (its group's per-GPU curve x its GPUs; rows without one are
        placeholders) and the mask of units that have one."""
        idx = [self.group_of(j) if get(self.policy).needs_curves else None for j, _ in units]
        has = np.array([g is not None for g in idx], bool)
        if self.curves is None or not has.any():
            return None, has
        rows = np.array([self.curves.index(g) if g is not None else 0 for g in idx])
        gpus = np.array([len(j.gpus[n]) for j, n in units], float)[:, None]
        c = self.curves.per_gpu.take(rows)
        return Curves(c.power_w * gpus, c.throughput * gpus, c.cap_w), has

    def unit_uncapped_w(self, units: Sequence[tuple[SlurmJob, str]]) -> np.ndarray:
        """Each unit's uncapped power from its group's curve (the curve's top point per GPU x
        its GPUs), whatever the split policy; NaN for a unit whose job has no curve."""
        return np.array(
            [
                self.curves.per_gpu.ceiling_w[self.curves.index(g)] * len(j.gpus[n])
                if self.curves is not None and (g := self.group_of(j)) is not None
                else np.nan
                for j, n in units
            ]
        )

    def unit_pfi(self, units: Sequence[tuple[SlurmJob, str]]) -> np.ndarray:
        return np.array(
            [
                self.curves.pfi[self.curves.index(g)]
                if self.curves is not None and (g := self.group_of(j)) is not None
                else np.nan
                for j, _ in units
            ]
        )


def split_budget(
    budget_w: float,
    floor_w: np.ndarray,
    ceiling_w: np.ndarray,
    alive: np.ndarray,
    policy: str = "equal-weight",
    curves: Curves | None = None,
    has_curve: np.ndarray | None = None,
    pfi: np.ndarray | None = None,
    nested: Any = None,
) -> np.ndarray:
    """Per-unit budgets (W): a unit not answering is charged its ceiling (uncapped) and gets
    NaN; the rest water-filled (equal weights) between the answering units' floors and
    ceilings. With ``curves`` (rows ``has_curve``) and a policy other than equal-weight, an
    answering unit with a curve works between the curve's floor and ceiling (its lowest-cap
    and uncapped power), and the units with curves re-split their equal-weight part of the
    cut by ``policy`` (:func:`wattflex.allocation.allocator.allocate`, ``pfi``: their PFI);
    those without keep their equal-weight share. ``inf`` (no event): every unit inf.

    ``nested``: the site's limits over the units (:meth:`wattflex.ops.adapters.topology.Site.laminar`),
    a unit not answering charged its ceiling in every group above it; the split then holds
    every level (:func:`wattflex.allocation.nested.nested_water_fill`, and the policy through
    ``allocate(nested=...)``), and ``inf`` gives what the limits alone allow (a unit no limit
    binds: inf)."""
    floor_w, ceiling_w, alive = (
        np.array(a, dtype=float if k < 2 else bool)
        for k, a in enumerate((floor_w, ceiling_w, alive))
    )
    if not math.isfinite(budget_w) and nested is None:
        return np.full(len(floor_w), np.inf)
    if not len(floor_w):  # no GPU job known (none running, or SLURM down from the start)
        return np.zeros(0)
    if nested is not None:
        return _split_nested(
            budget_w, floor_w, ceiling_w, alive, policy, curves, has_curve, pfi, nested
        )
    left = budget_w - ceiling_w[~alive].sum()
    use = (
        np.zeros(len(floor_w), bool)
        if curves is None or has_curve is None
        else np.asarray(has_curve) & alive
    )
    if use.any():
        floor_w[use], ceiling_w[use] = curves.floor_w[use], curves.ceiling_w[use]
    cut = ceiling_w[alive].sum() - left
    share = np.full(len(floor_w), np.nan)
    head = np.where(alive, ceiling_w - floor_w, 0.0)
    shed = water_fill(np.array(max(cut, 0.0)), head, np.where(alive, 1.0, 0.0))
    share[alive] = (ceiling_w - shed)[alive]
    if use.any() and get(policy).needs_curves:
        part = Curves(curves.power_w[use], curves.throughput[use])
        pfi_use = np.full(int(use.sum()), np.nan) if pfi is None else np.asarray(pfi, float)[use]
        a = allocate(part, float(share[use].sum()), policy, {"pfi": pfi_use})
        share[use] = a.power_w
    return share


def _split_nested(
    budget_w: float,
    floor_w: np.ndarray,
    ceiling_w: np.ndarray,
    alive: np.ndarray,
    policy: str,
    curves: Curves | None,
    has_curve: np.ndarray | None,
    pfi: np.ndarray | None,
    nested: Any,
) -> np.ndarray:
    """:func:`split_budget` under the site's nested limits (its docstring): equal weights
    first, then the units with curves re-split their part by ``policy`` within what the
    limits leave them beside the others' shares."""
    use = (
        np.zeros(len(floor_w), bool)
        if curves is None or has_curve is None
        else np.asarray(has_curve) & alive
    )
    if use.any():
        floor_w[use], ceiling_w[use] = curves.floor_w[use], curves.ceiling_w[use]
    fam = nested.subset(alive, ceiling_w)  # the silent units at their ceilings
    share = np.full(len(floor_w), np.nan)
    left = budget_w - ceiling_w[~alive].sum()  # the site's budget less the silent units
    share[alive] = nested_water_fill(
        left, floor_w[alive], ceiling_w[alive], np.ones(int(alive.sum())), fam
    )
    if use.any() and get(policy).needs_curves and math.isfinite(budget_w):
        sub = nested.subset(use, np.where(alive, np.nan_to_num(share), ceiling_w))
        part = Curves(curves.power_w[use][None], curves.throughput[use][None])
        pfi_use = np.full(int(use.sum()), np.nan) if pfi is None else np.asarray(pfi, float)[use]
        a = allocate(part, float(share[use].sum()), policy, {"pfi": pfi_use[None]}, nested=sub)
        if bool(a.feasible[0]):
            share[use] = a.power_w[0]
    if not math.isfinite(budget_w):  # no event: only where a limit binds
        share = np.where(share >= ceiling_w * (1 - 1e-9), np.inf, share)
    return share


def write_json_atomic(path: Path, doc: Mapping[str, Any]) -> None:
    """``doc`` as strict JSON at ``path``, renamed into place: a reader sees the old or the new file."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(strict_json(doc))
    tmp.replace(path)


def _finite(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


# what each field of the files between coordinator and agents must be (null: none)
BUDGET_FIELDS = {
    "t_unix": ("a finite number", _finite),
    "budget_w": ("null or a finite number >= 0", lambda v: v is None or _finite(v) and v >= 0),
    "hold_until_unix": ("null or a finite number", lambda v: v is None or _finite(v)),
    "ramp_w_per_s": ("null or a finite number > 0", lambda v: v is None or _finite(v) and v > 0),
    # the unit's share of the site's electrical limits (wattflex.ops.adapters.topology), held whatever the ramp
    "limit_w": ("null or a finite number >= 0", lambda v: v is None or _finite(v) and v >= 0),
    # the SM clock the unit's agent locks its GPUs at (the knob menu's clock), null: no lock
    "clock_mhz": ("null or a finite number > 0", lambda v: v is None or _finite(v) and v > 0),
}
LOAD_FIELDS = {
    "t_unix": BUDGET_FIELDS["t_unix"],
    "load_w": ("a finite number >= 0", lambda v: _finite(v) and v >= 0),
}


def file_problem(doc: Any, fields: Mapping[str, tuple[str, Any]]) -> str | None:
    """Why a budget or load file's document cannot be used (None: it can)."""
    if not isinstance(doc, dict):
        return f"a JSON {type(doc).__name__}, not an object"
    for key, (rule, ok) in fields.items():
        if not ok(doc.get(key)):
            return f"{key} {json.dumps(doc.get(key))}: must be {rule}"
    return None


def read_fresh(
    path: Path,
    stale_s: float,
    now: float | None = None,
    fields: Mapping[str, tuple[str, Any]] = LOAD_FIELDS,
    bad: Any = None,
) -> dict[str, Any] | None:
    """The JSON document at ``path`` if it was written less than ``stale_s`` ago and its
    ``fields`` are usable, else None (one that cannot be used is said to ``bad``)."""
    try:
        text = path.read_text()
    except OSError:
        return None
    try:
        doc = json.loads(text)
    except ValueError as exc:
        problem: str | None = f"not JSON ({exc})"
    else:
        problem = file_problem(doc, fields)
    if problem is not None:
        if bad is not None:
            bad(f"{path}: {problem}")
        return None
    now = time.time() if now is None else now
    return doc if now - float(doc["t_unix"]) <= stale_s else None


class OnceLog:
    """Says each distinct message once (a bad file or job read every period is said once)."""

    def __init__(self, say: Any):
        self.say, self.said = say, set()

    def __call__(self, msg: str) -> None:
        if msg not in self.said:
            self.said.add(msg)
            self.say(msg)


class BudgetFile:
    """The agent's side: ``budget_at(t)`` reads the coordinator's file; a stale, missing or
    unusable file (reported once) holds the last good budget until the event end it named,
    then no budget (restore)."""

    def __init__(self, path: str | Path, stale_s: float, warn: Callable[[str], None] | None = None):
        self.path, self.stale_s = Path(path), stale_s
        self.last: dict[str, Any] = {"budget_w": None, "hold_until_unix": -math.inf}
        self.stale_periods = 0
        self.expired = False  # stale past the end the last good file named
        say = warn or (lambda msg: log.warning("%s", msg))  # control prints it; else the log
        self._bad = OnceLog(
            lambda m: say(f"budget file {m}; holding the last good budget to its end")
        )

    def budget_at(self, _t_s: float) -> float:
        doc = read_fresh(self.path, self.stale_s, fields=BUDGET_FIELDS, bad=self._bad)
        self.expired = False
        if doc is not None:
            self.last = doc
            self._bad.said.clear()  # a later bad file is said again
        else:
            self.stale_periods += 1
            hold = self.last.get("hold_until_unix")
            if time.time() >= (-math.inf if hold is None else float(hold)):
                self.expired = True
                return math.inf
        b = self.last.get("budget_w")
        return math.inf if b is None else float(b)

    def clock_at(self, _t_s: float) -> float | None:
        """The SM clock to lock at (MHz) in the last budget read, None when it names none or the
        file went stale past the end it named (:meth:`budget_at`: then everything is restored)."""
        c = None if self.expired else self.last.get("clock_mhz")
        return None if c is None else float(c)

    def ramp_at(self, _t_s: float) -> float:
        """The unit's share of the event's ramp limit (W/s) in the last budget read; inf if none."""
        r = self.last.get("ramp_w_per_s")
        return math.inf if r is None else float(r)

    def limit_at(self, _t_s: float) -> float:
        """The unit's share of the site's electrical limits (W) in the last budget read (held
        while the file is stale: a breaker does not go away with the coordinator); inf if none."""
        r = self.last.get("limit_w")
        return math.inf if r is None else float(r)


def write_load(
    path: str | Path,
    unit: str,
    load_w: float,
    caps_w: Sequence[float],
    metrics_url: str | None = None,
) -> None:
    """An agent's load file: its measured load and caps now (and its metrics endpoint)."""
    doc = {
        "unit": unit,
        "load_w": float(load_w),
        "caps_w": [float(c) for c in caps_w],
        "t_unix": time.time(),
    }
    if metrics_url:
        doc["metrics_url"] = metrics_url
    write_json_atomic(Path(path), doc)


def coordinate_once(
    jobs: Sequence[SlurmJob],
    budget_w: float,
    hold_until_unix: float,
    budget_dir: Path,
    min_w: float,
    max_w: float,
    stale_s: float,
    split: ClusterSplit | None = None,
    ramp_w_per_s: float = math.inf,
    site: Any = None,
    charged: Mapping[str, float] | None = None,
    clocks: Mapping[str, float] | None = None,
) -> dict[str, float]:
    """One coordinator period: read every unit's load file, split ``budget_w`` (units not
    answering counted at ``max_w`` per GPU; ``split``: the policy and curves, default
    equal weights), write every unit's budget file, with its share of the event's ramp
    limit (in proportion to its GPUs) that its agent holds its cap changes to. ``site``
    (:class:`wattflex.ops.adapters.topology.Site`): the split holds every level of it, and every
    unit's file also carries ``limit_w``, its share of the limits alone (the event aside),
    which its agent holds whatever the ramp. ``charged``: units a knob shed (paused,
    requeued: ``slurm_knobs.KnobPlan``), counted at that power, no share. ``clocks``: units whose
    agent locks its GPUs' SM clock (MHz) as well (the knob's clock), named in their files."""
    split = split or ClusterSplit()
    charged, clocks = charged or {}, clocks or {}
    units = [(j, n) for j in jobs for n in j.gpus]
    names = [unit_name(j.job_id, n) for j, n in units]
    gpus = np.array([len(j.gpus[n]) for j, n in units], float)
    alive = np.array(
        [
            u not in charged and read_fresh(budget_dir / f"{u}.load.json", stale_s) is not None
            for u in names
        ],
        bool,
    )
    ceiling = np.array([charged.get(u, g * max_w) for u, g in zip(names, gpus)], float)
    curves, has_curve = split.unit_curves(units)
    nested = site.laminar([n for _, n in units]) if site is not None else None
    args = (gpus * min_w, ceiling, alive, split.policy, curves, has_curve, split.unit_pfi(units))
    share = split_budget(budget_w, *args, nested=nested)
    limit = np.full(len(units), np.inf)
    if nested is not None:
        # an answering unit: its share with the silent ones at their ceilings; a silent one
        # (an agent starting, or one whose load file is late): its share were all answering,
        # so that it is held from its first period, and the sum still fits (its share is at
        # most the ceiling it is charged at in the others')
        every = split_budget(
            math.inf, args[0], args[1], np.ones(len(units), bool), *args[3:], nested=nested
        )
        limit = np.where(alive, split_budget(math.inf, *args, nested=nested), every)
    now = time.time()
    ramp = ramp_w_per_s * gpus / max(gpus.sum(), 1.0)
    for u, b, r, lim in zip(names, share, ramp, limit):
        write_json_atomic(
            budget_dir / f"{u}.budget.json",
            {
                "budget_w": None if not np.isfinite(b) else float(b),
                "t_unix": now,
                "hold_until_unix": hold_until_unix,
                "ramp_w_per_s": float(r) if np.isfinite(r) else None,
                "limit_w": float(lim) if np.isfinite(lim) else None,
                "clock_mhz": clocks.get(u),
            },
        )
    return dict(zip(names, share))


def shell(cmd: Sequence[str]) -> str:
    """``cmd`` as one shell-quoted line (for the log)."""
    return " ".join(shlex.quote(c) for c in cmd)
