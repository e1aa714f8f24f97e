"""Rule script: the Fig. 8 analog and the out-of-sample figure of the allocation stage."""

import pandas as pd

from wattflex.plots import apply_style, fig8_figure, out_of_sample_figure, save_figure
from wattflex.provenance import provenance, read_sidecar
from wattflex.smk import rule_logger

smk = snakemake  # noqa: F821
log = rule_logger(smk)
apply_style(smk.params.figures)
summary_meta = read_sidecar(smk.input.summary)
backend = summary_meta["provenance"].get("backend")
skipped_mixes = summary_meta.get("skipped_mixes") or {}
headline_reason = read_sidecar(smk.input.headline).get("reason")
prov = provenance(params=smk.params.figures, inputs=list(smk.input), backend=backend)
save_figure(
    fig8_figure(
        pd.read_csv(smk.input.summary),
        pd.read_csv(smk.input.headline),
        [backend],
        skipped_mixes,
        headline_reason,
    ),
    smk.output.fig8,
    prov,
    skipped_mixes=skipped_mixes,
)
save_figure(
    out_of_sample_figure(pd.read_csv(smk.input.out_of_sample), [backend]),
    smk.output.out_of_sample,
    prov,
)
log.info("wrote %s and %s", smk.output.fig8, smk.output.out_of_sample)
