"""Rule script: the campaign's flexibility offer (wattflex.ops.services.offer) from its runs' curves,
one job per sweep group: the table and the curve behind it."""

from wattflex.allocation.curves import cap_rows, curves_from_points
from wattflex.ops.services.offer import LOSSES, offer_curve, offer_table
from wattflex.plots import apply_style, offer_figure, save_figure
from wattflex.provenance import provenance, read_parquet, write_csv
from wattflex.smk import rule_logger

smk = snakemake  # noqa: F821
log = rule_logger(smk)
apply_style(smk.params.figures)
runs = cap_rows(
    read_parquet(smk.input.runs)
)  # the cap curves (a clock group's runs: the knob menu's)
hours = float(smk.params.offer.get("hours", 4.0))
losses = tuple(smk.params.offer.get("losses", LOSSES))
jobs, curves = curves_from_points(
    runs["group"], runs["power_w"], runs["tokens_per_s"], runs["cap_w"]
)
table = offer_table(jobs, curves, losses, hours)
backend = ",".join(sorted(runs["backend"].astype(str).unique()))
prov = provenance(params=smk.params.offer, inputs=[smk.input.runs])
write_csv(table, smk.output.table, prov, hours=hours, losses=list(losses))
grid, shed = offer_curve(curves)
clusters = runs.groupby("group")["cluster"].first() if "cluster" in runs else None
save_figure(
    offer_figure(
        jobs,
        grid,
        shed,
        losses,
        backend,
        hours,
        None if clusters is None else [str(clusters[j]) for j in jobs],
    ),
    smk.output.figure,
    prov,
)
for _, r in table[table["job"] == "TOTAL"].iterrows():
    log.info(
        "offer: %.1f kW for %g h at <= %.0f%% throughput loss per job",
        r["shed_kw"],
        hours,
        100 * r["max_throughput_loss"],
    )
