#!/usr/bin/env python3
"""FAKE ``dcgmi``: replays a ``dcgmi dmon`` capture, for tests without DCGM or a GPU.

Tests put a program named ``dcgmi`` that runs this file on PATH (``install(dir)``). It
answers the two calls wattflex makes, with the real program's arguments:

* ``dcgmi discovery -l``: exits 0 (the host engine answers). With ``FAKE_DCGMI_DOWN`` set,
  every command exits 255 with DCGM's "Unable to connect to host engine" lines.
* ``dcgmi dmon -e <field ids> [-i <gpu ids>] [-d <ms>] [-c <count>]``: prints the capture's
  rows (``FAKE_DCGMI_CAPTURE``, default ``tests/data/dcgm_dmon_h100x2.txt``) one sample (one
  row per GPU) every ``-d`` ms, starting over at its end, with the ``#Entity`` header and
  units line before the first sample and again every ``HEADER_EVERY`` samples (as dmon
  does). Only the columns asked for by ``-e`` are printed, in that order; a field id the
  capture lacks is refused (the fake never makes up values).

Provenance of the capture: it came with the ingest commit (e9b6ea9, "Ingest: ... DCGM
exporter/dcgmi dmon captures") with no source named; its exporter twin
(dcgm_exporter_h100x2.prom) carries made-up-looking GPU UUIDs and scrape times of the commit's
day, so treat both as format samples written to DCGM's layout, not as a recording of a GPU.
What the tests rely on is the layout (header, units line, ``GPU <i>`` rows, ``N/A``), which
follows dcgmi dmon's output.

The capture's columns and their DCGM field ids (dcgm_fields.h): POWER 155, TOTEC 156, SMCLK
100, MMCLK 101, TMPTR 150, GPUTL 203, MCUTL 204, FBUSD 252, SMACT 1002, TENSO 1004, DRAMA
1005, PMLMT 160, EPLMT 164. Replaying loops TOTEC (the energy counter) back to its start.
"""

from __future__ import annotations

import argparse
import os
import stat
import sys
import time
from pathlib import Path

CAPTURE_ENV = "FAKE_DCGMI_CAPTURE"
DOWN_ENV = "FAKE_DCGMI_DOWN"
DEFAULT_CAPTURE = Path(__file__).resolve().parents[1] / "data" / "dcgm_dmon_h100x2.txt"
FIELD_IDS = {
    155: "POWER",
    156: "TOTEC",
    100: "SMCLK",
    101: "MMCLK",
    150: "TMPTR",
    203: "GPUTL",
    204: "MCUTL",
    252: "FBUSD",
    1002: "SMACT",
    1004: "TENSO",
    1005: "DRAMA",
    160: "PMLMT",
    164: "EPLMT",
}
HEADER_EVERY = 10


def read_capture(path: Path) -> tuple[list[str], list[str], list[list[tuple[int, list[str]]]]]:
    """(column names, units, samples); a sample is [(gpu id, values)], one entry per GPU."""
    names, units, samples, seen = [], [], [], set()
    for line in path.read_text().splitlines():
        tokens = line.split()
        if not tokens:
            continue
        if tokens[0] == "#Entity":
            names = tokens[1:]
        elif tokens[0] == "ID":
            units = line
        elif tokens[0] == "GPU":
            gpu = int(tokens[1])
            if gpu in seen or not samples:
                samples.append([])
                seen = set()
            seen.add(gpu)
            samples[-1].append((gpu, tokens[2:]))
    return names, units, samples


def dmon(args: argparse.Namespace) -> int:
    names, _, samples = read_capture(Path(os.environ.get(CAPTURE_ENV) or DEFAULT_CAPTURE))
    try:
        ids = [int(f) for f in args.e.split(",")]
    except ValueError:
        print(f"Error: invalid field id list {args.e!r}", file=sys.stderr)
        return 255
    lacking = [i for i in ids if FIELD_IDS.get(i) not in names]
    if lacking:
        print(f"FAKE dcgmi: the capture has no field(s) {lacking}", file=sys.stderr)
        return 255
    cols = [names.index(FIELD_IDS[i]) for i in ids]
    gpus = None if args.i is None else {int(g) for g in args.i.split(",")}
    header = "#Entity   " + "".join(f"{FIELD_IDS[i]:<10}" for i in ids)
    units = "ID        " + "".join(f"{'':<10}" for _ in ids)
    n = 0
    while args.c <= 0 or n < args.c:
        if n % HEADER_EVERY == 0:
            print(header)
            print(units)
        for gpu, values in samples[n % len(samples)]:
            if gpus is None or gpu in gpus:
                print(f"GPU {gpu:<6}" + "".join(f"{values[c]:<10}" for c in cols))
        sys.stdout.flush()
        n += 1
        if args.c <= 0 or n < args.c:
            time.sleep(args.d / 1000.0)
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="dcgmi")
    sub = p.add_subparsers(dest="cmd", required=True)
    d = sub.add_parser("dmon")
    d.add_argument("-e", required=True)
    d.add_argument("-i", default=None)
    d.add_argument("-d", type=int, default=1000)
    d.add_argument("-c", type=int, default=0)
    disc = sub.add_parser("discovery")
    disc.add_argument("-l", action="store_true")
    a = p.parse_args(argv)
    if os.environ.get(DOWN_ENV):
        print(
            "Error: unable to establish a connection to the specified host: localhost",
            file=sys.stderr,
        )
        print(
            "Error: Unable to connect to host engine. Host engine connection invalid/disconnected.",
            file=sys.stderr,
        )
        return 255
    if a.cmd == "discovery":
        print("2 GPUs found.")
        return 0
    try:
        return dmon(a)
    except (BrokenPipeError, KeyboardInterrupt):
        return 0


def install(bin_dir: Path) -> Path:
    """Write an executable ``dcgmi`` into ``bin_dir`` that runs this fake; returns its path."""
    bin_dir.mkdir(parents=True, exist_ok=True)
    prog = bin_dir / "dcgmi"
    prog.write_text(f'#!/bin/sh\nexec {sys.executable} {Path(__file__).resolve()} "$@"\n')
    prog.chmod(prog.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    return prog


if __name__ == "__main__":
    sys.exit(main())
