"""Grid-facing operation: the event model every signal adapter feeds (``events``: schedule
files, checks, ramps) and flexibility offers from PFI curves (``offer``). Measurement and
verification of each event is :mod:`wattflex.control.mv`."""
