"""Rule script: the PFI predictor: Table 3 ablation, chosen model, predictions, Tables 12-13."""

import sys
from pathlib import Path

import pandas as pd

from wattflex.analysis import beside_published, load_published, predictor, read_campaign
from wattflex.provenance import provenance, write_csv, write_json, write_parquet
from wattflex.smk import rule_logger

smk = snakemake  # noqa: F821
log = rule_logger(smk)
cfg = smk.params.predictor
# the folder of input.published, the published tables this rule reads (rules/common/paths.smk)
paper = Path(smk.params.paper_tables)
runs, pfi, backend = read_campaign(smk.input.runs, smk.input.pfi)
try:
    sources = predictor.telemetry_sources(runs, bool(cfg["allow_mixed_sources"]))
except ValueError as exc:  # one paragraph in the log and a failed job, not a traceback
    log.error("%s", exc)
    sys.exit(1)
prov = provenance(params=cfg, inputs=list(smk.input), backend=backend)
groups = predictor.group_table(runs, pfi)
try:
    train = predictor.training_rows(groups, cfg["train_set"])
except (
    predictor.TooFewGroups
) as exc:  # too little data: outputs that say so, and the analysis goes on
    log.warning("predictor not fitted: %s", exc)
    model = {
        **predictor.not_fitted_model(cfg["features"], str(exc)),
        "evaluation": [],
        "backend": backend,
        "telemetry_sources": sources,
    }
    write_json(model, smk.output.model, prov)
    write_parquet(predictor.predictions_table(groups, model), smk.output.predictions, prov)
    for name, columns in (
        ("ablation", predictor.ABLATION_COLUMNS),
        ("holdout", predictor.HOLDOUT_COLUMNS),
        ("leverage", predictor.LEVERAGE_COLUMNS),
        ("within_cluster", predictor.WITHIN_CLUSTER_COLUMNS),
    ):
        write_csv(
            pd.DataFrame(columns=columns),
            smk.output[name],
            prov,
            backend=backend,
            status=predictor.NOT_FITTED,
            reason=str(exc),
        )
    sys.exit(0)
log.info("training on %d groups", len(train))

ablation = predictor.ablation(train, cfg.get("ablation_sets", predictor.ABLATION_SETS))
published = load_published(paper, "table3_predictor_ablation")
columns = [
    "p",
    "r2_in",
    "loo_r2",
    "loo_rmse",
    "loo_spearman",
    "loco_r2",
    "loco_rmse",
    "loco_spearman",
]
write_csv(
    beside_published(ablation, published, "predictors", columns),
    smk.output.ablation,
    prov,
    backend=backend,
)

model = predictor.fit_model(train, cfg["features"])
predictions = predictor.predictions_table(groups, model)
holdout = predictor.holdout_scores(predictions)
model["evaluation"] = holdout.to_dict(orient="records")
model["backend"] = backend
model["telemetry_sources"] = sources
write_json(model, smk.output.model, prov)
write_parquet(predictions, smk.output.predictions, prov)
write_csv(holdout, smk.output.holdout, prov, backend=backend)
log.info("model %s: %s", model["feature_spec"], model["metrics"])
log.info("held-out scores:\n%s", holdout.to_string(index=False))

features = model["features"]
write_csv(
    predictor.leverage_sensitivity(train, features, int(cfg["leverage_k_max"])),
    smk.output.leverage,
    prov,
    backend=backend,
    features=features,
)
write_csv(
    predictor.within_cluster(train, features),
    smk.output.within_cluster,
    prov,
    backend=backend,
    features=features,
)
