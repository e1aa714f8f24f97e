"""Subcommands of ``wattflex``: one module each (see ``wattflex.cli``), and the argparse
``type`` helpers their options share: a number is range-checked where it is parsed, so
``nan``, ``inf`` or ``-5`` never reach a command as a value it quietly runs on."""

from __future__ import annotations

import argparse
import logging
import math
import sys
from collections.abc import Iterator
from contextlib import contextmanager


def finite_float(min: float | None = None, max: float | None = None, strict: bool = False):
    """An argparse ``type``: a finite number in ``[min, max]`` (``(min, max]`` if ``strict``);
    anything else is argparse's usage error naming the option and the range allowed."""
    low = "" if min is None else f"{'>' if strict else '>='} {min:g}"
    allowed = " and ".join(filter(None, (low, "" if max is None else f"<= {max:g}")))

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            value = math.nan
        too_low = min is not None and (value <= min if strict else value < min)
        if not math.isfinite(value) or too_low or (max is not None and value > max):
            raise argparse.ArgumentTypeError(
                f"{text!r}: must be a finite number{' ' + allowed if allowed else ''}"
            )
        return value

    parse.__name__ = "number"  # argparse names the type by it in its own messages
    return parse


def whole_number(min: int | None = None, max: int | None = None):
    """An argparse ``type``: a whole number in ``[min, max]``, else a usage error saying so."""
    allowed = " and ".join(
        filter(None, ("" if min is None else f">= {min}", "" if max is None else f"<= {max}"))
    )

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            value = None
        if value is None or (min is not None and value < min) or (max is not None and value > max):
            raise argparse.ArgumentTypeError(
                f"{text!r}: must be a whole number{' ' + allowed if allowed else ''}"
            )
        return value

    parse.__name__ = "whole number"
    return parse


def name_list(text: str) -> list[str]:
    """A comma-separated option (``--order dense, moe-pt``): its names, each stripped of the
    blanks around it, empty ones dropped."""
    return [name for name in (part.strip() for part in text.split(",")) if name]


def read_site_option(path: str):
    """``--site``: the site file (:func:`wattflex.ops.adapters.topology.read_site`), a bad one refused
    with its one line."""
    from wattflex.errors import ConfigError, UserError
    from wattflex.ops.adapters.topology import read_site

    try:
        return read_site(path)
    except ConfigError as e:
        raise UserError(str(e)) from None


class RenamedOption(argparse.Action):
    """An option with a new spelling (its first option string) that still takes its ``old``
    spellings, each use of one noted on stderr: one meaning per option name across commands
    (``--configfile`` everywhere, as Snakemake spells it). ``append``: collect a list, as
    ``action="append"`` does."""

    def __init__(self, option_strings, dest, old=(), append=False, **kwargs):
        self.old = tuple(old)
        self.append = append
        super().__init__(option_strings, dest, **kwargs)

    def __call__(self, parser, namespace, values, option_string=None):
        """Store the option's value (appended to the list so far with ``append``); an old spelling
        also prints a one-line deprecation note on stderr naming the new one.
        """
        if option_string in self.old:
            print(
                f"{parser.prog}: {option_string} is deprecated, use {self.option_strings[0]} "
                "(same meaning)",
                file=sys.stderr,
            )
        if self.append:
            values = [*(getattr(namespace, self.dest) or []), values]
        setattr(namespace, self.dest, values)


LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR")
LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


def add_log_level(parser: argparse.ArgumentParser) -> None:
    """``--log-level`` of a long-running command (default INFO)."""
    parser.add_argument(
        "--log-level",
        choices=LOG_LEVELS,
        default="INFO",
        type=str.upper,
        help="the library's log lines (events accepted or refused, telemetry failures) on "
        "stderr with their time, at this level and above (default %(default)s)",
    )


class StderrHandler(logging.StreamHandler):
    """A handler writing to whatever ``sys.stderr`` is when a line is logged (a command run
    in-process, e.g. by a test capturing stderr, never writes to a stream since closed)."""

    @property
    def stream(self):
        """The stream written to: ``sys.stderr`` as it is now, looked up on every record."""
        return sys.stderr

    @stream.setter
    def stream(self, _value) -> None:
        pass


@contextmanager
def command_logging(level: str) -> Iterator[None]:
    """While a command runs: the ``wattflex`` loggers on stderr, each line with its time,
    level and logger, at ``level`` and above; as before after it (a command run in-process,
    e.g. by a test, leaves no handler behind)."""
    logger = logging.getLogger("wattflex")
    handler, before = StderrHandler(), logger.level
    handler.setFormatter(logging.Formatter(LOG_FORMAT))
    logger.addHandler(handler)
    logger.setLevel(level)
    try:
        yield
    finally:
        logger.removeHandler(handler)
        logger.setLevel(before)
