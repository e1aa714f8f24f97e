"""Every figure wattflex draws (matplotlib, Agg), one module per stage plus the shared
``style`` (backend labels, cluster colours, each policy's look). Only this package imports
matplotlib, so a plot change reruns figure rules and the report, never a simulation.
"""
