"""Rule script: the allocation study at one cut (wattflex.allocation.simulate.simulate_cuts);
rule simulate_allocation merges the cuts."""

import time

from wattflex.allocation.simulate import PART_TABLES, SimulationConfig, group_table, simulate_cuts
from wattflex.policies import optimum
from wattflex.provenance import provenance, read_parquet, write_parquet
from wattflex.smk import rule_logger

smk = snakemake  # noqa: F821
log = rule_logger(smk)
cfg = SimulationConfig.from_dict(smk.params.allocation)
cut = float(smk.params.cut)
table = group_table(
    read_parquet(smk.input.runs),
    read_parquet(smk.input.pfi),
    read_parquet(smk.input.predictions),
    cfg,
)
start = time.perf_counter()
out = simulate_cuts(table, cfg, [cut])
oracle = out["results"][out["results"]["policy"] == optimum()]
log.info(
    "cut %g: %d %s groups, %d workloads x %d jobs per mix, simulated in %.1f s (oracle MILP on %d of %d workloads)",
    cut,
    len(table.groups),
    cfg.groups_set,
    cfg.n_workloads,
    cfg.jobs_per_workload,
    time.perf_counter() - start,
    int(oracle["exact_fallback"].sum()),
    len(oracle),
)
prov = provenance(
    params={**smk.params.allocation, "cut": cut}, inputs=list(smk.input), backend=table.backend
)
for name in PART_TABLES:
    write_parquet(out[name], smk.output[name], prov)
