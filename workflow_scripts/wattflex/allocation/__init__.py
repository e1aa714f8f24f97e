"""Splitting a cluster-wide power cut across jobs: per-job throughput-vs-power curves
(``curves``), the engines the policies of :mod:`wattflex.policies` run on
(``allocator``), the exact oracle (``oracle``) and the 100-job workload simulation (``simulate``).
"""
