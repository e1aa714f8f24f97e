"""Splitting a cluster-wide power cut across jobs: per-job throughput-vs-power curves
(``curves``), the one policy registry (``policies``), the policies' algorithms
(``allocator``), the exact oracle (``oracle``) and the 100-job workload simulation (``simulate``).
"""
