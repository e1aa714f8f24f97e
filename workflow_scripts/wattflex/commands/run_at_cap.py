"""``wattflex run-at-cap SPEC.json OUTDIR``: one run at one power cap, without Snakemake.

SPEC.json is the spec the workflow's ``run_at_cap`` rule builds (campaign, run_id, cap_w,
repeat, seed, backend, group, model_facts, run, and for ``backend: cuda`` a ``cuda``
section; see ``wattflex.runs.real_run``). OUTDIR receives telemetry.parquet, steps.parquet and
run.json. ``--cap-w`` overrides the spec's cap. A termination signal restores the GPU
power limits and exits with status 128+signal.

OUTDIR is claimed only at the end, in one step: the run is written into a private folder
beside it, which is then renamed onto OUTDIR; the OS does that only while OUTDIR is absent or
empty. A run (a measured one, or a second ``run-at-cap``) that landed in OUTDIR meanwhile is
kept as it is, and this run is kept in its private folder, named in the error.
"""

from __future__ import annotations

import argparse
import errno
import json
import logging
import math
import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from wattflex.commands import finite_float
from wattflex.commands._outputs import check_not_in_measured_run
from wattflex.errors import UserError
from wattflex.runs.protection import recorded_backend

NAME = "run-at-cap"
HELP = "Run one training job at one power cap (emulated or real GPUs) and write its telemetry"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """``wattflex run-at-cap``'s options on ``parser``: the spec, the output folder and ``--cap-w``
    (W per GPU, overriding the spec's).
    """
    parser.add_argument("spec", type=Path, help="run spec (JSON)")
    parser.add_argument("outdir", type=Path, help="output directory")
    parser.add_argument(
        "--cap-w",
        type=finite_float(min=0, strict=True),
        help="power cap per GPU in W (overrides the spec)",
    )


def check_spec(spec: object, path: Path) -> None:
    """Stop at the boundary, before any GPU time, on a spec the run would trip over later."""
    if not isinstance(spec, dict):
        raise UserError(
            f"{path}: not a run spec (a JSON object expected, found {type(spec).__name__})"
        )
    required = ["backend", "cap_w", "group", "run_id", "repeat"]
    if spec.get("backend") == "emulated":
        required += ["campaign", "model_facts"]
    missing = [k for k in required if k not in spec]
    if missing:
        raise UserError(f"{path}: not a run spec: missing {', '.join(missing)}")
    if spec["backend"] not in ("emulated", "cuda"):
        raise UserError(f"{path}: backend: {spec['backend']!r} is not one of emulated, cuda")
    if (
        not isinstance(spec["cap_w"], (int, float))
        or isinstance(spec["cap_w"], bool)
        or not 0 < spec["cap_w"] < math.inf
    ):
        raise UserError(f"{path}: cap_w: {spec['cap_w']!r} is not a positive number of watts")
    if not isinstance(spec["repeat"], int) or isinstance(spec["repeat"], bool):
        raise UserError(f"{path}: repeat: {spec['repeat']!r} is not an integer")
    if not isinstance(spec["group"], dict) or "id" not in spec["group"]:
        raise UserError(
            f"{path}: group: a JSON object with an id expected, found {spec['group']!r:.60}"
        )
    gpus = spec["group"].get("gpus", 1)
    if not isinstance(gpus, int) or isinstance(gpus, bool) or gpus < 1:
        raise UserError(
            f"{path}: group.gpus: {gpus!r} is not a positive whole number of GPUs (e.g. 8)"
        )
    for key in ("run", "model_facts", "cuda"):
        if key in spec and not isinstance(spec[key], dict):
            raise UserError(f"{path}: {key}: a JSON object expected, found {spec[key]!r:.60}")


