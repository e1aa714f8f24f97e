"""Rule script: Kruskal-Wallis + Dunn-Holm across clusters and telemetry-PFI correlations."""

from pathlib import Path

import numpy as np

from wattflex.analysis import (
    beside_published,
    cluster_tests_table,
    kruskal_dunn,
    load_published,
    read_campaign,
    telemetry_correlations,
)
from wattflex.analysis.predictor import CORRELATION_METRICS, group_table
from wattflex.provenance import provenance, write_csv, write_json
from wattflex.smk import rule_logger

smk = snakemake  # noqa: F821
log = rule_logger(smk)
cfg = smk.params.stats
# the folder of input.published, the published tables this rule reads (rules/common/paths.smk)
paper = Path(smk.params.paper_tables)
runs, pfi, backend = read_campaign(smk.input.runs, smk.input.pfi)
prov = provenance(params=cfg, inputs=list(smk.input), backend=backend)
sets = cfg["sets"]
groups = group_table(runs, pfi)
groups = groups[groups["set"].isin(sets) & np.isfinite(groups["pfi"].astype(float))]
log.info("%d groups of sets %s with a finite PFI", len(groups), sets)

result = kruskal_dunn(
    groups,
    value_col="pfi",
    group_col="cluster",
    order=cfg["cluster_order"],
    p_adjust=cfg["p_adjust"],
    alpha=float(cfg["alpha"]),
)
result["backend"] = backend
write_json(
    result, smk.output.kruskal_dunn, prov
)  # undefined statistics: null, never NaN (strict JSON)
kw = result["kruskal"]
log.info(
    "Kruskal-Wallis H=%s p=%s%s",
    kw["H"],
    kw["p"],
    f" ({result['reason']})" if "reason" in result else "",
)

tests = cluster_tests_table(result)
published = load_published(paper, "table10_11_cluster_tests")
# one cluster: the table says not_tested and why (the report shows it above the table)
untested = {"status": result["status"], "reason": result["reason"]} if "reason" in result else {}
write_csv(
    beside_published(
        tests, published, ["test", "comparison"], ["n", "statistic", "p_raw", "p_holm"]
    ),
    smk.output.cluster_tests,
    prov,
    backend=backend,
    **untested,
)

correlations = telemetry_correlations(groups, cfg.get("metrics", CORRELATION_METRICS), target="pfi")
write_csv(
    correlations,
    smk.output.correlations,
    prov,
    backend=backend,
    note="bh_q: Benjamini-Hochberg over the Spearman p-values of all metrics tested; ols_q: same for OLS",
)
write_csv(groups, smk.output.groups, prov, backend=backend)
for row in correlations.itertuples():
    log.info("%s: rho=%.3f q=%.3g", row.metric, row.spearman_rho, row.bh_q)
