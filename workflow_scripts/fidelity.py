"""Rule script: fidelity of an emulated campaign against the paper (wattflex.analysis.fidelity)."""
import gc
from pathlib import Path

from wattflex.analysis import fidelity as fid
from wattflex.provenance import provenance, read_parquet, write_csv
from wattflex.smk import rule_logger

smk = snakemake  # noqa: F821
log = rule_logger(smk)
cfg, stats = smk.params.fidelity, smk.params.stats
# params.paper_tables is relative to the workflow directory (the parent of this script's)
paper = Path(smk.scriptdir).parent / smk.params.paper_tables
runs, pfi = read_parquet(smk.input.runs), read_parquet(smk.input.pfi)
# statsmodels' Holm correction runs gc.collect() on every call (one per noise seed):
# freezing what the imports allocated keeps each of those collections small.
gc.freeze()
groups = fid.group_models(smk.params.jobs, runs, smk.params.sweep)
log.info("%d emulated groups, %d noise seeds, perturbation +-%g", len(groups), cfg["noise_seeds"], cfg["perturbation"])
result = fid.fidelity(groups, pfi.set_index("group")["pfi_ratio"], smk.params.campaign, int(smk.params.seed),
                      str(paper), n_seeds=int(cfg["noise_seeds"]), fraction=float(cfg["perturbation"]),
                      alpha=float(stats.get("alpha", 0.05)), order=stats.get("cluster_order", fid.CLUSTER_ORDER))
prov = provenance(params={k: smk.params[k] for k in ("jobs", "seed", "sweep", "fidelity", "stats")},
                  inputs=list(smk.input), backend=fid.BACKEND)
note = "EMULATED: every PFI here comes from the emulator (wattflex.runs.emulator), none is a measurement"
write_csv(result.groups, smk.output.groups, prov, backend=fid.BACKEND, note=note)
write_csv(result.summary, smk.output.summary, prov, backend=fid.BACKEND, note=note,
          noise_seeds=int(cfg["noise_seeds"]), seed_draws="leakages and per-run factors as the emulated backend "
          "draws them; per-sample jitter and the top-10 % aggregate left out (wattflex.analysis.fidelity)")
write_csv(result.sensitivity, smk.output.sensitivity, prov, backend=fid.BACKEND, note=note,
          perturbation=float(cfg["perturbation"]))
for row in result.summary.itertuples():
    log.info("%s: noise-free %.3f, campaign %.3f, seeds %.3f [%.3f, %.3f], published %.3f %s", row.metric,
             row.noise_free, row.campaign, row.seed_median, row.seed_p05, row.seed_p95, row.published, row.target)
