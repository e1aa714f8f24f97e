"""``wattflex restore-caps [--state-dir D]``: put back GPU power limits (and reset SM clock locks) a killed run left.

Every capped run writes the original limits to ``<state-dir>/caps-<host>-<pid>.json``
before changing them and removes the file after restoring. A file whose process is gone
means the run was killed (SIGKILL, node crash): this command restores those limits on
this host. A clock-locked run (``knob: clock``) writes ``clocks-<host>-<pid>.json`` the same way;
its locks are reset through NVML (root). Run it from a SLURM epilog (``wattflex restore-caps`` as root) or by hand.
Exit status 1 when a restore failed.

Run as root, it trusts only what root, its own user or the job's user (``--job-uid``) wrote
(``wattflex.runs.devices.cap_state``); it never runs a command read from a record, and puts back
at most the card's range (a user's record: the card's default limit). A record of the job's user
reaches only the job's GPUs as SLURM gives them (``--job-gpus``, the epilog's
``$SLURM_JOB_GPUS``), and root runs a ``--cap-command`` only when root owns it end to end
(``cap_state.command_problem``).
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from wattflex.commands import whole_number

NAME = "restore-caps"
HELP = (
    "Restore GPU power limits and SM clock locks left behind by a killed wattflex run on this host"
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """``wattflex restore-caps``'s options on ``parser``: the state folders, the cap command, and the
    job's user and GPUs whose records are trusted.
    """
    parser.add_argument(
        "--state-dir",
        action="append",
        help="directory of cap state files; repeat for several (default $WATTFLEX_STATE_DIR, "
        "else /var/tmp/wattflex for root and /var/tmp/wattflex-<uid> for a user, and, for root "
        "with --job-uid, that user's folder too)",
    )
    parser.add_argument(
        "--cap-command",
        help="the installation's cap command template (e.g. 'sudo "
        "/usr/local/bin/setcap {gpu} {watts}'); default: NVML, which needs root. Run as root, its "
        "program (an absolute path) and its interpreters must be root's end to end. A command "
        "recorded in a state file is never run",
    )
    parser.add_argument(
        "--job-uid",
        type=whole_number(0, 2**32 - 1),
        default=os.environ.get("SLURM_JOB_UID") or None,
        help="also trust records owned by this user (default $SLURM_JOB_UID: the epilog's job)",
    )
    parser.add_argument(
        "--job-gpus",
        type=gpu_list,
        default=os.environ.get("SLURM_JOB_GPUS") or None,
        help="the job's GPU indices as SLURM gives them, e.g. 0,1 or 0-3 (default "
        "$SLURM_JOB_GPUS: the epilog's job); a record of --job-uid restores only these",
    )
    parser.add_argument(
        "--force",
        action="store_true",
        help="also restore files whose process still runs (it will find its cap gone)",
    )
    parser.add_argument(
        "--dry-run", action="store_true", help="list what would be restored, change nothing"
    )


def run(args: argparse.Namespace) -> int:
    # Lazy, like every heavy import of a command (wattflex.cli): --help must not load the run stack.
    """Put back the power limits and clock locks recorded in the state folders' files for this
    host, printing one line per file. Returns the exit status: 0 when all were restored (or none
    was there), 1 when any failed.

    Raises UserError for an unsafe ``--cap-command`` or a state folder that is a file.
    """
    import shlex
    from pathlib import Path

    from wattflex.errors import UserError
    from wattflex.runs.devices.cap_state import command_problem
    from wattflex.runs.devices.caps import cap_command_problem, restore_from_state_dir
    from wattflex.runs.devices.clocks import restore_clocks_from_state_dir

    problem = cap_command_problem(args.cap_command) if args.cap_command else None
    if not problem and args.cap_command and os.geteuid() == 0:
        problem = command_problem(shlex.split(args.cap_command))
        problem = problem and f"not run as root: {problem}"
    if problem:
        raise UserError(f"--cap-command {args.cap_command!r}: {problem}")
    job_gpus = args.job_gpus
    job_uid = args.job_uid
    folders = args.state_dir or default_folders(job_uid)
    results = []
    for state_dir in folders:
        # A file where the folder should be would read as "nothing to restore": GPUs left capped.
        if (
            Path(state_dir).exists()
            and not Path(state_dir).is_dir()
            and not Path(state_dir).is_symlink()
        ):
            raise UserError(f"{state_dir}: the state dir is a file, not a directory")
        results += restore_from_state_dir(
            state_dir,
            force=args.force,
            dry_run=args.dry_run,
            cap_command=args.cap_command,
            job_uid=job_uid,
            job_gpus=job_gpus,
        )
        results += restore_clocks_from_state_dir(
            state_dir, force=args.force, dry_run=args.dry_run, job_uid=job_uid, job_gpus=job_gpus
        )
    if not results:
        print(
            f"no cap or clock state files for this host in {', '.join(map(str, folders))}: nothing to restore"
        )
        return 0
    failed = 0
    for r in results:
        gpus = ", ".join(
            f"GPU {g['index']} clock lock reset"
            if r.get("kind") == "clock"
            else f"GPU {g['index']} -> {g.get('restored_w', g['original_limit_w']):g} W"
            for g in r.get("gpus", [])
        )
        line = f"{r['path']}: {r['action']}" + (f" ({gpus})" if gpus else "")
        if r.get("error"):
            failed += 1
            line += f": {r['error']}"
        elif r.get("note"):  # untrusted: no trusted run wrote it, so no GPU is capped by it
            line += f": {r['note']}; left alone"
        print(line)
    return 1 if failed else 0


def default_folders(job_uid: int | None) -> list[Path]:
    """This user's default folder and, for root restoring a job, the job user's."""
    from wattflex.runs.devices.caps import default_state_dir

    folders = [default_state_dir()]
    if job_uid is not None and os.geteuid() == 0 and default_state_dir(job_uid) not in folders:
        folders.append(default_state_dir(job_uid))
    return folders


def gpu_list(text: str) -> frozenset[int]:
    """SLURM's GPU index list (``0,1``, ``0-3``, ``0,2-3``; ``$SLURM_JOB_GPUS``) as a set."""
    out: set[int] = set()
    for part in text.split(","):
        lo, _, hi = part.strip().partition("-")
        if not (lo.isascii() and lo.isdigit() and (not hi or (hi.isascii() and hi.isdigit()))):
            raise argparse.ArgumentTypeError(
                f"{text!r}: expected GPU indices as SLURM lists them, e.g. 0,1 or 0-3"
            )
        out.update(range(int(lo), int(hi or lo) + 1))
    return frozenset(out)
