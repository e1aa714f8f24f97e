"""Adapters between the event model and the outside world: OpenADR 2.0b and 3 VENs, SLURM's
jobs and knobs, the agents' budget and load files, the site file."""
