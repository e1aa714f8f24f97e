# How runs are scheduled (docs/slurm.md). Cluster facts arrive as
# config keys slurm_* (profiles/slurm/config.yaml sets them); they shape SLURM requests
# only, never a run's params, so changing them reruns nothing.
from wattflex.gpus import GPUS, GPUS_PER_NODE
from wattflex.runs.plan import enforced as plan_enforced, plan_campaign, run_limit_s

SLURM = {"slurm_gpus_per_node": GPUS_PER_NODE, "slurm_gpu_model": "none",
         "slurm_gpu_names": {name: gpu.slurm_name for name, gpu in GPUS.items()}, "slurm_runtime_margin_min": 20}
SLURM.update({k: config[k] for k in SLURM if k in config})
RUN = config["run"]
RUN_RETRIES = int(RUN["retries"])

# Runs of one sweep group execute one after another (the paper's protocol): each holds its
# group's slot, a Snakemake resource of capacity 1, unless run.parallel_within_group.
GROUP_SLOTS = {}
if not RUN["parallel_within_group"]:
    for i, gid in enumerate(GROUPS):
        slot = "sweep_" + "".join(c if c.isalnum() else "_" for c in gid)
        GROUP_SLOTS[gid] = slot if slot not in GROUP_SLOTS.values() else f"{slot}_{i}"
        workflow.register_resource(GROUP_SLOTS[gid], 1)


# Real runs of full-size models: each group's plan (wattflex.runs.plan; config.prepare has
# refused groups that cannot fit), whose start-up (build or load, first step) and checkpoint
# the SLURM time limit must hold. Resources only: no run's params depend on it.
REAL_PLANS = ({p.group: p for p in plan_campaign(config, list(GROUPS.values()))}
              if SOURCE == "generate" and plan_enforced(config) else {})


def run_minutes(group, attempt, duration_s=None, gap_s=None):
    """SLURM time limit of one run of ``group`` (its loop ``duration_s`` and ``gap_s`` default
    to run.*): planned start-up (real runs), the loop (a checkpoint outlasting the rest of it
    extends it), the gap, plus a margin that grows per retry."""
    duration = float(RUN["duration_s"]) if duration_s is None else float(duration_s)
    gap = float(RUN["gap_s"]) if gap_s is None else float(gap_s)
    seconds = duration + gap
    if group in REAL_PLANS:
        seconds = run_limit_s(REAL_PLANS[group], duration, gap, RUN["checkpoint_at_s"])
    return int(-(-seconds // 60)) + int(SLURM["slurm_runtime_margin_min"]) * attempt


def run_resources():
    """``resources:`` of run_at_cap: the group's GPUs (and their model), nodes, time limit,
    its group slot, and the attempt counters the rule script uses to record a final failure."""
    per_node = int(SLURM["slurm_gpus_per_node"])
    gpu_name = lambda wc: SLURM["slurm_gpu_names"].get(GROUPS[wc.group]["gpu"], GROUPS[wc.group]["gpu"].lower())
    nodes = lambda wc: -(-GROUPS[wc.group]["gpus"] // per_node)
    model_named = SLURM["slurm_gpu_model"] == "gpu_model"
    res = {
        # One node: the group's GPUs (--gpus=[<model>:]N). Several: a per-node split, as
        # --gpus-per-node does, through --gres=gpu:[<model>:]<per node> (SLURM's --gres counts
        # per node); wattflex.config.check_node_layout has refused groups that fill no whole nodes.
        "gpu": lambda wc: GROUPS[wc.group]["gpus"] if nodes(wc) == 1 else None,
        "gres": lambda wc: None if nodes(wc) == 1 else ":".join(
            ["gpu", *([gpu_name(wc)] if model_named else []), str(per_node)]),
        # One torchrun launcher per node: SLURM's default of one task per node.
        "nodes": nodes,
        # Multi-node: the jobstep plugin's MPI route (no `srun -n1` wrapper, which cannot
        # span nodes), so real_run's one srun step per node is the job's only step
        # (wattflex.runs.real_run); tasks = nodes, and tasks_per_gpu 0 keeps the plugin from
        # turning `tasks` into --ntasks-per-gpu. None: the resource is unset (single node).
        "mpi": lambda wc: "srun" if nodes(wc) > 1 else None,
        "tasks": lambda wc: nodes(wc) if nodes(wc) > 1 else None,
        "tasks_per_gpu": lambda wc: 0 if nodes(wc) > 1 else None,
        # ... said per node too (the plugin's tasks_per_node refuses 1 for MPI jobs); a profile's
        # set-resources slurm_extra replaces it, and --ntasks = --nodes still puts one on each
        "slurm_extra": lambda wc: "--ntasks-per-node=1" if nodes(wc) > 1 else None,
        "runtime": lambda wc, attempt: run_minutes(wc.group, attempt),
        "run_attempt": lambda wc, attempt: attempt,
        "run_attempts": RUN_RETRIES + 1,
    }
    if model_named:  # multi-node: the model is in the gres
        res["gpu_model"] = lambda wc: gpu_name(wc) if nodes(wc) == 1 else None
    elif SLURM["slurm_gpu_model"] != "none":
        res[SLURM["slurm_gpu_model"]] = gpu_name
    for gid, slot in GROUP_SLOTS.items():
        res[slot] = lambda wc, gid=gid: 1 if wc.group == gid else None
    return res


def sweep_minutes(wildcards, attempt):
    """SLURM time limit of a one-run sweep (rules/sweeps.smk): the one run never outlasts
    the separate runs it replaces (their measured time; one planned start-up for real runs)."""
    seconds = len(GROUPS[wildcards.group]["caps"]) * float(RUN["duration_s"])
    return run_minutes(wildcards.group, attempt, duration_s=seconds, gap_s=0)
