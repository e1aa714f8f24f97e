"""``wattflex doctor``: what this machine offers wattflex, without changing anything.

NVML and the driver; each GPU's power limits, clocks, GPM readability, persistence mode;
whether this process could set power limits (inferred, never tried); DCGM; RAPL host
power; torch and CUDA; the SLURM clients and profile; cap state files of killed runs.
Each missing piece says what is lost without it. Exit status 1 when something the config
(``--configfile``, default ``config/config.yaml`` here) needs is missing, or one of its groups
cannot fit its GPUs or host memory (the resource plan, ``wattflex.runs.plan``), else 0.
"""

from __future__ import annotations

import argparse

NAME = "doctor"
HELP = "Report what this machine offers wattflex (NVML, GPUs, caps, DCGM, RAPL, torch, SLURM); changes nothing"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """``wattflex doctor``'s options on ``parser``: ``--json``, the config whose needs set the exit
    status, a dcgm-exporter URL and the cap state folder.
    """
    parser.add_argument(
        "--json", action="store_true", help="print one JSON document instead of the report"
    )
    parser.add_argument(
        "--configfile",
        help="campaign config whose needs decide the exit status "
        "(default: config/config.yaml in the current directory, if present)",
    )
    parser.add_argument(
        "--dcgm-exporter",
        metavar="URL",
        help="dcgm-exporter endpoint to check, e.g. http://localhost:9400/metrics (2 s timeout)",
    )
    parser.add_argument(
        "--state-dir",
        help="cap state files (default $WATTFLEX_STATE_DIR, else /var/tmp/wattflex for root, /var/tmp/wattflex-<uid> for a user)",
    )


def run(args: argparse.Namespace) -> int:
    # Lazy, like every heavy import of a command (wattflex.cli).
    """Diagnose this machine and print the report (or one JSON document with ``--json``). Returns
    the exit status: 0 when the config's needs are met, 1 otherwise. Changes nothing.
    """
    from wattflex.diagnosis import diagnose, format_report
    from wattflex.provenance import strict_json

    report = diagnose(args.configfile, args.dcgm_exporter, args.state_dir)
    print(strict_json(report, indent=2) if args.json else format_report(report).rstrip("\n"))
    return 0 if report["ok"] else 1
