"""Rule script: per scenario, cluster power vs the budget, tokens lost per policy and the M&V
of its first event; all scenarios' summaries and M&V records in one table each."""

import numpy as np
import pandas as pd

from wattflex.plots import (
    apply_style,
    mv_figure,
    policy_styles,
    power_figure,
    save_figure,
    tokens_figure,
)
from wattflex.policies import unlimited
from wattflex.provenance import provenance, read_csv, read_parquet, write_csv
from wattflex.smk import rule_logger

smk = snakemake  # noqa: F821
log = rule_logger(smk)
apply_style(smk.params.figures)
scenarios = smk.params.scenarios
prov = provenance(params=smk.params.figures, inputs=list(smk.input), backend="emulated")
tables, mvs = [], []


def first_column(df: pd.DataFrame) -> pd.DataFrame:
    return df[["scenario"] + [c for c in df.columns if c != "scenario"]]


for name, summary_csv, ts_path, mv_csv, power_png, tokens_png, mv_png in zip(
    scenarios,
    smk.input.summaries,
    smk.input.timeseries,
    smk.input.mv,
    smk.output.power,
    smk.output.tokens,
    smk.output.mv,
):
    summary = read_csv(summary_csv)
    ts = read_parquet(ts_path)
    mv = read_csv(mv_csv)
    for fig, path in (
        (power_figure(ts, name, "emulated"), power_png),
        (tokens_figure(summary, name, "emulated"), tokens_png),
    ):
        save_figure(fig, path, prov, scenario=name)
    if len(mv):
        rec = mv.iloc[0].replace({np.nan: None}).to_dict()
        loads = {
            c.split(":", 1)[1]: ts[c].to_numpy(float)
            for c in ts.columns
            if c.startswith("power_w:") and not c.endswith(f":{unlimited()}")
        }
        fig = mv_figure(
            ts["t_s"].to_numpy(float),
            loads,
            ts["budget_w"].to_numpy(float),
            rec,
            ts[f"power_w:{unlimited()}"].to_numpy(float),
            "emulated",
            name,
            policy_styles(),
        )
        save_figure(fig, mv_png, prov, scenario=name)
    tables.append(summary.assign(scenario=name))
    mvs.append(mv.assign(scenario=name))
    log.info("%s: figures written", name)
combined = (
    pd.concat(tables, ignore_index=True) if tables else pd.DataFrame(columns=["scenario", "policy"])
)
write_csv(first_column(combined), smk.output.summary, prov, backend="emulated")
mv_all = pd.concat(mvs, ignore_index=True) if mvs else pd.DataFrame(columns=["scenario", "policy"])
write_csv(first_column(mv_all), smk.output.mv_table, prov, backend="emulated")
