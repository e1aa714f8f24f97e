"""Rule script: Tables 9 (grid sensitivity), 8 (H100 vs H200), repeatability, 4-5 (compute)."""

from pathlib import Path

import pandas as pd

from wattflex.analysis import paper_tables as pt
from wattflex.analysis import scores
from wattflex.provenance import provenance, read_parquet, write_csv
from wattflex.smk import rule_logger

smk = snakemake  # noqa: F821
log = rule_logger(smk)
cfg, run_cfg = smk.params.tables, smk.params.run
# the folder of input.published, the published tables this rule reads (rules/common/paths.smk)
paper = Path(smk.params.paper_tables)
runs, pfi, backend = pt.read_campaign(smk.input.runs, smk.input.pfi)
predictions = read_parquet(smk.input.predictions)
prov = provenance(params={"tables": cfg, "run": run_cfg}, inputs=list(smk.input), backend=backend)
summary = []

# Same columns as compute_pfi; no Monte Carlo (Table 9 compares point estimates).
pfi_kwargs = {
    "power_sem_col": "power_w_sem",
    "throughput_sem_col": "tokens_per_s_sem",
    "mc_samples": 0,
}
table9 = pt.grid_sensitivity(runs, pfi, cfg["grid_caps"], cfg["grid_sets"], pfi_kwargs)
write_csv(pt.table9_beside_published(table9, paper), smk.output.table9, prov, backend=backend)
summary += pt.summary_rows("grid_sensitivity", pt.grid_summary(table9))

table8 = pt.h100_vs_h200(pfi, runs)
write_csv(pt.table8_beside_published(table8, paper), smk.output.table8, prov, backend=backend)
h100 = predictions[predictions["set"] == "h100"].dropna(subset=["pfi", "pfi_pred"])
h100_r2 = (
    scores(h100["pfi"].to_numpy(), h100["pfi_pred"].to_numpy())["r2"]
    if len(h100) > 1
    else float("nan")
)
summary += pt.summary_rows(
    "h100_vs_h200", {**pt.h100_summary(table8), "predictor_r2_h100": h100_r2}
)

repeats = pt.repeatability(runs)
write_csv(repeats, smk.output.repeatability, prov, backend=backend)
summary += pt.summary_rows("repeatability", pt.repeatability_summary(repeats))

table4, table5 = pt.compute_accounting(
    runs, float(run_cfg["duration_s"]), float(cfg["run_overhead_s"])
)
write_csv(
    pt.table4_beside_published(table4, paper),
    smk.output.table4,
    prov,
    backend=backend,
    note="H200 sweep runs (first run at each cap; repeats in table5)",
)
write_csv(table5, smk.output.table5, prov, backend=backend)
summary += pt.summary_rows(
    "compute",
    {
        "gpu_hours_h200_sweeps": float(table4["gpu_hours"].iloc[-1]),
        "gpu_hours_campaign": float(table5["gpu_hours"].iloc[-1]),
    },
)

summary = pd.DataFrame(summary)
write_csv(summary, smk.output.summary, prov, backend=backend)
log.info("summary:\n%s", summary.to_string(index=False))
