"""Rule script: core sweep figures and the PFI table beside the published Table 6."""
from pathlib import Path

import pandas as pd

from wattflex.plots import sweeps as figures
from wattflex.plots.style import apply_style, backend_label
from wattflex.provenance import provenance, read_json, read_parquet, stamp_png, write_csv
from wattflex.analysis.published import load_published, table6_comparison
from wattflex.smk import rule_logger

smk = snakemake  # noqa: F821
log = rule_logger(smk)
cfg = smk.params.figures
# params.paper_tables is relative to the workflow directory (the parent of this script's)
paper = Path(smk.scriptdir).parent / smk.params.paper_tables
apply_style(cfg)
dpi = int(cfg.get("dpi", 110))
runs = read_parquet(smk.input.runs)
pfi = read_parquet(smk.input.pfi)
backends = runs["backend"].unique()
out = {Path(p).stem: p for p in smk.output.figures}

tel_path, steps_path, summary_path = smk.input.representative
rep = read_json(summary_path)["summary"]
fig = figures.timeseries_figure(read_parquet(tel_path), read_parquet(steps_path),
                                f"{rep['group']} at {rep['cap_w']:g} W ({rep['gpus']} x {rep['gpu_model']})", rep["backend"])
fig.savefig(out["fig2_power_tokens_over_time"], dpi=dpi)
figures.curves_figure(runs, normalized=True).savefig(out["curves_normalized"], dpi=dpi)
figures.curves_figure(runs, normalized=False).savefig(out["curves_raw"], dpi=dpi)
headline = pfi[pfi["set"] == "headline"] if "set" in pfi else pfi
figures.pfi_by_cluster_figure(headline, backends).savefig(out["pfi_by_cluster"], dpi=dpi)
figures.clocks_figure(runs).savefig(out["clocks_vs_cap"], dpi=dpi)

tables = [t for t in (load_published(paper, "table6_pfi_h200"), load_published(paper, "table7_validation_h200"))
          if t is not None]
published = pd.concat(tables, ignore_index=True) if tables else None
table, summary = table6_comparison(pfi, published)
stat = "\n".join(f"{k}: {v:.3f}" if isinstance(v, float) else f"{k}: {v}" for k, v in summary.items() if k != "range")
figures.comparison_figure(table[table["set"].isin(["headline", "validation"])], "pfi_published", "pfi",
                          "PFI per group: this campaign vs published (Tables 6-7)", backends,
                          "published PFI (H200, measured)", "PFI (this campaign)", stat).savefig(
    out["table6_emulated_vs_published"], dpi=dpi)
prov = provenance(params=cfg, inputs=[smk.input.runs, smk.input.pfi])
write_csv(table, smk.output.table6, prov, summary=summary, backend=backend_label(backends))
for png in smk.output.figures:
    stamp_png(png, prov)
log.info("table 6 comparison: %s", summary)
