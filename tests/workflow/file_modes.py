"""Run a command as a process that file modes bind, whoever runs the tests and wherever the
clone is.

Snakemake decides "write-protected" with os.access(W_OK), which root passes through
CAP_DAC_OVERRIDE. Running the command as another uid (65534) needs that user to reach the
clone's venv and interpreter, which it cannot when a folder above them is 0700 (a clone in
/root or in a `mktemp -d` folder). Root without the file-permission capabilities is bound by
file modes exactly like an unprivileged user (access(2) gives root only the capabilities in its
permitted set) and still reaches everything root owns.
"""

from __future__ import annotations

import os
import shutil

# The capabilities that let root pass file-mode checks (capabilities(7)).
FILE_MODE_CAPS = ("dac_override", "dac_read_search", "fowner")


def why_not_bound() -> str:
    """'' if a command can be run bound by file modes here, else why not (a skip reason)."""
    if os.geteuid() == 0 and shutil.which("setpriv") is None:
        return "running as root needs setpriv (util-linux) to drop the file-permission capabilities"
    return ""


def bound_by_file_modes(cmd: list[str]) -> list[str]:
    """``cmd`` as this user without the capabilities that override file modes (a no-op for a
    non-root user, whom file modes bind already)."""
    if os.geteuid() != 0:
        return cmd
    drop = ",".join(f"-{cap}" for cap in FILE_MODE_CAPS)
    # Out of the bounding set, so neither this process nor what it starts can regain them.
    return ["setpriv", f"--bounding-set={drop}", "--inh-caps=-all", *cmd]
