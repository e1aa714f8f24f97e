"""The ``wattflex`` command.

Each subcommand lives in its own module under ``wattflex.commands`` and exposes
``NAME``, ``HELP``, ``add_arguments(parser)`` and ``run(args) -> int``; this dispatcher
discovers them, so adding a command never touches this file. Every command module is
imported to build ``--help``, so command modules import only light things at the top
(registries such as ``wattflex.policies``) and their heavy libraries inside
``run``: ``wattflex pfi`` does not pay for torch or scikit-learn.
"""

from __future__ import annotations

import argparse
import importlib
import os
import pkgutil
import signal
import sys
import traceback

from wattflex import __version__, commands
from wattflex.commands._help import EXAMPLES, GROUPS
from wattflex.errors import UserError
from wattflex.provenance import OutputWriteError

TRACEBACK_ENV = "WATTFLEX_TRACEBACK"  # set (not 0): the traceback above the one-line error


def _command_modules() -> list[str]:
    return sorted(
        m.name for m in pkgutil.iter_modules(commands.__path__) if not m.name.startswith("_")
    )


class OneLineParser(argparse.ArgumentParser):
    """Bad input is one line and exit status 2 (docs/cli.md), also argparse's own errors: an
    out-of-range number (``wattflex.commands.finite_float``), a missing argument, a bad choice."""

    def error(self, message: str):  # type: ignore[override]
        """Exit with status 2 and the error on one line, pointing at ``--help`` (never the usage block)."""
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def build_parser() -> argparse.ArgumentParser:
    """The ``wattflex`` parser: one subcommand per module of ``wattflex.commands`` (its ``NAME``,
    ``HELP`` and options, grouped as ``commands._help`` says), each bound to its module's ``run``.
    Imports only the commands' light modules, so ``--help`` stays fast.
    """
    parser = OneLineParser(
        prog="wattflex",
        description="Measure and exploit the power flexibility (PFI) of AI training jobs.",
    )
    parser.add_argument("--version", action="version", version=f"wattflex {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=OneLineParser)
    for name in _command_modules():
        mod = importlib.import_module(f"{commands.__name__}.{name}")
        examples = EXAMPLES.get(mod.NAME, ())
        p = sub.add_parser(
            mod.NAME,
            help=mod.HELP,
            description=mod.HELP,
            formatter_class=HelpFormatter,
            epilog="examples:\n" + "\n".join(f"  {e}" for e in examples) if examples else None,
        )
        mod.add_arguments(p)
        group_options(p, GROUPS.get(mod.NAME, {}))
        p.set_defaults(_run=mod.run)
    return parser


class HelpFormatter(argparse.RawDescriptionHelpFormatter):
    """Each option's default shown as its value, ``(default: 0.3)``, where its help does not
    already say it; the examples kept as written."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        default = action.default
        if (
            "default" in text
            or default in (None, False, [], "")
            or default is argparse.SUPPRESS
            or not action.option_strings
        ):
            return text
        return f"{text} (default: {str(default).replace('%', '%%')})"


def group_options(parser: argparse.ArgumentParser, groups: dict[str, tuple[str, ...]]) -> None:
    """Move ``parser``'s options into titled groups (title: the options' first spellings), in
    --help order; an option no group names stays under "options". argparse has no public way
    to move an option once added: this moves it between the groups' action lists."""
    home = parser._optionals
    by_flag = {a.option_strings[0]: a for a in home._group_actions if a.option_strings}
    for title, flags in groups.items():
        group = parser.add_argument_group(title)
        for flag in flags:
            action = by_flag.get(flag)
            if action is not None and action in home._group_actions:
                home._group_actions.remove(action)
                group._group_actions.append(action)


def main(argv: list[str] | None = None) -> int:
    """Run ``wattflex`` with ``argv`` (default: ``sys.argv[1:]``). Returns the exit status: the
    command's own, 2 for bad input (a ``UserError``, ``OSError``, ``ValueError`` or ``KeyError``,
    printed as one line; ``WATTFLEX_TRACEBACK=1`` adds the traceback), 128 + SIGPIPE when the
    reader of stdout went away, 128 + SIGINT on Ctrl-C.
    """
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "_run", None):
        parser.print_help()
        return 2
    try:
        status = int(args._run(args) or 0)
        sys.stdout.flush()  # a closed pipe shows here, not in Python's flush at exit
        return status
    except BrokenPipeError:
        # The reader went away (`wattflex pfi ... | head -1`): stop quietly, as `cat` does, with
        # 128 + SIGPIPE; stdout goes to /dev/null so the flush at exit cannot complain again.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 128 + signal.SIGPIPE
    except KeyboardInterrupt:
        print(f"wattflex {args.command}: interrupted", file=sys.stderr)
        return 128 + signal.SIGINT
    except (UserError, OSError, ValueError, KeyError) as exc:
        if os.environ.get(TRACEBACK_ENV, "") not in ("", "0"):
            traceback.print_exc()  # a message that names no input of yours may be a bug: this shows where
        print(f"wattflex {args.command}: error: {_one_line(exc)}", file=sys.stderr)
        return 2


def _one_line(exc: BaseException) -> str:
    """The message of a user-facing error: a KeyError's key, an OSError's path and cause."""
    if isinstance(exc, KeyError) and exc.args:
        return str(exc.args[0])
    if isinstance(exc, OSError) and exc.strerror and not isinstance(exc, OutputWriteError):
        return f"{exc.filename}: {exc.strerror}" if exc.filename else exc.strerror
    return " ".join(str(exc).split()) or type(exc).__name__


if __name__ == "__main__":
    sys.exit(main())
