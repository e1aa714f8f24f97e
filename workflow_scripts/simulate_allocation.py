"""Rule script: the allocation study (paper §6) merged from its per-cut parts: summary,
headline, SLA tiers and out-of-sample check (wattflex.allocation.simulate.combine)."""

from wattflex.allocation.simulate import PART_TABLES, SimulationConfig, combine, group_table
from wattflex.provenance import provenance, read_parquet, write_csv
from wattflex.smk import rule_logger

smk = snakemake  # noqa: F821
log = rule_logger(smk)
cfg = SimulationConfig.from_dict(smk.params.allocation)
table = group_table(
    read_parquet(smk.input.runs),
    read_parquet(smk.input.pfi),
    read_parquet(smk.input.predictions),
    cfg,
)
parts = [
    {name: read_parquet(path) for name, path in zip(PART_TABLES, paths)}
    for paths in zip(*(smk.input[f"part_{name}"] for name in PART_TABLES))
]
log.info(
    "%d %s groups (backend %s), %d workloads x %d jobs per mix, %d cut(s)",
    len(table.groups),
    cfg.groups_set,
    table.backend,
    cfg.n_workloads,
    cfg.jobs_per_workload,
    len(parts),
)
out = combine(parts, table, cfg)
skipped = out["skipped"]
for kind, reasons in skipped.meta().items():
    for what, why in reasons.items():
        log.warning("%s %s: %s", kind, what, why)
diagnostics = out["diagnostics"].iloc[0].to_dict()
log.info("diagnostics: %s", diagnostics)
inputs = [smk.input.runs, smk.input.pfi, smk.input.predictions]
prov = provenance(params=smk.params.allocation, inputs=inputs, backend=table.backend)
# what the study left out rides in every sidecar; an empty headline says why in its own
not_simulated = {"status": "not_simulated", "reason": skipped.headline} if skipped.headline else {}
for name in ("summary", "headline", "out_of_sample", "sla"):
    write_csv(
        out[name],
        smk.output[name],
        prov,
        backend=table.backend,
        diagnostics=diagnostics,
        **skipped.meta(),
        **(not_simulated if name == "headline" else {}),
    )
for _, r in out["headline"].iterrows():
    log.info(
        "headline %s %.0f%% cut: %s recovers %+.0f tokens/s per job over equal weight, %.0f%% of the gap",
        r["mix"],
        100 * r["cut"],
        r["policy"],
        r["tokens_per_s_per_job_recovered"],
        100 * r["gap_closed"],
    )
