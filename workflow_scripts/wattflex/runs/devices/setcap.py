"""Capping without root: the sudo wrapper ``slurm/wattflex-setcap`` and what goes with it.

Setting a power limit needs CAP_SYS_ADMIN, so a cluster user's ``cap_control: nvml`` stops at
the first cap. The documented way around it (docs/slurm.md "Capping without root") is a
root-owned wrapper that caps only GPUs of the caller's running SLURM job on its node, within
the card's range, one sudoers rule allowing exactly that wrapper, and a ``cap_command`` that
runs it through ``sudo -n``. ``wattflex setcap-rule`` prints them; ``wattflex doctor`` points
non-root users here.
"""

from __future__ import annotations

import re

from wattflex.errors import UserError
from wattflex.schema import REPO_ROOT

WRAPPER_SOURCE = REPO_ROOT / "slurm" / "wattflex-setcap"
DEFAULT_PATH = "/usr/local/sbin/wattflex-setcap"
#: the wrapper's settings (its lines ``NAME = "value"``) and their shipped values
TOOLS = {
    "NVIDIA_SMI": "/usr/bin/nvidia-smi",
    "SQUEUE": "/usr/bin/squeue",
    "SLURMD": "/usr/sbin/slurmd",
    "SLURM_CONF": "/etc/slurm/slurm.conf",
    "NVIDIA_PROC": "/proc/driver/nvidia/gpus",
}
# Written into sudoers and into a program root runs: plain names and paths only (no spaces,
# commas, '=' or '\', which sudoers reads as syntax; no quote, which would end a Python string).
SAFE_PATH = re.compile(r"/[A-Za-z0-9_.+/-]+")
SAFE_WHO = re.compile(r"[A-Za-z_][A-Za-z0-9_.-]*|#[0-9]+")
SAFE_NODE = re.compile(r"[A-Za-z0-9][A-Za-z0-9.-]*")


def cap_command(path: str = DEFAULT_PATH) -> str:
    """The ``cap_command`` template (``wattflex.runs.devices.caps.command_setter``); -n: fail, never prompt."""
    return f"sudo -n {checked_path(path, 'path')} {{gpu}} {{watts}}"


def sudoers_line(
    group: str | None = None, user: str | None = None, path: str = DEFAULT_PATH
) -> str:
    """The one rule: the members of ``group`` (or ``user``, a name or ``#uid``) may run the wrapper as
    root, with any arguments (the wrapper checks them)."""
    option, name = ("user", user) if user else ("group", group)
    if not SAFE_WHO.fullmatch(name or ""):
        raise UserError(
            f"--{option} {name!r}: expected a user or group name (letters, digits, . _ -) or #UID"
        )
    return f"{name if user else '%' + name} ALL=(root) NOPASSWD: {checked_path(path, 'path')}\n"


def wrapper_text(tools: dict[str, str] | None = None, node_name: str = "") -> str:
    """The shipped wrapper with the programs' absolute paths (``TOOLS`` keys) and the node name filled in."""
    if node_name and not SAFE_NODE.fullmatch(node_name):
        raise UserError(f"--node-name {node_name!r}: expected a host name (letters, digits, . -)")
    settings = {**TOOLS, **(tools or {})}
    settings = {
        name: checked_path(p, name.lower().replace("_", "-")) for name, p in settings.items()
    }
    text = WRAPPER_SOURCE.read_text()
    for name, value in {**settings, "NODE_NAME": node_name}.items():
        text, n = re.subn(rf'^{name} = "[^"\n]*"', f'{name} = "{value}"', text, count=1, flags=re.M)
        if n != 1:
            raise RuntimeError(f"{WRAPPER_SOURCE} lost its {name} line")
    return text


def checked_path(path: str, option: str) -> str:
    """``path`` when it is an absolute path safe to put in a sudoers rule and a shell line.

    Raises UserError naming ``--<option>`` otherwise.
    """
    if not SAFE_PATH.fullmatch(str(path)):
        raise UserError(
            f"--{option} {str(path)!r}: expected an absolute path of letters, digits and . _ + - /"
        )
    return str(path)
