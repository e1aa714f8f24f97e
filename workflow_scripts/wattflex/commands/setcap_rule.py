"""``wattflex setcap-rule``: what an admin installs so users can cap their own job's GPUs without root.

Setting a power limit needs root (CAP_SYS_ADMIN), so ``cuda.cap_control: nvml`` stops a
non-root user's first run. This prints the documented unprivileged path (docs/slurm.md
"Capping without root", ``wattflex.runs.devices.setcap``): the root-owned wrapper
``slurm/wattflex-setcap`` (it caps only GPUs of the caller's running SLURM job on this node,
within the card's range, through ``nvidia-smi -i GPU -pl WATTS``), the one sudoers rule that
lets a group run exactly that wrapper, and the ``cuda.cap_command`` that uses it. It installs nothing.
"""

from __future__ import annotations

import argparse

from wattflex.runs.devices import setcap  # light (re, the schema's paths): --help may import it

NAME = "setcap-rule"
HELP = (
    "Print the wrapper, sudoers rule and cuda.cap_command that let non-root users cap their own "
    "SLURM job's GPUs (for the admin to install); changes nothing"
)
PARTS = ("all", "wrapper", "sudoers", "cap-command")
#: option dest -> (the wrapper's setting, its shipped value)
TOOL_OPTIONS = {name.lower(): (name, default) for name, default in setcap.TOOLS.items()}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """``wattflex setcap-rule``'s options on ``parser``: the part to print, the group or user
    allowed, the wrapper's path, the tools' paths and the node name.
    """
    parser.add_argument(
        "--part",
        choices=PARTS,
        default="all",
        help="all: the install steps with the rule and the cap command (default); wrapper: the "
        "wrapper script alone (to install as root, 0755); sudoers: the rule alone; "
        "cap-command: the cuda.cap_command alone",
    )
    who = parser.add_mutually_exclusive_group()
    who.add_argument(
        "--group",
        default="wattflex",
        help="Unix group allowed to run the wrapper (default wattflex)",
    )
    who.add_argument("--user", help="one user instead of a group (a name, or #UID)")
    parser.add_argument(
        "--path",
        default=setcap.DEFAULT_PATH,
        help=f"where the wrapper is installed (default {setcap.DEFAULT_PATH})",
    )
    for opt, (_, default) in TOOL_OPTIONS.items():
        parser.add_argument(
            f"--{opt.replace('_', '-')}",
            default=default,
            help=f"absolute path of {opt.replace('_', '-')} on the GPU nodes (default {default}); "
            f"the wrapper runs this, never a program from the caller's PATH",
        )
    parser.add_argument(
        "--node-name",
        default="",
        help="SLURM's name for the nodes, where it is not the short host name (default: host name)",
    )


def run(args: argparse.Namespace) -> int:
    """Print the part asked for: the wrapper script, the sudoers line, the cap command, or all
    three as install steps. Returns the exit status, 0.
    """
    tools = {name: getattr(args, opt) for opt, (name, _) in TOOL_OPTIONS.items()}
    texts = {
        "wrapper": setcap.wrapper_text(tools, args.node_name),
        "sudoers": setcap.sudoers_line(args.group, args.user, args.path),
        "cap-command": setcap.cap_command(args.path),
    }
    print(texts[args.part].rstrip("\n") if args.part != "all" else install_steps(args, texts))
    return 0


def install_steps(args: argparse.Namespace, texts: dict[str, str]) -> str:
    """The admin's install steps as shell text: the command again for the wrapper, its install as
    root 0755, the sudoers rule checked by visudo, and the campaign config lines.
    """
    again = (
        "wattflex setcap-rule"
        + "".join(
            f" --{opt.replace('_', '-')} {getattr(args, opt)}"
            for opt, (_, default) in TOOL_OPTIONS.items()
            if getattr(args, opt) != default
        )
        + (f" --node-name {args.node_name}" if args.node_name else "")
    )
    return (
        f"# Capping without root (docs/slurm.md): as root on every GPU node\n"
        f"# 1. the wrapper, root's and 0755 (it caps only GPUs of the caller's running SLURM job on\n"
        f"#    this node, within the card's range, with {args.nvidia_smi} -i GPU -pl WATTS):\n"
        f"{again} --part wrapper > /root/wattflex-setcap\n"
        f"install -m 0755 -o root -g root /root/wattflex-setcap {args.path}\n"
        f"# 2. the sudoers rule allowing exactly that wrapper (checked by visudo before it counts):\n"
        f"echo '{texts['sudoers'].strip()}' > /root/wattflex-sudoers\n"
        f"visudo -cf /root/wattflex-sudoers && install -m 0440 -o root -g root /root/wattflex-sudoers "
        f"/etc/sudoers.d/wattflex\n"
        f"# 3. in the campaign config of the group's users (wattflex doctor --configfile checks sudo allows it):\n"
        f"cuda:\n  cap_control: command\n  cap_command: {texts['cap-command']}\n"
    )
