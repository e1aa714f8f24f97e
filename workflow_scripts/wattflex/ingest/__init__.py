"""Measured sweeps from elsewhere into the pipeline: the one sweep-table reader with its
row checks (``reader``), the Zeus, Perseus and DCGM-capture sources (``sources``), DCGM
parsers (``dcgm``) and what an ingested campaign supports (``summary``).
"""
