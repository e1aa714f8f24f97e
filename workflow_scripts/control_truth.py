"""Rule script: the steady state of every group the cluster simulation draws jobs from, at
every cap of the control grid (wattflex.ops.clustersim.truth_table)."""

import time

from wattflex.ops.clustersim import truth_table
from wattflex.provenance import provenance, write_parquet
from wattflex.runs.emulator.physics import calibrated_physics
from wattflex.smk import rule_logger

smk = snakemake  # noqa: F821
log = rule_logger(smk)
start = time.perf_counter()
table = truth_table(
    smk.params.groups,
    smk.params.seed,
    smk.params.cap_step_w,
    physics=calibrated_physics(smk.params.calibration),
)
log.info(
    "%d groups x %d caps in %.1f s",
    table["group"].nunique(),
    table["cap_w"].nunique(),
    time.perf_counter() - start,
)
gpus = sorted(table["gpu"].unique())
prov = provenance(
    params={
        "groups": smk.params.groups,
        "seed": smk.params.seed,
        "cap_step_w": smk.params.cap_step_w,
        "calibration": smk.params.calibration,
    },
    backend="emulated",
    device_model="+".join(gpus),
)
write_parquet(table, smk.output.truth, prov)
