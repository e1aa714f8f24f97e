"""Rule script: one curtailment scenario on the emulated cluster, every control policy beside
the oracle and the uncapped reference (wattflex.ops.clustersim)."""

import time

from wattflex.ops.clustersim import Tables, simulate_scenario, summarize
from wattflex.ops.events import read_schedule
from wattflex.ops.services.mv import simulation_mv
from wattflex.provenance import provenance, read_json, read_parquet, write_csv, write_parquet
from wattflex.smk import rule_logger

smk = snakemake  # noqa: F821
log = rule_logger(smk)
scenario = smk.wildcards.scenario
tables = Tables.from_frame(read_parquet(smk.input.truth))
start = time.perf_counter()
res = simulate_scenario(
    tables, smk.params.control, scenario, smk.input.signal, read_json(smk.input.model)
)
log.info(
    "%s: %d jobs, %.1f h simulated in %.1f s",
    scenario,
    len(res.jobs),
    res.t_s[-1] / 3600,
    time.perf_counter() - start,
)
summary = summarize(res)
for _, r in summary.iterrows():
    log.info(
        "%-16s worst overshoot %7.0f W, %5.0f s above budget, tokens %.4g (%.2f%% of oracle)",
        r["policy"],
        r["worst_overshoot_w"],
        r["seconds_above_budget"],
        r["tokens"],
        100 * r["tokens_vs_oracle"],
    )
prov = provenance(
    params=smk.params.control,
    inputs=list(smk.input),
    backend="emulated",
    device_model="+".join(sorted(tables.groups["gpu"].unique())),
)
write_csv(summary, smk.output.summary, prov, scenario=scenario, backend="emulated")
write_csv(res.jobs, smk.output.jobs, prov, scenario=scenario, backend="emulated")
write_parquet(res.timeseries(), smk.output.timeseries, prov, scenario=scenario)
mv, intervals = simulation_mv(
    res, read_schedule(smk.input.signal), float(smk.params.control["scenario"]["response_s"])
)
for _, r in mv.iterrows():
    log.info(
        "M&V %-16s %s: response %s s, %g s above target after the deadline, restored after %s s",
        r["policy"],
        r["event_id"],
        r["response_time_s"],
        r["seconds_above_target_after_deadline"],
        r["restore_time_s"],
    )
write_csv(mv, smk.output.mv, prov, scenario=scenario, backend="emulated")
write_csv(intervals, smk.output.mv_intervals, prov, scenario=scenario, backend="emulated")
