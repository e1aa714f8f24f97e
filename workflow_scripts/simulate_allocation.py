"""Rule script: the allocation simulation (paper §6) from runs, PFI and PFI predictions."""
import time

from wattflex.allocation.simulate import SimulationConfig, group_table, simulate
from wattflex.provenance import provenance, read_parquet, write_csv
from wattflex.smk import rule_logger

smk = snakemake  # noqa: F821
log = rule_logger(smk)
cfg = SimulationConfig.from_dict(smk.params.allocation)
table = group_table(read_parquet(smk.input.runs), read_parquet(smk.input.pfi),
                    read_parquet(smk.input.predictions), cfg)
log.info("%d %s groups (backend %s), %d workloads x %d jobs per mix", len(table.groups), cfg.groups_set,
         table.backend, cfg.n_workloads, cfg.jobs_per_workload)
start = time.perf_counter()
out = simulate(table, cfg)
log.info("simulated in %.1f s", time.perf_counter() - start)
diagnostics = out["diagnostics"].iloc[0].to_dict()
log.info("diagnostics: %s", diagnostics)
prov = provenance(params=smk.params.allocation, inputs=list(smk.input), backend=table.backend)
for name in ("summary", "headline", "out_of_sample", "sla"):
    write_csv(out[name], smk.output[name], prov, backend=table.backend, diagnostics=diagnostics)
for _, r in out["headline"].iterrows():
    log.info("headline %s %.0f%% cut: %s recovers %+.0f tokens/s per job over equal weight, %.0f%% of the gap",
             r["mix"], 100 * r["cut"], r["policy"], r["tokens_per_s_per_job_recovered"], 100 * r["gap_closed"])