def check_outdir(outdir: Path) -> None:
    """OUTDIR (or a folder above it) must not be a file: found only after the run, it wasted
    the run. Nor may OUTDIR hold files: a run written into it would replace a run that may be
    measured, or sit beside another run's stale summary.json and logs. Nor be a link, or lie
    in a measured run (the final rename would fail, or write into that run)."""
    for p in (outdir, *outdir.parents):
        if p.exists() and not p.is_dir():
            what = "OUTDIR" if p == outdir else f"{p}, a folder above OUTDIR,"
            raise UserError(f"{outdir}: {what} is a file, not a directory")
    if outdir.is_symlink():
        raise UserError(
            f"{outdir}: OUTDIR is a symbolic link (to {os.readlink(outdir)}); run-at-cap does not "
            "write through links: give the target's own path"
        )
    held = sorted(p.name for p in outdir.iterdir()) if outdir.is_dir() else []
    if held:
        backend = recorded_backend(outdir)
        what = f"holds a run ({backend} backend)" if backend else "is not empty"
        raise UserError(
            f"{outdir}: OUTDIR {what}: {', '.join(held[:4])}{' ...' if len(held) > 4 else ''}; "
            f"run-at-cap writes only into a new or empty directory: give another OUTDIR, or move "
            f"that one away first"
        )
    check_not_in_measured_run(outdir, "OUTDIR")  # a folder above it holds a measured run


@contextmanager
def claimed_outdir(outdir: Path) -> Iterator[Path]:
    """A private folder beside ``outdir`` for the run, renamed onto ``outdir`` on success.
    ``rename`` replaces only a missing or empty directory, so whatever filled OUTDIR during
    the run (a measured run copied there, a concurrent run-at-cap) is never replaced; this
    run is kept in its folder then. A failed run's folder is removed."""
    outdir.parent.mkdir(parents=True, exist_ok=True)
    stage = Path(tempfile.mkdtemp(prefix=f".{outdir.name[:64]}.run-at-cap.", dir=outdir.parent))
    try:
        yield stage
    except BaseException:
        shutil.rmtree(stage, ignore_errors=True)
        raise
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(stage, 0o777 & ~umask)  # an ordinary folder's mode, not mkdtemp's 0700
    try:
        os.rename(stage, outdir)
    except OSError as exc:
        why = (
            "was filled while this run ran: "
            + ", ".join(sorted(p.name for p in outdir.iterdir())[:4])
            if exc.errno in (errno.ENOTEMPTY, errno.EEXIST)
            else f"cannot be replaced ({exc.strerror})"
        )
        raise UserError(
            f"{outdir}: OUTDIR {why}; left it as it is. This run is kept in {stage}: "
            f"move it where it belongs"
        ) from None


def run(args: argparse.Namespace) -> int:
    # Lazy, like every heavy import of a command (wattflex.cli): --help must not load the run stack.
    """Run the spec at its cap into OUTDIR (telemetry.parquet, steps.parquet, run.json), claimed
    first and filled only on success. Returns the exit status: 0, or the signal's code when the
    run was stopped by SIGTERM/SIGINT (caps restored).

    Raises UserError for an unreadable or invalid spec or an unusable OUTDIR.
    """
    from wattflex.ingest.reader import read_input_text
    from wattflex.runs.devices.caps import CapSignal

    text = read_input_text(args.spec, "SPEC")  # not a file, or too big: says so
    try:
        spec = json.loads(text)
    except (OSError, ValueError) as exc:
        raise UserError(f"{args.spec}: cannot read the spec ({exc})") from exc
    if args.cap_w is not None:
        spec["cap_w"] = args.cap_w
    check_spec(spec, args.spec)
    check_outdir(args.outdir)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    from wattflex.runs.spec import RunSpec

    spec = RunSpec.of(spec, backend=None)  # parsed once, before OUTDIR is claimed
    try:
        try:
            from wattflex.runs.runner import run_at_cap
        except ImportError:
            if spec.backend != "cuda":
                raise UserError(
                    f"backend {spec.backend!r} needs wattflex.runs.runner, missing from this install"
                )
            from wattflex.runs.real_run import run_real as run_at_cap
        with claimed_outdir(args.outdir) as stage:
            run_at_cap(spec, stage)
    except CapSignal as sig:
        return int(sig.code)
    print(f"{args.outdir}: telemetry.parquet, steps.parquet, run.json")
    return 0
