"""Rule script: core sweep figures, and the PFI table beside the published Table 6 drawn
(rule compare_pfi_published makes the table)."""

from pathlib import Path

from wattflex.plots import apply_style, save_figure
from wattflex.plots import sweeps as figures
from wattflex.provenance import provenance, read_csv, read_json, read_parquet, read_sidecar
from wattflex.smk import rule_logger
from wattflex.telemetry import SummaryProtocol
from wattflex.vocabulary import PUBLISHED_H200_SETS

smk = snakemake  # noqa: F821
log = rule_logger(smk)
cfg = smk.params.figures
apply_style(cfg)
runs = read_parquet(smk.input.runs)
pfi = read_parquet(smk.input.pfi)
backends = runs["backend"].unique()
out = {Path(p).stem: p for p in smk.output.figures}
prov = provenance(
    params={**cfg, "summary": smk.params.protocol},
    inputs=[smk.input.runs, smk.input.pfi, smk.input.table6],
)

tel_path, steps_path, summary_path = smk.input.representative
rep = read_json(summary_path)["summary"]
save_figure(
    figures.timeseries_figure(
        read_parquet(tel_path),
        read_parquet(steps_path),
        f"{rep['group']} at {rep['cap_w']:g} W ({rep['gpus']} x {rep['gpu_model']})",
        rep["backend"],
        protocol=SummaryProtocol.from_config(smk.params.protocol),
    ),
    out["fig2_power_tokens_over_time"],
    prov,
)
save_figure(figures.curves_figure(runs, normalized=True), out["curves_normalized"], prov)
save_figure(figures.curves_figure(runs, normalized=False), out["curves_raw"], prov)
headline = pfi[pfi["set"] == "headline"] if "set" in pfi else pfi
save_figure(figures.pfi_by_cluster_figure(headline, backends), out["pfi_by_cluster"], prov)
save_figure(figures.clocks_figure(runs), out["clocks_vs_cap"], prov)

table = read_csv(smk.input.table6)
summary = read_sidecar(smk.input.table6).get("summary", {})
stat = "\n".join(
    f"{k}: {v:.3f}" if isinstance(v, float) else f"{k}: {v}"
    for k, v in summary.items()
    if k != "range"
)
save_figure(
    figures.comparison_figure(
        table[table["set"].isin(PUBLISHED_H200_SETS)],
        "pfi_published",
        "pfi",
        "PFI per group: this campaign vs published (Tables 6-7)",
        backends,
        "published PFI (H200, measured)",
        "PFI (this campaign)",
        stat,
    ),
    out["table6_emulated_vs_published"],
    prov,
)
log.info("wrote %s", ", ".join(out))
