"""The ``wattflex`` command.

Each subcommand lives in its own module under ``wattflex.commands`` and exposes
``NAME``, ``HELP``, ``add_arguments(parser)`` and ``run(args) -> int``; this dispatcher
discovers them, so adding a command never touches this file. Every command module is
imported to build ``--help``, so command modules import only light things at the top
(registries such as ``wattflex.allocation.policies``) and their heavy libraries inside
``run``: ``wattflex pfi`` does not pay for torch or scikit-learn.
"""

from __future__ import annotations

import argparse
import importlib
import pkgutil
import sys

from wattflex import __version__, commands
from wattflex.errors import UserError


def _command_modules() -> list[str]:
    return sorted(m.name for m in pkgutil.iter_modules(commands.__path__) if not m.name.startswith("_"))


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="wattflex", description="Measure and exploit the power flexibility (PFI) of AI training jobs.")
    parser.add_argument("--version", action="version", version=f"wattflex {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in _command_modules():
        mod = importlib.import_module(f"{commands.__name__}.{name}")
        p = sub.add_parser(mod.NAME, help=mod.HELP, description=mod.HELP)
        mod.add_arguments(p)
        p.set_defaults(_run=mod.run)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "_run", None):
        parser.print_help()
        return 2
    try:
        return int(args._run(args) or 0)
    except (UserError, FileNotFoundError, ValueError, KeyError) as exc:
        msg = exc.args[0] if isinstance(exc, KeyError) and exc.args else exc
        print(f"wattflex {args.command}: error: {msg}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
