"""Rule script: per scenario, cluster power vs the budget and tokens lost per policy; all
scenarios' summaries in one table."""
import pandas as pd

from wattflex.plots.control import power_figure, tokens_figure
from wattflex.plots.style import apply_style
from wattflex.provenance import provenance, read_csv, read_parquet, save_png, write_csv
from wattflex.smk import rule_logger

smk = snakemake  # noqa: F821
log = rule_logger(smk)
apply_style(smk.params.figures)
scenarios = smk.params.scenarios
prov = provenance(params=smk.params.figures, inputs=list(smk.input), backend="emulated")
tables = []
for name, summary_csv, ts_path, power_png, tokens_png in zip(scenarios, smk.input.summaries, smk.input.timeseries,
                                                               smk.output.power, smk.output.tokens):
    summary = read_csv(summary_csv)
    for fig, path in ((power_figure(read_parquet(ts_path), name, "emulated"), power_png),
                      (tokens_figure(summary, name, "emulated"), tokens_png)):
        save_png(fig, path, prov, scenario=name)
    tables.append(summary.assign(scenario=name))
    log.info("%s: figures written", name)
combined = pd.concat(tables, ignore_index=True) if tables else pd.DataFrame(columns=["scenario", "policy"])
combined = combined[["scenario"] + [c for c in combined.columns if c != "scenario"]]
write_csv(combined, smk.output.summary, prov, backend="emulated")
