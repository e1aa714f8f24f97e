"""A copy of the workflow with a campaign, in the workflow's folder (``finished_campaign``) or in a
working folder beside it: the helpers of the tests that change or move a finished campaign
(rerun scope, relocation, write protection) and run the real Snakemake CLI on the copy."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import yaml

from tests.shared_builds import built_once

from .conftest import REPO
from .file_modes import bound_by_file_modes

# What a user copies to run the workflow elsewhere (no tests/, no .git).
WORKFLOW_PARTS = (
    "Snakefile",
    "rules",
    "workflow_scripts",
    "config",
    "envs",
    "profiles",
    "resources",
)


def copy_tree(src: Path, dst: Path) -> None:
    """Copy keeping mtimes, so Snakemake sees the copy exactly as it saw the original."""
    if src.is_dir():
        shutil.copytree(
            src,
            dst,
            copy_function=shutil.copy2,
            symlinks=True,
            ignore=shutil.ignore_patterns("__pycache__", "*.egg-info", ".pytest_cache"),
        )
    else:
        shutil.copy2(src, dst)


def copy_workflow(dst: Path, src: Path = REPO) -> Path:
    dst.mkdir(parents=True)
    for part in WORKFLOW_PARTS:
        if (src / part).exists():
            copy_tree(src / part, dst / part)
    return dst


def campaign_config() -> dict:
    """The tiny campaign, its first group on the six-cap grid (so Table 9 has a group); the
    published tables are the copy of the workflow's own (resources/), found relative to it."""
    cfg = yaml.safe_load((REPO / "tests" / "data" / "tiny.yaml").read_text())
    cfg["groups"][0]["cap_grid"] = "six"
    # A small allocation study (merged over config.yaml's): workloads, not the method, shrink;
    # four cuts (the headline's 0.3 among them), one simulate_allocation_cut job each, not 9.
    cfg["allocation"] = {
        "n_workloads": 20,
        "jobs_per_workload": 20,
        "cuts": [0.0, 0.1, 0.2, 0.3],
        "out_of_sample": {"splits": 0, "workloads": 10},
    }
    return cfg


def snakemake(
    workflow: Path,
    work: Path,
    config: Path,
    *args: str,
    check: bool = True,
    user: int | None = None,
    file_modes_bind: bool = False,
) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(workflow / "workflow_scripts")}
    cmd = [
        sys.executable,
        "-m",
        "snakemake",
        "-s",
        str(workflow / "Snakefile"),
        "--directory",
        str(work),
        "--configfile",
        str(config),
        *args,
    ]
    if file_modes_bind:
        cmd = bound_by_file_modes(cmd)
    if user is not None:
        cmd = ["setpriv", f"--reuid={user}", f"--regid={user}", "--clear-groups", *cmd]
        env["HOME"] = str(work)
    proc = subprocess.run(cmd, cwd=workflow, capture_output=True, text=True, env=env, timeout=600)
    if check and proc.returncode != 0:
        raise AssertionError(
            f"snakemake {' '.join(args)} failed ({proc.returncode}):\n{proc.stdout[-3000:]}\n"
            f"{proc.stderr[-5000:]}"
        )
    return proc


def planned(proc: subprocess.CompletedProcess) -> dict[str, int]:
    """{rule: job count} from the job-stats table of `snakemake -n` ({} if nothing to do)."""
    text = proc.stdout + proc.stderr
    if "Nothing to be done" in text:
        return {}
    table = text[text.index("Job stats:") :]
    counts = {}
    for line in table.splitlines()[3:]:
        m = re.match(r"^(\w+)\s+(\d+)$", line.strip())
        if not m:
            break
        if m.group(1) != "total":
            counts[m.group(1)] = int(m.group(2))
    return counts


@dataclass
class Campaign:
    workflow: Path
    work: Path
    config: Path

    def edit_config(self, change) -> None:
        cfg = yaml.safe_load(self.config.read_text())
        change(cfg)
        self.config.write_text(yaml.safe_dump(cfg, sort_keys=False))

    def edit_code(
        self, rel: str, text: str = "\n# an edit that changes the module's source\n"
    ) -> None:
        with open(self.workflow / rel, "a") as fh:
            fh.write(text)

    def plan(self) -> dict[str, int]:
        return planned(snakemake(self.workflow, self.work, self.config, "-n", "--cores", "2"))


def finished_campaign(tmp_path_factory) -> Path:
    """The workflow (a copy) with the campaign of ``campaign_config()`` run to the end inside it, as
    its own working directory, so config/config.yaml (control study included) is merged under the
    campaign; ``tiny.yaml`` beside the Snakefile. Built once per session (``built_once``) for the
    modules that change or move a finished campaign: copy it (``copy_tree``, ``cp -a``) first."""

    def build(root: Path) -> None:
        copy_workflow(root)
        (root / "tiny.yaml").write_text(yaml.safe_dump(campaign_config(), sort_keys=False))
        snakemake(root, root, root / "tiny.yaml", "--cores", "2", "-q")
        assert planned(snakemake(root, root, root / "tiny.yaml", "-n", "--cores", "2")) == {}

    return built_once(tmp_path_factory, "finished_tiny", build)
