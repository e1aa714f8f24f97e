"""Closed-loop control: per-job caps that follow a grid curtailment signal. ``controller``
decides caps from readings (pure), ``loop`` reads and caps real devices, ``clustersim``
runs the controllers on an emulated cluster beside an oracle and an uncapped reference.
"""
