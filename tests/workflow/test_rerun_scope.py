"""Rerun scope: a change reruns exactly the jobs it affects, tested with the real
Snakemake CLI on a copy of the tiny campaign.

One finished campaign per session, shared with test_relocation (campaigns.finished_campaign:
the workflow with the campaign run inside it, control study included); each test copies it
(workflow, results, logs and .snakemake metadata, mtimes kept), makes one change to the config
or the code of the copy, and compares the job-count table of `snakemake -n` with the exact set
of jobs the change must plan.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import pytest
import yaml

from .campaigns import Campaign, campaign_config, copy_tree, finished_campaign, snakemake
from .conftest import REPO
from .file_modes import why_not_bound

pytestmark = pytest.mark.slow

N_RUNS = 6 + 4 + 4 + 1  # first group on the six-cap grid, two on four caps, one repeat

# Downstream of the run summaries, in the order the workflow runs them.
# Fidelity against the paper (rules/fidelity.smk) reads runs and PFI: an emulated campaign's
# analysis includes it.
FIDELITY = {"fidelity": 1, "fidelity_figure": 1}
ANALYSIS = {
    "collect_runs": 1,
    "compute_pfi": 1,
    "compare_pfi_published": 1,
    "core_figures": 1,
    "cluster_stats": 1,
    "fit_predictor": 1,
    "paper_tables": 1,
    "analysis_figures": 1,
    "offer": 1,
    "flexibility_statement": 1,
    **FIDELITY,
}


def allocation_wired() -> bool:
    return 'include: "rules/allocation.smk"' in (REPO / "Snakefile").read_text()


# One simulation job per cut of the campaign (campaigns.campaign_config), merged by simulate_allocation.
N_CUTS = len(campaign_config()["allocation"]["cuts"])
ALLOCATION_MERGE = {"simulate_allocation": 1, "allocation_figures": 1} if allocation_wired() else {}
ALLOCATION = {"simulate_allocation_cut": N_CUTS, **ALLOCATION_MERGE} if allocation_wired() else {}
ALLOCATION_FIGURES = {"allocation_figures": 1} if allocation_wired() else {}
FINAL = {"report": 1, "all": 1}
# The control study (rules/control.smk; config/config.yaml's, merged under the campaign): the
# truth tables of the groups (their config, the emulator, the telemetry columns), then one
# simulation per scenario, which reads the predictor's model, then the figures and the
# flexibility statement (its response times come from the control study's M&V).
CONTROL_FIGURES = {"control_figures": 1, "flexibility_statement": 1}
CONTROL_SIMULATIONS = {"simulate_control": 2, **CONTROL_FIGURES}
CONTROL = {"control_truth": 1, **CONTROL_SIMULATIONS}
EVERYTHING_AFTER_SUMMARIES = {**ANALYSIS, **ALLOCATION, **CONTROL_SIMULATIONS, **FINAL}
# One summary job per sweep group (rules/runs.smk), each writing its runs' summary.json.
SUMMARIZE = {
    "dense-pt-mistral24b-x8": "summaries_dense_pt_mistral24b_x8",
    "moe-pt-gptoss20b-x8-ep8": "summaries_moe_pt_gptoss20b_x8_ep8",
    "moe-ft-qwen30ba3b-x8": "summaries_moe_ft_qwen30ba3b_x8",
}
EVERY_SUMMARY = {rule: 1 for rule in SUMMARIZE.values()}


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    return finished_campaign(tmp_path_factory)


@pytest.fixture
def campaign(base, tmp_path) -> Campaign:
    """A private copy of the finished campaign (workflow, results + metadata, config)."""
    root = tmp_path / "campaign"
    copy_tree(base, root)
    return Campaign(root, root, root / "tiny.yaml")


def test_base_campaign_is_complete_and_a_rerun_is_a_no_op(campaign):
    assert (campaign.work / "results" / "tiny" / "report.html").is_file()
    assert campaign.plan() == {}


# ---- config changes --------------------------------------------------------------------


@pytest.mark.skipif(
    not allocation_wired(), reason="allocation stage not included in the Snakefile yet"
)
def test_allocation_setting_reruns_only_allocation_its_figures_and_the_report(campaign):
    campaign.edit_config(lambda c: c["allocation"].update(cuts=[0.0, 0.1, 0.3]))
    # Dropping cuts reruns only the merge: the kept cuts' jobs are up to date.
    assert campaign.plan() == {**ALLOCATION_MERGE, **FINAL}


@pytest.mark.skipif(
    not allocation_wired(), reason="allocation stage not included in the Snakefile yet"
)
def test_a_new_cut_runs_only_its_simulation_job_and_the_merge(campaign):
    campaign.edit_config(lambda c: c["allocation"].update(cuts=[*c["allocation"]["cuts"], 0.45]))
    assert campaign.plan() == {"simulate_allocation_cut": 1, **ALLOCATION_MERGE, **FINAL}


def test_predictor_features_rerun_predictor_allocation_and_reports_not_runs_or_pfi(campaign):
    campaign.edit_config(
        lambda c: c.setdefault("predictor", {}).update(
            features="dram_copy_product+arithmetic_intensity"
        )
    )
    # paper_tables (Table 8: the H200 predictor on H100) and analysis_figures (Fig. 7)
    # report the predictions, so they rerun with it.
    assert campaign.plan() == {
        "fit_predictor": 1,
        "paper_tables": 1,
        "analysis_figures": 1,
        **ALLOCATION,
        **CONTROL_SIMULATIONS,
        **FINAL,
    }


def test_plot_styling_reruns_figures_and_the_report_only(campaign):
    campaign.edit_config(lambda c: c["figures"].update(dpi=61))
    assert campaign.plan() == {
        "core_figures": 1,
        "analysis_figures": 1,
        "fidelity_figure": 1,
        "offer": 1,
        "flexibility_statement": 1,
        **ALLOCATION_FIGURES,
        **CONTROL_FIGURES,
        **FINAL,
    }


def test_summary_protocol_reruns_summaries_and_everything_downstream_never_runs(campaign):
    campaign.edit_config(lambda c: c["summary"].update(aggregate="mean"))
    assert campaign.plan() == {**EVERY_SUMMARY, **EVERYTHING_AFTER_SUMMARIES}


def test_a_deleted_summary_is_rebuilt_with_what_reads_it_and_nothing_else(campaign):
    """Deleting one run's summary.json remakes it: every summary is one of rule all's targets
    (Snakemake remakes a missing intermediate only for a target)."""
    summary = (
        campaign.work
        / "results"
        / "tiny"
        / "runs"
        / "moe-ft-qwen30ba3b-x8"
        / "cap200"
        / "summary.json"
    )
    before = json.loads(summary.read_text())
    summary.unlink()
    assert campaign.plan() == {SUMMARIZE["moe-ft-qwen30ba3b-x8"]: 1, **EVERYTHING_AFTER_SUMMARIES}
    # remade as it was, by itself (its readers, planned above, are a whole analysis on 2 cores);
    # then nothing is left to do: the readers' inputs are as they were
    snakemake(
        campaign.workflow,
        campaign.work,
        campaign.config,
        "-q",
        "--cores",
        "2",
        str(summary.relative_to(campaign.work)),
    )
    assert json.loads(summary.read_text()) == before
    assert campaign.plan() == {}


def test_one_groups_run_config_reruns_exactly_its_runs(campaign):
    campaign.edit_config(lambda c: c["groups"][2].update(batch=8))  # moe-ft, four caps
    # and the resource plan, which reads a group's shape (not its caps: see the next test)
    assert campaign.plan() == {
        "run_at_cap": 4,
        SUMMARIZE["moe-ft-qwen30ba3b-x8"]: 1,
        "resource_plan": 1,
        "control_truth": 1,
        **EVERYTHING_AFTER_SUMMARIES,
    }


def test_adding_a_cap_runs_only_the_new_run(campaign):
    campaign.edit_config(lambda c: c["groups"][1].update(caps=[200, 300, 500, 600, 700]))
    # The new run only; its group's summaries are redone (ms each), no other group's.
    assert campaign.plan() == {
        "run_at_cap": 1,
        SUMMARIZE["moe-pt-gptoss20b-x8-ep8"]: 1,
        "control_truth": 1,
        **EVERYTHING_AFTER_SUMMARIES,
    }


def test_adding_a_group_runs_only_its_runs(campaign):
    campaign.edit_config(
        lambda c: c["groups"].append(
            {
                "id": "dense-ft-mistral24b-x8",
                "model": "Mistral-Small-24B-Base-2501",
                "task": "lora",
                "gpus": 8,
            }
        )
    )
    assert campaign.plan() == {
        "run_at_cap": 4,
        "summaries_dense_ft_mistral24b_x8": 1,
        "resource_plan": 1,
        "control_truth": 1,
        **EVERYTHING_AFTER_SUMMARIES,
    }


def test_scheduling_settings_rerun_nothing(campaign):
    def change(c):
        c["run"].update(retries=3, parallel_within_group=True)
        c["slurm_gpus_per_node"] = 4

    campaign.edit_config(change)
    assert campaign.plan() == {}


def test_reordering_config_keys_reruns_nothing(campaign):
    """Same values, every mapping's keys in another order (params are compared by repr)."""
    cfg = yaml.safe_load(campaign.config.read_text())
    campaign.config.write_text(yaml.safe_dump(cfg, sort_keys=True))
    assert campaign.config.read_text() != yaml.safe_dump(cfg, sort_keys=False)
    assert campaign.plan() == {}


