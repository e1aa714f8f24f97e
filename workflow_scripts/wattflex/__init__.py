"""wattflex: measure and exploit the power flexibility of AI training jobs.

The library behind the Snakemake workflow and the ``wattflex`` command. Modules have one
job each (see DESIGN.md): ``pfi`` (the index), ``telemetry`` (schema, phases, steady-state
aggregation), ``emulator``/``devices`` (where runs come from), ``stats``, ``predictor``,
``allocation`` (analysis), ``provenance`` (artifact metadata), ``cli``.
"""

__version__ = "0.1.0"
SCHEMA_VERSION = "1.0"
