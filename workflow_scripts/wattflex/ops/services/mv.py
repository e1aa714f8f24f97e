"""Measurement and verification (M&V) of each grid event, from a load time series.

The same function reads the cluster simulation (1-s samples) and a real controlled run
(one sample per control period). Per event:

- **baseline**, two ways: from the curves (``baseline_curves_w``: the counterfactual
  uncapped load, e.g. the simulation's uncapped reference or the jobs' uncapped powers)
  and from the load in the ``pre_s`` seconds before the event (the programmes' usual
  "X of Y days"-style meter baseline, here the immediately preceding load);
- **delivered** kW (baseline - load) vs the **target** per interval of ``interval_s``;
- **response time**: from the start until the load is first at or below the event's target;
- **time above target** after the deadline (the compliance figure), and how far above;
- **restore time**: from the end until the load is back to ``restored_at`` of the
  pre-event baseline;
- measured ramp rates, and **throughput lost vs the oracle** when tokens are given;
- with a site file (``wattflex cluster-control --site``), **every level** of the electrical
  tree (site, feeds, PDUs, racks, nodes: :func:`level_mv`): its limit, its highest load,
  the periods above its limit and the worst excess, over the run and within each event.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from wattflex.ops.events import windows
from wattflex.policies import optimum, unlimited
from wattflex.provenance import (
    csv_files,
    json_file,
    provenance,
    read_csv,
    read_json,
    save_png,
    write_together,
)


def _mean(x: np.ndarray) -> float:
    return float(np.mean(x)) if len(x) else math.nan


def event_mv(
    t_s: np.ndarray,
    power_w: np.ndarray,
    budget_w: np.ndarray,
    window: Mapping[str, Any],
    baseline_curves_w: np.ndarray | None = None,
    *,
    pre_s: float = 60.0,
    interval_s: float = 60.0,
    restored_at: float = 0.98,
    tokens: float | None = None,
    tokens_oracle: float | None = None,
) -> tuple[dict[str, Any], pd.DataFrame]:
    """One event's M&V record and its per-interval table. ``budget_w`` is the budget the
    controller followed (ramps included; inf outside events); ``window`` has ``event_id``,
    ``start_s``, ``end_s``, ``deadline_s``."""
    t, p, b = (np.asarray(a, float) for a in (t_s, power_w, budget_w))
    dt = float(np.median(np.diff(t))) if len(t) > 1 else 1.0
    start, end = float(window["start_s"]), float(window["end_s"])
    deadline = float(window.get("deadline_s", math.inf))
    inside = (t >= start) & (t < end)
    pre = (t >= start - pre_s) & (t < start) & ~np.isfinite(b)  # not inside an earlier event
    base_pre = _mean(p[pre])
    curves = (
        np.full_like(p, np.nan)
        if baseline_curves_w is None
        else np.asarray(baseline_curves_w, float)
    )
    target = (
        float(window["target_w"])
        if window.get("target_w") is not None
        else float(np.min(b[inside]))
        if inside.any()
        else math.nan
    )
    due = inside & (t >= start + (deadline if math.isfinite(deadline) else 0.0))
    above = np.where(due, p - b, -np.inf)
    met = np.flatnonzero(inside & (p <= target + 1e-6))
    after = t >= end
    back = (
        np.flatnonzero(after & (p >= restored_at * base_pre))
        if math.isfinite(base_pre)
        else np.zeros(0, int)
    )
    step = np.diff(p) / np.diff(t) if len(t) > 1 else np.zeros(0)
    ramp_zone = (
        (
            (t[1:] >= start)
            & (t[1:] < start + (deadline if math.isfinite(deadline) else end - start) + dt)
        )
        if len(t) > 1
        else np.zeros(0, bool)
    )
    up_zone = (t[1:] >= end) if len(t) > 1 else np.zeros(0, bool)
    rec = {
        "event_id": str(window["event_id"]),
        "start_s": start,
        "end_s": end,
        "deadline_s": deadline if math.isfinite(deadline) else None,
        "target_w": target,
        "baseline_curves_w": _mean(curves[inside]),
        "baseline_pre_event_w": base_pre,
        "mean_power_w": _mean(p[inside]),
        "delivered_w_vs_pre_event": base_pre - _mean(p[due]) if due.any() else math.nan,
        "delivered_w_vs_curves": _mean(curves[due] - p[due]) if due.any() else math.nan,
        "requested_w_vs_pre_event": base_pre - target,
        "response_time_s": float(t[met[0]] - start) if len(met) else None,
        "deadline_met": bool(len(met))
        and (not math.isfinite(deadline) or t[met[0]] - start <= deadline + 1e-9),
        "seconds_above_target_after_deadline": float((above > 1e-6).sum() * dt),
        "worst_w_above_target_after_deadline": float(max(above.max(initial=-np.inf), 0.0))
        if due.any()
        else 0.0,
        "energy_above_target_j": float(np.clip(above, 0, None)[due].sum() * dt),
        "restore_time_s": float(t[back[0]] - end) if len(back) else None,
        "max_ramp_down_w_per_s": float(max(-step[ramp_zone].min(initial=0.0), 0.0)),
        "max_ramp_up_w_per_s": float(max(step[up_zone].max(initial=0.0), 0.0)),
        "samples": int(inside.sum()),
        "sample_s": dt,
    }
    if tokens is not None and tokens_oracle:
        rec["throughput_lost_vs_oracle"] = float(1.0 - tokens / tokens_oracle)
    edges = np.arange(start - pre_s, max(end, t[-1] if len(t) else end) + interval_s, interval_s)
    k = np.digitize(t, edges) - 1
    rows = []
    for i in range(len(edges) - 1):
        m = k == i
        if not m.any():
            continue
        bi = b[m]
        rows.append(
            {
                "event_id": rec["event_id"],
                "interval_start_s": float(edges[i]),
                "baseline_pre_event_w": base_pre,
                "baseline_curves_w": _mean(curves[m]),
                "target_w": float(np.mean(bi)) if np.isfinite(bi).all() else math.nan,
                "power_w": _mean(p[m]),
                "delivered_w": base_pre - _mean(p[m]),
                "seconds_above_target": float(((p[m] - bi) > 1e-6).sum() * dt),
            }
        )
    return rec, pd.DataFrame(rows)


def occurrence_ids(windows: Sequence[Mapping[str, Any]]) -> list[str]:
    """Each event's id, unique per occurrence: a name that several events share gets its start
    (``ev@3600s``), and a counter if that still repeats, so their rows stay apart."""
    names = [str(w["event_id"]) for w in windows]
    ids = [
        f"{n}@{float(w['start_s']):g}s" if names.count(n) > 1 else n for n, w in zip(names, windows)
    ]
    return [f"{i}#{ids[:k].count(i) + 1}" if ids.count(i) > 1 else i for k, i in enumerate(ids)]


def mv_table(
    t_s: np.ndarray,
    power_w: np.ndarray,
    budget_w: np.ndarray,
    windows: Sequence[Mapping[str, Any]],
    **kw: Any,
) -> tuple[list[dict[str, Any]], pd.DataFrame]:
    """:func:`event_mv` for every event (ids unique per occurrence, :func:`occurrence_ids`);
    the interval tables concatenated."""
    recs, tabs = [], []
    for w, eid in zip(windows, occurrence_ids(windows)):
        r, tab = event_mv(t_s, power_w, budget_w, {**w, "event_id": eid}, **kw)
        recs.append(r)
        tabs.append(tab)
    return recs, (pd.concat(tabs, ignore_index=True) if tabs else pd.DataFrame())


def simulation_mv(
    res: Any, source: Any, response_s: float, **kw: Any
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """M&V of every event for every row of a cluster simulation (``SimResult``): the
    baseline from the curves is the uncapped reference's load, throughput is compared with
    the oracle's over the run. ``source``: the scenario's schedule or signal; events
    without their own deadline get ``response_s``."""

    wins = windows(source, res.t_s, response_s)
    by = {name: r for r, name in enumerate(res.rows)}
    tok = res.tokens.sum(-1)
    recs, tabs = [], []
    for name, r in by.items():
        if name == unlimited():
            continue
        rr, tab = mv_table(
            res.t_s,
            res.power_w[r],
            res.budget_w,
            wins,
            baseline_curves_w=res.power_w[by[unlimited()]],
            tokens=float(tok[r]),
            tokens_oracle=float(tok[by[optimum()]]),
            **kw,
        )
        recs += [{"policy": name, **x} for x in rr]
        tabs.append(tab.assign(policy=name))
    return pd.DataFrame(recs), (pd.concat(tabs, ignore_index=True) if tabs else pd.DataFrame())


def level_mv(
    t_s: np.ndarray,
    level_w: Mapping[str, Sequence[float]],
    limit_w: Mapping[str, Any],
    kind: Mapping[str, str],
    windows: Sequence[Mapping[str, Any]] = (),
) -> list[dict[str, Any]]:
    """One record per level of the site: ``limit_w`` (one number, or one per period: the
    lowest is reported), ``max_w`` and ``mean_w`` over the run, ``periods_above_limit`` and
    ``worst_w_above_limit`` (0 when it never was), and the same within each event
    (``events``: id, max_w, periods_above_limit)."""
    t = np.asarray(t_s, float)
    out = []
    for name, series in level_w.items():
        p = np.asarray(series, float)
        lims = np.broadcast_to(np.asarray(limit_w[name], float), p.shape)
        lim = float(lims.min()) if len(lims) else math.inf
        above = np.where(np.isfinite(lims), p - lims, -np.inf)
        tol = 1e-6 * np.maximum(np.abs(np.where(np.isfinite(lims), lims, 0.0)), 1.0)
        per_event = []
        for w, eid in zip(windows, occurrence_ids(windows)):
            m = (t >= float(w["start_s"])) & (t < float(w["end_s"])) & np.isfinite(p)
            per_event.append(
                {
                    "event_id": eid,
                    "max_w": float(p[m].max()) if m.any() else math.nan,
                    "periods_above_limit": int((above[m] > tol[m]).sum()),
                }
            )
        ok = np.isfinite(p)
        out.append(
            {
                "level": name,
                "kind": kind.get(name, ""),
                "limit_w": lim if math.isfinite(lim) else None,
                "max_w": float(p[ok].max()) if ok.any() else math.nan,
                "mean_w": _mean(p[ok]),
                "periods": int(ok.sum()),
                "periods_above_limit": int((above[ok] > tol[ok]).sum()),
                "worst_w_above_limit": float(max(above[ok].max(initial=-np.inf), 0.0)),
                "events": per_event,
            }
        )
    return out


def write_run_mv(
    out_dir: Any,
    rec: Any,
    source: Any,
    response_s: float,
    uncapped_w: Any,
    params: Mapping[str, Any],
    basis_w: float | None = None,
    interval_s: float = 60.0,
) -> tuple[list[dict[str, Any]], pd.DataFrame]:
    """M&V of a real controlled run (a :class:`wattflex.ops.services.node_agent.LoopRecord` or the
    cluster coordinator's record, one sample per period): ``mv.json``, ``mv_intervals.csv``
    and ``timeseries.csv``, written together; the event records and the time series back
    (figures: :func:`write_run_mv_report`, drawn by the ``figure`` a command passes: only ``wattflex.plots``
    draws). The curve baseline ``uncapped_w`` is one number (a node's jobs' uncapped power,
    measured before the controller capped them; NaN when they started capped) or one per
    sample (the cluster's, from the jobs' campaign curves). Tokens are not known to a GPU:
    no throughput-vs-oracle figure here (the simulation has it)."""

    out = Path(out_dir)
    t = np.asarray(rec.t_s, float)
    power, budget = np.asarray(rec.power_w, float), np.asarray(rec.budget_w, float)
    curves = np.broadcast_to(np.asarray(uncapped_w, float), t.shape).copy()
    period = float(np.median(np.diff(t))) if len(t) > 1 else 1.0
    recs, intervals = mv_table(
        t,
        power,
        budget,
        windows(source, t, response_s, basis_w),
        baseline_curves_w=curves,
        pre_s=60.0,
        interval_s=interval_s,
    )
    ts = pd.DataFrame({"t_s": t, "budget_w": budget, "power_w": power, "baseline_curves_w": curves})
    for k, caps in enumerate(np.asarray(rec.caps_w, float).T):
        ts[f"cap_w:job{k}"] = caps
    doc: dict[str, Any] = {"events": recs, "sample_s": period, "policy": params.get("policy")}
    if getattr(rec, "alive", None) and len(rec.alive) == len(t):
        ts["units_answering"] = np.asarray(
            rec.alive, int
        )  # the coordinator's: the others counted uncapped
    if getattr(rec, "level_w", None):  # the site's levels (wattflex cluster-control --site)
        for name, series in rec.level_w.items():
            ts[f"load_w:{name}"] = np.asarray(series, float)
        doc["levels"] = level_mv(
            t,
            rec.level_w,
            rec.level_limit_w,
            rec.level_kind,
            windows(source, t, response_s, basis_w),
        )
    elif np.isfinite(np.asarray(getattr(rec, "limit_w", None) or [np.inf], float)).any():
        # one node (wattflex control --site or a cluster-control agent): its share of the limits
        ts["limit_w"] = np.asarray(rec.limit_w, float)
        doc["levels"] = level_mv(
            t,
            {"node": power},
            {"node": ts["limit_w"].to_numpy()},
            {"node": "node"},
            windows(source, t, response_s, basis_w),
        )
    prov = provenance(params=dict(params), backend="nvml")
    files = [
        json_file(doc, out / "mv.json", prov),
        *csv_files(intervals, out / "mv_intervals.csv", prov),
        *csv_files(ts, out / "timeseries.csv", prov),
    ]
    write_together(files)
    return recs, ts


#: What every event's M&V record must have for a flexibility statement's response figures.
MV_EVENT_COLUMNS = (
    "event_id",
    "response_time_s",
    "max_ramp_down_w_per_s",
    "max_ramp_up_w_per_s",
    "restore_time_s",
    "deadline_met",
)
#: The columns of a real run's ``mv_intervals.csv`` (:func:`event_mv`'s per-interval table).
MV_INTERVAL_COLUMNS = ("event_id", "interval_start_s", "power_w", "delivered_w")
MV_FORMATS = (
    "the control study's control/mv.csv, or a real run's mv.json or mv_intervals.csv "
    "(wattflex control / cluster-control --mv-out)"
)


def read_mv_records(path: Any) -> pd.DataFrame:
    """The events' M&V records in any file that holds them, one row per event with ``policy``
    and ``source`` (``simulated``: the control study's ``mv.csv``, its policies' rows;
    ``real``: a controlled run's ``mv.json``, the policy it ran, ``controller`` where it
    does not say). A run's
    ``mv_intervals.csv`` holds per-interval means only: its events are read from the
    ``mv.json`` written beside it, their ids checked against each other. The format is told
    by the content; anything else, or a record without :data:`MV_EVENT_COLUMNS`, is a
    ``ValueError`` in one line."""

    path = Path(path)
    if path.suffix == ".json":
        try:
            doc = read_json(path)
        except (ValueError, UnicodeDecodeError, AttributeError, OSError) as exc:
            raise ValueError(f"{path}: {_first_line(exc, path)}; give {MV_FORMATS}") from None
        events = doc.get("events") if isinstance(doc, dict) else None
        if not isinstance(events, list) or not all(isinstance(e, dict) for e in events):
            raise ValueError(f"{path}: not an M&V record (no list of events); give {MV_FORMATS}")
        df = pd.DataFrame(events, columns=list(MV_EVENT_COLUMNS) if not events else None)
        df = df.assign(policy=str(doc.get("policy") or "controller"), source="real")
        if "sample_s" not in df and doc.get("sample_s") is not None:
            df["sample_s"] = float(doc["sample_s"])
    elif path.suffix == ".csv":
        try:
            table = read_csv(path)
        except (ValueError, UnicodeDecodeError, OSError) as exc:
            raise ValueError(f"{path}: {_first_line(exc, path)}; give {MV_FORMATS}") from None
        if set(MV_INTERVAL_COLUMNS) <= set(table.columns):
            events = read_mv_records(path.with_name("mv.json"))
            ids, have = set(table["event_id"].astype(str)), set(events["event_id"].astype(str))
            if ids != have:
                raise ValueError(
                    f"{path}: its events {sorted(ids)} are not those of the mv.json beside it "
                    f"{sorted(have)}"
                )
            return events
        if "policy" not in table:
            raise ValueError(f"{path}: not an M&V table (no policy column); give {MV_FORMATS}")
        df = table.assign(source="simulated")
    else:
        raise ValueError(f"{path}: neither .json nor .csv; give {MV_FORMATS}")
    missing = [c for c in MV_EVENT_COLUMNS if c not in df.columns]
    if missing:
        raise ValueError(f"{path}: not an M&V record (no {', '.join(missing)}); give {MV_FORMATS}")
    return df


def _first_line(exc: BaseException, path: Any) -> str:
    """A read error's first line, without the path it starts with."""
    line = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
    return line.removeprefix(f"{path}: ")


def write_run_mv_report(
    out: Path,
    rec,
    source,
    response_s: float,
    uncapped_w,
    params: dict,
    basis_w: float | None,
    title: str,
    figure: Callable[..., Any] | None = None,
) -> list[dict]:
    """A real run's M&V (:func:`wattflex.ops.services.mv.write_run_mv`: mv.json, mv_intervals.csv,
    timeseries.csv) and the figure the cluster simulation draws per event
    (``figure``: :func:`wattflex.plots.grid.mv_figure`, which the commands pass; none drawn without it): ``mv.png`` for the first event, ``mv_<k>.png``
    for the k-th after it; one line per event said."""
    recs, ts = write_run_mv(out, rec, source, response_s, uncapped_w, params, basis_w)
    prov = provenance(params=params, backend="nvml")
    curves = ts["baseline_curves_w"].to_numpy(float)
    for k, r in enumerate(recs):
        png = out / mv_png_name(k)
        if figure is None:
            print(f"{mv_line(r)}; wrote {out}/mv.json", flush=True)
            continue
        fig = figure(
            ts["t_s"].to_numpy(float),
            {"measured load": ts["power_w"].to_numpy(float)},
            ts["budget_w"].to_numpy(float),
            r,
            curves if np.isfinite(curves).any() else None,
            "nvml",
            title,
        )
        save_png(fig, png, prov, event_id=r["event_id"])
        print(f"{mv_line(r)}; wrote {out}/mv.json and {png}", flush=True)
    return recs


def mv_line(r: dict) -> str:
    """One event's M&V record in a line, in the words of the schedule's warnings (deadline
    met or missed) and its numbers rounded as measured (0.1 s, 1 W)."""
    s = lambda v: "never" if v is None else f"{v:.1f} s"  # noqa: E731
    deadline = "no deadline" if r["deadline_s"] is None else f"deadline {r['deadline_s']:g} s"
    return (
        f"M&V {r['event_id']}: {deadline} {'met' if r['deadline_met'] else 'missed'} "
        f"(response {s(r['response_time_s'])}), "
        f"{r['seconds_above_target_after_deadline']:g} s above target after the deadline "
        f"(worst {r['worst_w_above_target_after_deadline']:.0f} W), restored after "
        f"{s(r['restore_time_s'])}"
    )


def mv_png_name(k: int) -> str:
    """The k-th event's figure: ``mv.png`` for the first, ``mv_<k+1>.png`` after it."""
    return "mv.png" if k == 0 else f"mv_{k + 1}.png"