def test_a_statistics_setting_reruns_only_its_stage_and_what_reads_it(campaign):
    campaign.edit_config(lambda c: c.setdefault("stats", {}).update(alpha=0.01))
    # fidelity reports the Dunn-Holm pattern at the campaign's alpha
    assert campaign.plan() == {"cluster_stats": 1, "analysis_figures": 1, **FIDELITY, **FINAL}


# ---- code changes (Snakemake does not see imported modules: code_fingerprint does) -------

FIGURE_RULES = {
    "core_figures": 1,
    "analysis_figures": 1,
    "fidelity_figure": 1,
    "offer": 1,
    "flexibility_statement": 1,
    **ALLOCATION_FIGURES,
    **CONTROL_FIGURES,
}


@pytest.mark.parametrize(
    "module, expected",
    [
        (
            "runs/emulator/step",
            {"run_at_cap": N_RUNS, **EVERY_SUMMARY, **EVERYTHING_AFTER_SUMMARIES, **CONTROL},
        ),
        ("telemetry", {**EVERY_SUMMARY, **EVERYTHING_AFTER_SUMMARIES, **CONTROL}),
        # the fit only: the control study's cluster applies the fitted model with the core's
        # wattflex.pfi_model, so its truth tables stay; its simulations read the new model
        (
            "analysis/predictor",
            {
                "cluster_stats": 1,
                "fit_predictor": 1,
                "paper_tables": 1,
                "analysis_figures": 1,
                **ALLOCATION,
                **CONTROL_SIMULATIONS,
                **FINAL,
            },
        ),
        # A plot-only change (the shared style of every figure) plans the figure rules and the
        # report, never a simulation: no module outside plots/ imports plot code.
        ("plots/style", {**FIGURE_RULES, **FINAL}),
        ("report", FINAL),
        ("analysis/fidelity", {**FIDELITY, **FINAL}),
        ("plots/fidelity", {"fidelity_figure": 1, **FINAL}),
    ],
    ids=lambda v: v if isinstance(v, str) else "",
)
def test_library_code_change_reruns_exactly_its_dependents(campaign, module, expected):
    campaign.edit_code(f"workflow_scripts/wattflex/{module}.py")
    assert campaign.plan() == expected


