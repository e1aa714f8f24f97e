"""Rule script: fidelity of an emulated campaign against the paper (wattflex.analysis.fidelity)."""

import gc
from pathlib import Path

from wattflex.analysis import calibration as cal
from wattflex.analysis import fidelity as fid
from wattflex.analysis import public_sweeps as ps
from wattflex.provenance import provenance, read_parquet, write_csv
from wattflex.runs.emulator.physics import calibrated_physics
from wattflex.smk import rule_logger

smk = snakemake  # noqa: F821
log = rule_logger(smk)
cfg, stats = smk.params.fidelity, smk.params.stats
# the folder of input.published, the published tables this rule reads (rules/common/paths.smk)
paper = Path(smk.params.paper_tables)
runs, pfi = read_parquet(smk.input.runs), read_parquet(smk.input.pfi)
# statsmodels' Holm correction runs gc.collect() on every call (one per noise seed):
# freezing what the imports allocated keeps each of those collections small.
gc.freeze()
groups = fid.group_models(smk.params.jobs, runs, smk.params.sweep)
order = stats["cluster_order"]
physics = calibrated_physics(smk.params.calibration)
# In sample: the groups the campaign's anchor was fitted on (its calibration file); the default
# anchor is fitted on public sweeps (wattflex.analysis.calibration.public_anchor), no published group.
fit_groups = smk.params.calibration["fit_groups"] if smk.params.calibration else []
log.info(
    "%d emulated groups, %d noise seeds, perturbation +-%g; anchor %g MHz, %d groups in sample",
    len(groups),
    cfg["noise_seeds"],
    cfg["perturbation"],
    physics.anchor_clock_mhz,
    len(fit_groups),
)
result = fid.fidelity(
    groups,
    pfi.set_index("group")["pfi_ratio"],
    smk.params.campaign,
    int(smk.params.seed),
    str(paper),
    n_seeds=int(cfg["noise_seeds"]),
    fraction=float(cfg["perturbation"]),
    physics=physics,
    alpha=float(stats["alpha"]),
    order=order,
    fit_groups=fit_groups,
)
loto = cal.leave_one_table_out(groups, paper, physics, order=order)
public = ps.perseus_a100_rows(
    smk.input.perseus_a100, list(smk.input.perseus_profiles), smk.input.perseus_a100_config
)
# how much Table 6 depends on the reading's measured draws: the what-if of caps read as draws
caps_as_draws = fid.metrics(
    fid.noise_free_pfi(groups, cal.caps_as_draws_physics()),
    fid.group_meta(groups, fid.published_pfi(groups, str(paper))),
    order=order,
    tests=False,
)
public += ps.reading_rows(physics, caps_as_draws)
public += ps.unscored_rows(list(smk.input.other_sweeps))
n_table6 = int(result.groups["in_spearman"].sum())
fit_source = (
    smk.params.calibration.get("source", "calibration file")
    if smk.params.calibration
    else "public sweeps: Perseus A100 power-limit sweeps, the Ujeniya et al. H100 reading"
)
test_sets = ps.scored_sets_table(
    result.metrics, fit_groups, fit_source, n_table6, loto, public, physics
)
prov = provenance(
    params={
        k: smk.params[k] for k in ("jobs", "seed", "sweep", "fidelity", "stats", "calibration")
    },
    inputs=list(smk.input),
    backend=fid.BACKEND,
)
note = "EMULATED: every PFI here comes from the emulator (wattflex.runs.emulator), none is a measurement"
write_csv(result.groups, smk.output.groups, prov, backend=fid.BACKEND, note=note)
write_csv(
    result.summary,
    smk.output.summary,
    prov,
    backend=fid.BACKEND,
    note=note,
    noise_seeds=int(cfg["noise_seeds"]),
    seed_draws="leakages and per-run factors as the emulated backend "
    "draws them; per-sample jitter and the top-10 % aggregate left out (wattflex.analysis.fidelity)",
)
write_csv(
    result.sensitivity,
    smk.output.sensitivity,
    prov,
    backend=fid.BACKEND,
    note=note,
    perturbation=float(cfg["perturbation"]),
)
write_csv(
    loto.assign(backend=fid.BACKEND),
    smk.output.calibration,
    prov,
    backend=fid.BACKEND,
    note=note,
    method="anchor fitted (5 MHz grid, least squares on noise-free Eq. 1 PFI) on each fit set of Tables 7-8; "
    "Table 6 never in a fit (wattflex.analysis.calibration)",
)
write_csv(
    test_sets.assign(backend=fid.BACKEND),
    smk.output.test_sets,
    prov,
    backend=fid.BACKEND,
    note="EMULATED scores against measured or published data; each row says what the emulator was fitted to",
)
for row in result.summary.itertuples():
    log.info(
        "%s: noise-free %.3f, campaign %.3f, seeds %.3f [%.3f, %.3f], published %.3f %s",
        row.metric,
        row.noise_free,
        row.campaign,
        row.seed_median,
        row.seed_p05,
        row.seed_p95,
        row.published,
        row.target,
    )
