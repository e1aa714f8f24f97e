"""Rule script: the site's flexibility statement (wattflex.ops.services.statement) from the campaign's
runs and its controlled events' M&V: tables, the OpenADR 3 program and report, the handover
page and its figure."""

from wattflex.ops.clustersim import ClusterConfig
from wattflex.ops.services.mv import read_mv_records
from wattflex.ops.services.statement import StatementSettings, build_statement, statement_files
from wattflex.plots import apply_style, save_figure, statement_figure
from wattflex.provenance import provenance, read_csv, read_parquet, write_together
from wattflex.smk import rule_logger

smk = snakemake  # noqa: F821
log = rule_logger(smk)
apply_style(smk.params.figures)
settings = StatementSettings.from_config(smk.params.statement, smk.params.allocation)
runs = read_parquet(smk.input.runs)
mv = read_mv_records(smk.input.mv) if smk.input.get("mv") else None
log.info("statement: %d draws of a %d-job site", settings.n_draws, settings.jobs_per_workload)
stmt = build_statement(
    runs,
    mv,
    settings,
    ClusterConfig.from_dict(smk.params.cluster),
    smk.params.campaign,
    smk.params.allocation["groups_set"],
    read_csv(smk.input.plan),
)
prov = provenance(
    params={
        "statement": smk.params.statement,
        "allocation": smk.params.allocation,
        "cluster": smk.params.cluster,
    },
    inputs=list(smk.input),
    backend=stmt.backend,
)
write_together(statement_files(stmt, dict(smk.output.items()), prov))
s = stmt.settings
save_figure(
    statement_figure(
        stmt.tables["shed"],
        stmt.tables["calendar"],
        stmt.tables["baseline_days"],
        stmt.backend,
        s.headline_depth,
        stmt.tables["knobs"],
    ),
    smk.output.figure,
    prov,
)
for line in stmt.lines:
    log.info("statement: %s", line)