def test_rule_script_change_reruns_that_rule_and_downstream(campaign):
    campaign.edit_code("workflow_scripts/cluster_stats.py")
    assert campaign.plan() == {"cluster_stats": 1, "analysis_figures": 1, **FINAL}


# ---- real runs are protected ------------------------------------------------------------

PROTECTED_FLAGS = """
import sys
from pathlib import Path
from snakemake.api import SnakemakeApi
from snakemake.io import is_flagged
from snakemake.settings.types import ConfigSettings, OutputSettings, ResourceSettings, StorageSettings

snakefile, workdir, config = map(Path, sys.argv[1:4])
with SnakemakeApi(OutputSettings()) as api:
    wf = api.workflow(resource_settings=ResourceSettings(cores=1), config_settings=ConfigSettings(configfiles=[config]),
                      storage_settings=StorageSettings(), snakefile=snakefile, workdir=workdir)
    rule = wf._workflow.get_rule("run_at_cap")
    flags = [is_flagged(f, "protected") for f in rule.output]
    print("PROTECTED", sum(flags), len(flags), repr(wf._workflow.globals["RUN_CODE"]))
"""


@pytest.mark.parametrize(
    "backend, n_protected, run_code_empty", [("emulated", 0, False), ("cuda", 3, True)]
)
def test_run_outputs_are_write_protected_for_real_backends_only(
    campaign, backend, n_protected, run_code_empty
):
    # A cuda campaign must say where its weights come from (runs.campaign_checks.check_cuda): tiny needs none.
    campaign.edit_config(
        lambda c: c.update(
            backend=backend, **({"cuda": {"tiny": True}} if backend == "cuda" else {})
        )
    )
    env = {**os.environ, "PYTHONPATH": str(campaign.workflow / "workflow_scripts")}
    proc = subprocess.run(
        [
            sys.executable,
            "-c",
            PROTECTED_FLAGS,
            str(campaign.workflow / "Snakefile"),
            str(campaign.work),
            str(campaign.config),
        ],
        capture_output=True,
        text=True,
        env=env,
        cwd=campaign.workflow,
        timeout=300,
    )
    m = re.search(r"^PROTECTED (\d+) (\d+) (.*)$", proc.stdout, re.M)
    assert m, proc.stdout[-2000:] + proc.stderr[-3000:]
    assert (int(m.group(1)), int(m.group(2))) == (n_protected, 3)
    assert (m.group(3) == "''") == run_code_empty  # a real run's params carry no code fingerprint


