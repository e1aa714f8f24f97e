"""Rule script: the fidelity figure, emulated vs published PFI per group (wattflex.plots.fidelity)."""

import pandas as pd

from wattflex.plots import apply_style, emulated_vs_published, save_figure
from wattflex.provenance import provenance
from wattflex.smk import rule_logger

smk = snakemake  # noqa: F821
log = rule_logger(smk)
apply_style(smk.params.figures)
groups, summary = pd.read_csv(smk.input.groups), pd.read_csv(smk.input.summary).set_index("metric")
lines = []
for metric in ("spearman_table6", "median_dense", "median_moe-pt", "median_moe-ft"):
    if metric in summary.index:
        r = summary.loc[metric]
        fmt = lambda v: f"{v:.2f}" if pd.notna(v) else "n/a"  # noqa: E731 (too few groups: NaN)
        pub = f", published {fmt(r.published)}" if pd.notna(r.published) else ""
        lines.append(f"{metric}: noise-free {fmt(r.noise_free)}, campaign {fmt(r.campaign)}{pub}")
test_sets = pd.read_csv(smk.input.test_sets)
save_figure(
    emulated_vs_published(groups, "\n".join(lines), groups["backend"].unique(), test_sets),
    smk.output.figure,
    provenance(params=smk.params.figures, inputs=list(smk.input)),
)
log.info("wrote %s", smk.output.figure)
