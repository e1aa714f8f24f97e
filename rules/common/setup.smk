# The Snakemake process itself: this checkout's library first on the search path, the exit
# without a last garbage collection, and the config read, validated and filled (wattflex.config).
import json
import os
import sys
from pathlib import Path

from snakemake.logging import logger

# This checkout's library, never another one's: a `pip install -e` of another clone puts its
# workflow_scripts/ on sys.path via a .pth file, and Snakemake's script preamble only *appends*
# the script's folder. PYTHONPATH comes before site-packages, and every job (local script
# subprocesses, SLURM jobs, which re-read this file) inherits os.environ. (--sdm conda drops
# PYTHONPATH; its envs install the checkout they were made from, envs/*.yaml.)
_LIB = str(Path(workflow.basedir) / "workflow_scripts")
sys.path.insert(0, _LIB)
_SEARCH_PATH = "PYTHONPATH"  # set here for the jobs, never required of the user (no envvars:)
os.environ[_SEARCH_PATH] = os.pathsep.join(
    [_LIB] + [p for p in os.environ.get(_SEARCH_PATH, "").split(os.pathsep) if p and p != _LIB])

from wattflex.config import ConfigError, check_config_files, defaulted_sections, prepare
from wattflex.smk import die_with_parent, in_slurm_job_step, skip_exit_gc

# A SLURM job's own Snakemake dies with the job's batch script (scancel: the shell dies first and
# proctrack/linuxproc loses what it leaves behind; wattflex.smk.die_with_parent).
if in_slurm_job_step():
    die_with_parent()

# snakemake itself exits without a last collection over its DAG (~0.5 s of a ~3 s no-op dry run)
skip_exit_gc()

try:
    # Snakemake's own YAML loading keeps the last of duplicate keys: read the files as wattflex does.
    check_config_files(workflow.configfiles)
    prepare(config, base=Path(workflow.basedir))
    if config["source"] == "generate" and config["backend"] == "cuda":
        # what the runs need (weights, data, cap command, memory plan), relative paths against
        # Snakemake's working directory, where runs start; imported here: numpy and pandas
        from wattflex.runs.campaign_checks import check_inputs

        check_inputs(config, cwd=os.getcwd())
    if config["backend"] == "emulated" and workflow.is_main_process:
        # too short to reach a steady state: refused now, not after every run has run
        from wattflex.runs.emulator.timeline import check_run_length

        check_run_length(config)
except ConfigError as exc:
    raise WorkflowError(str(exc)) from None

# --configfile is merged onto config/config.yaml (the Snakefile's configfile:): say which
# sections came from the default, so a section deleted from the user's file is not a surprise
# (wattflex.config's docstring; --replace-workflow-config uses the user's file alone).
if (workflow.is_main_process and workflow.overwrite_configfiles
        and not workflow.config_settings.replace_workflow_config):
    _from_default = defaulted_sections(config, workflow.overwrite_configfiles,
                                       workflow.config_settings.overwrite_config)
    if _from_default:
        logger.info(f"wattflex: sections not in {', '.join(map(str, workflow.overwrite_configfiles))} "
                    f"come from config/config.yaml: {', '.join(_from_default)} "
                    f"(--replace-workflow-config to use your file alone)")