@pytest.mark.skipif(bool(why_not_bound()), reason=why_not_bound())
def test_snakemake_refuses_to_regenerate_a_write_protected_run(campaign):
    """What Snakemake leaves after a real run (read-only files) is never overwritten: a
    change to that run's spec makes Snakemake stop and name the files, for a process that file
    modes bind (an unprivileged user; root without its file-permission capabilities), from a
    clone anywhere (tests/workflow/file_modes.py)."""
    run_dir = campaign.work / "results" / "tiny" / "runs" / "moe-ft-qwen30ba3b-x8" / "cap200"
    for f in ("telemetry.parquet", "steps.parquet", "run.json"):
        os.chmod(run_dir / f, 0o444)
    try:
        campaign.edit_config(lambda c: c["groups"][2].update(batch=8))  # that run's spec changes
        proc = snakemake(
            campaign.workflow,
            campaign.work,
            campaign.config,
            "-n",
            "--cores",
            "2",
            check=False,
            file_modes_bind=True,
        )
        text = proc.stdout + proc.stderr
        assert proc.returncode != 0 and "Write-protected output files" in text, text[-3000:]
        assert "moe-ft-qwen30ba3b-x8/cap200/run.json" in text
        assert (run_dir / "run.json").is_file()
    finally:
        for f in ("telemetry.parquet", "steps.parquet", "run.json"):
            os.chmod(run_dir / f, 0o644)  # so that pytest can clean tmp_path up as any user
