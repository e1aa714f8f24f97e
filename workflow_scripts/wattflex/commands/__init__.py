"""Subcommands of ``wattflex``: one module each (see ``wattflex.cli``)."""
