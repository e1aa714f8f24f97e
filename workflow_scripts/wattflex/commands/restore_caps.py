"""``wattflex restore-caps [--state-dir D]``: put back GPU power limits a killed run left.

Every capped run writes the original limits to ``<state-dir>/caps-<host>-<pid>.json``
before changing them and removes the file after restoring. A file whose process is gone
means the run was killed (SIGKILL, node crash): this command restores those limits on
this host. Run it from a SLURM epilog (``wattflex restore-caps`` as root) or by hand.
Exit status 1 when a restore failed.
"""

from __future__ import annotations

import argparse

NAME = "restore-caps"
HELP = "Restore GPU power limits left behind by a killed wattflex run on this host"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--state-dir", help="directory of cap state files (default $WATTFLEX_STATE_DIR "
                        "or /var/tmp/wattflex)")
    parser.add_argument("--force", action="store_true",
                        help="also restore files whose process still runs (it will find its cap gone)")
    parser.add_argument("--dry-run", action="store_true", help="list what would be restored, change nothing")


def run(args: argparse.Namespace) -> int:
    # Lazy, like every heavy import of a command (wattflex.cli): --help must not load the run stack.
    from wattflex.runs.devices.caps import default_state_dir, restore_from_state_dir

    from pathlib import Path

    from wattflex.errors import UserError

    state_dir = args.state_dir or default_state_dir()
    # A file where the folder should be would read as "nothing to restore": GPUs left capped.
    if Path(state_dir).exists() and not Path(state_dir).is_dir():
        raise UserError(f"{state_dir}: the state dir is a file, not a directory")
    results = restore_from_state_dir(state_dir, force=args.force, dry_run=args.dry_run)
    if not results:
        print(f"no cap state files for this host in {state_dir}: nothing to restore")
        return 0
    failed = 0
    for r in results:
        gpus = ", ".join(f"GPU {g['index']} -> {g['original_limit_w']:g} W" for g in r.get("gpus", []))
        line = f"{r['path']}: {r['action']}" + (f" ({gpus})" if gpus else "")
        if r.get("error"):
            failed += 1
            line += f": {r['error']}"
        print(line)
    return 1 if failed else 0
