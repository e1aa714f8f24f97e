"""The site's electrical topology: feeds > PDUs > racks > nodes, each with a limit in kW.

A site file (YAML, ``config/schema/site.schema.yaml``; docs/grid.md "Electrical topology")::

    site: dc1
    limit_kw: 2.4                 # the grid connection (optional)
    feeds:
      - name: feed-a
        limit_kw: 2.4
        pdus:
          - name: pdu-1
            limit_kw: 2.4
            racks:
              - name: rack-1
                limit_kw: 0.8
                nodes: ["node[01-02]", {name: node03, limit_kw: 0.5}]
    node_map: {from: file}        # or slurm-features, or slurm-names with a pattern

Where each node sits (``node_map.from``): ``file``, the racks' ``nodes:`` lists (names or
SLURM host lists); ``slurm-features``, the node's SLURM features name its rack
(``scontrol show nodes --json``); ``slurm-names``, ``pattern``'s named group ``rack``
matched on the node name (e.g. ``^(?P<rack>r\\d+)n\\d+$``). The file is checked against the
schema (the campaign config's way, one line naming the key) and then for what a schema
cannot say: names unique per kind, a node in one rack only, every node list readable. A
child's limit may exceed its parent's (the parent then binds: breakers are sized so).

:meth:`Site.laminar` turns it into the nested limits over a list of units (the jobs'
(job, node) units, or a node's jobs) that :mod:`wattflex.allocation.nested` holds.
"""

from __future__ import annotations

import json
import math
import re
import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from wattflex.allocation.nested import Laminar
from wattflex.config import validate_schema
from wattflex.errors import ConfigError
from wattflex.ops.adapters.slurm import expand_hostlist
from wattflex.schema import read_yaml

SCHEMA = Path(__file__).resolve().parents[4] / "config" / "schema" / "site.schema.yaml"
KINDS = ("site", "feed", "pdu", "rack", "node")


@dataclass(frozen=True)
class Level:
    name: str  # "rack:rack-1"
    kind: str  # one of KINDS
    limit_w: float  # inf: none
    parent: int  # index in Site.levels, -1 for the site


@dataclass(frozen=True)
class Site:
    """The tree (``levels``, the site first) and where each node sits (``node_level``: node
    name -> the index of its rack's level, or of its own node level when it has a limit)."""

    name: str
    levels: tuple[Level, ...]
    node_level: Mapping[str, int] = field(default_factory=dict)
    rack_of: Mapping[str, str] = field(default_factory=dict)

    def level_index(self, name: str) -> int:
        return next(k for k, lv in enumerate(self.levels) if lv.name == name)

    def ancestors(self, k: int) -> list[int]:
        out = []
        while k >= 0:
            out.append(k)
            k = self.levels[k].parent
        return out

    def laminar(self, unit_nodes: Sequence[str]) -> Laminar:
        """Nested limits over units on ``unit_nodes`` (one node name per unit). A unit on a
        node the site does not place is held by the site's limit only."""
        leaf = np.array([self.node_level.get(n, 0) for n in unit_nodes], int)
        return Laminar(
            np.array([lv.parent for lv in self.levels]),
            np.array([lv.limit_w for lv in self.levels]),
            leaf,
            tuple(lv.name for lv in self.levels),
            tuple(lv.kind for lv in self.levels),
        )

    def unplaced_note(self, unit_nodes: Sequence[str]) -> str:
        """The note for jobs on nodes the site does not name ('' when every node is named)."""
        unplaced = sorted({n for n in unit_nodes if n not in self.node_level})
        if not unplaced:
            return ""
        return (
            f"note: node(s) {', '.join(unplaced[:5])} are not in the site file: their jobs are "
            "held by the site's limit only"
        )

    def node_share_w(self, node: str) -> float:
        """What one node may draw when nothing coordinates the nodes: its equal share of
        every level above it (its own limit, its rack's over the rack's nodes, ...), so
        every level holds when each node holds its share."""
        if node not in self.node_level:
            raise ConfigError(
                f"node {node!r} is not in the site file (its nodes: "
                f"{', '.join(sorted(self.node_level)[:8]) or 'none'})"
            )
        count = np.zeros(len(self.levels))
        for n in self.node_level:
            count[self.ancestors(self.node_level[n])] += 1
        return float(
            min(self.levels[k].limit_w / count[k] for k in self.ancestors(self.node_level[node]))
        )


def expand(spec: str) -> list[str]:
    """A SLURM host list (``node[1-3,7]``) as its host names."""
    return expand_hostlist(spec)


def slurm_node_features(doc: Mapping[str, Any]) -> dict[str, list[str]]:
    """Node name -> its features, from ``scontrol show nodes --json``."""
    out = {}
    for node in doc.get("nodes", []) if isinstance(doc, dict) else []:
        feats = node.get("features", node.get("active_features", []))
        if isinstance(feats, str):
            feats = [f for f in feats.split(",") if f]
        out[str(node.get("name", ""))] = [str(f) for f in feats]
    return out


