"""The operations wing: grid events followed with per-job GPU caps, beside the study.

Four levels, bottom to top, each importing only the levels below it (and the core):
``events`` (the one event model: events, schedules, signals, windows); the models that compute
on it (``controller``: caps from readings; ``clustersim``: an emulated cluster under a signal;
``baselines``: meter baselines); ``adapters`` (OpenADR 2.0b and 3, SLURM, the site file); and
``services`` (the node agent, M&V, the exporter, offers and the flexibility statement).
"""
