"""Rule script: the memory and time plan of every group (wattflex.runs.plan)."""

import pandas as pd

from wattflex.provenance import provenance, write_csv
from wattflex.runs.plan import enforced, plan_groups
from wattflex.smk import rule_logger

smk = snakemake  # noqa: F821
log = rule_logger(smk)
p = smk.params
plans = plan_groups(p.groups, p.catalog, p.cuda, p.checkpoint_at_s)
table = pd.DataFrame([plan.row() for plan in plans])
binding = enforced({"backend": p.backend, "cuda": p.cuda})
prov = provenance(
    params={
        "groups": p.groups,
        "catalog": p.catalog,
        "cuda": p.cuda,
        "checkpoint_at_s": p.checkpoint_at_s,
    },
    inputs=[smk.input.catalog],
    backend=p.backend,
    device_model=",".join(sorted({plan.gpu for plan in plans})),
)
write_csv(
    table,
    smk.output.table,
    prov,
    backend=p.backend,
    enforced=binding,
    note="GiB per GPU, GB per node, seconds; fits is binding (refused at config time) for real "
    "full-size runs only" + ("" if binding else ": this campaign's plan is informative"),
)
log.info(
    "%d of %d groups fit%s",
    int(table["fits"].sum()),
    len(table),
    "" if binding else " (not binding here)",
)
