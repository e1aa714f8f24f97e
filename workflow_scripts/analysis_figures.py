"""Rule script: figures of the analysis stages (Fig. 5/14 and Fig. 7 analogs, Tables 8-9)."""

from pathlib import Path

import pandas as pd

from wattflex.analysis import is_fitted
from wattflex.plots import (
    apply_style,
    beside_published_scatter,
    predicted_vs_measured,
    save_figure,
    summary_text,
    telemetry_grid,
)
from wattflex.provenance import provenance, read_json, read_parquet
from wattflex.smk import rule_logger

smk = snakemake  # noqa: F821
log = rule_logger(smk)
apply_style(smk.params.figures)
out = {Path(p).stem: p for p in smk.output}
prov = provenance(params=smk.params.figures, inputs=list(smk.input))
groups = pd.read_csv(smk.input.groups)
backend = groups["backend"].unique() if "backend" in groups else ["unknown"]
summary = pd.read_csv(smk.input.summary)
save_figure(
    telemetry_grid(groups, pd.read_csv(smk.input.correlations), backend),
    out["telemetry_vs_pfi"],
    prov,
)
model = read_json(smk.input.model)
save_figure(
    predicted_vs_measured(
        read_parquet(smk.input.predictions),
        pd.read_csv(smk.input.holdout),
        model["features"],
        backend,
        not_fitted=None if is_fitted(model) else model.get("reason", "no reason recorded"),
    ),
    out["predicted_vs_measured"],
    prov,
)
save_figure(
    beside_published_scatter(
        pd.read_csv(smk.input.table8),
        "pfi_h200",
        "pfi_h100",
        "H100 vs H200 PFI (Table 8)",
        "PFI on H200",
        "PFI on H100",
        summary_text(summary, "h100_vs_h200"),
        backend,
    ),
    out["table8_h100_vs_h200"],
    prov,
)
save_figure(
    beside_published_scatter(
        pd.read_csv(smk.input.table9),
        "pfi_6caps",
        "pfi_4caps",
        "Sweep-grid sensitivity (Table 9)",
        "PFI, 6-cap grid",
        "PFI, 4-cap grid",
        summary_text(summary, "grid_sensitivity"),
        backend,
    ),
    out["table9_grid_sensitivity"],
    prov,
)
log.info("wrote %s", ", ".join(out))
