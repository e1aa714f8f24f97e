"""Errors that carry a message meant for the user (one line, no traceback)."""


class UserError(Exception):
    """Bad input from the user: printed as one line, exit status 2, no traceback."""


class ConfigError(ValueError):
    """An invalid workflow config; the message names the offending key."""