def scontrol_nodes() -> dict[str, list[str]]:
    """Each node's features from ``scontrol show nodes --json``."""
    try:
        run = subprocess.run(
            ["scontrol", "show", "nodes", "--json"], capture_output=True, text=True, timeout=60
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise ConfigError(f"site file: node_map from SLURM, but scontrol failed ({exc})") from None
    if run.returncode != 0:
        raise ConfigError(
            f"site file: node_map from SLURM, but scontrol failed: {run.stderr.strip()[:200]}"
        )
    return slurm_node_features(json.loads(run.stdout))


def parse_site(
    doc: Any, where: str = "site file", slurm_nodes: Mapping[str, list[str]] | None = None
) -> Site:
    """A :class:`Site` from a site document; ``slurm_nodes`` (node -> features): the SLURM
    nodes, for ``node_map.from`` slurm-features or slurm-names (default: asked of scontrol)."""
    if not isinstance(doc, dict):
        raise ConfigError(
            f"{where}: expected a mapping with site: and feeds:, got a {type(doc).__name__}"
        )
    try:
        validate_schema(doc, SCHEMA)
    except ConfigError as e:
        raise ConfigError(f"{where}: {str(e).removeprefix('config error at ')}") from None
    kw = lambda d: float(d["limit_kw"]) * 1000.0 if "limit_kw" in d else math.inf  # noqa: E731
    feeds = doc["feeds"]
    levels = [Level(f"site:{doc['site']}", "site", kw(doc), -1)]
    seen: dict[str, str] = {}
    rack_nodes: list[tuple[int, list[Any]]] = []

    def add(kind: str, d: Mapping[str, Any], parent: int, path: str) -> int:
        name = f"{kind}:{d['name']}"
        if name in seen:
            raise ConfigError(
                f"{where}: {path}: {kind} {d['name']!r} is named twice (also at {seen[name]})"
            )
        seen[name] = path
        levels.append(Level(name, kind, kw(d), parent))
        return len(levels) - 1

    for i, f in enumerate(feeds):
        fi = add("feed", f, 0, f"feeds[{i}]")
        for j, p in enumerate(f["pdus"]):
            pj = add("pdu", p, fi, f"feeds[{i}].pdus[{j}]")
            for k, r in enumerate(p["racks"]):
                path = f"feeds[{i}].pdus[{j}].racks[{k}]"
                rack_nodes.append((add("rack", r, pj, path), r.get("nodes", [])))
    how = (doc.get("node_map") or {}).get("from", "file")
    node_level: dict[str, int] = {}
    rack_of: dict[str, str] = {}
    where_node: dict[str, str] = {}
    racks = {levels[r].name.removeprefix("rack:"): r for r, _ in rack_nodes}

    def place(node: str, rack: int, limit_w: float, origin: str) -> None:
        if node in where_node:
            raise ConfigError(
                f"{where}: node {node!r} is in two racks ({where_node[node]} and {origin})"
            )
        where_node[node] = origin
        rack_of[node] = levels[rack].name.removeprefix("rack:")
        if math.isfinite(limit_w):
            levels.append(Level(f"node:{node}", "node", limit_w, rack))
            node_level[node] = len(levels) - 1
        else:
            node_level[node] = rack

    if how == "file":
        for r, nodes in rack_nodes:
            for item in nodes:
                spec, lim = (item, math.inf) if isinstance(item, str) else (item["name"], kw(item))
                try:
                    names = expand(spec)
                except ValueError as exc:
                    raise ConfigError(
                        f"{where}: {levels[r].name}: node list {spec!r}: {exc}"
                    ) from None
                for n in names:
                    place(n, r, lim, levels[r].name)
        if not node_level:
            raise ConfigError(
                f"{where}: no rack lists its nodes (node_map.from: file): give each rack nodes: "
                "[...], or node_map: {from: slurm-features}"
            )
    else:
        if any(nodes for _, nodes in rack_nodes):
            raise ConfigError(
                f"{where}: node_map.from is {how}, but racks list nodes: list them in the file "
                "(node_map.from: file) or let SLURM say, not both"
            )
        found = scontrol_nodes() if slurm_nodes is None else dict(slurm_nodes)
        pattern = (doc.get("node_map") or {}).get("pattern")
        if how == "slurm-names":
            if not pattern:
                raise ConfigError(
                    f"{where}: node_map.from: slurm-names needs a pattern with a group (?P<rack>...)"
                )
            try:
                rx = re.compile(pattern)
            except re.error as exc:
                raise ConfigError(f"{where}: node_map.pattern {pattern!r}: {exc}") from None
            if "rack" not in rx.groupindex:
                raise ConfigError(
                    f"{where}: node_map.pattern {pattern!r} has no named group (?P<rack>...)"
                )
        for node, feats in sorted(found.items()):
            if how == "slurm-features":
                names = [f for f in feats if f in racks]
                if len(names) > 1:
                    raise ConfigError(
                        f"{where}: SLURM node {node} has the features of racks {', '.join(names)}"
                    )
            else:
                m = rx.search(node)
                names = [m.group("rack")] if m and m.group("rack") in racks else []
            if names:
                place(node, racks[names[0]], math.inf, f"SLURM ({how})")
        if not node_level:
            raise ConfigError(
                f"{where}: no SLURM node maps to a rack of the file by {how} "
                f"(racks {', '.join(sorted(racks))}; nodes {', '.join(sorted(found)[:8])})"
            )
    return Site(str(doc["site"]), tuple(levels), node_level, rack_of)


def read_site(path: str | Path, slurm_nodes: Mapping[str, list[str]] | None = None) -> Site:
    """:func:`parse_site` of a YAML file; a missing or unreadable file is a ConfigError."""
    p = Path(path)
    if not p.exists():
        raise ConfigError(f"site file {p}: no such file")
    try:
        doc = read_yaml(p)
    except ConfigError as exc:
        raise ConfigError(f"site file {exc}") from None
    return parse_site(doc, f"site file {p}", slurm_nodes)
