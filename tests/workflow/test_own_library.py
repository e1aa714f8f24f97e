"""A workflow runs its own library.

With ``pip install -e`` from one checkout, the editable .pth file puts that checkout's
workflow_scripts/ on every interpreter's sys.path, and Snakemake's script preamble only
appends the script's folder: a second clone's rule scripts imported the first clone's
``wattflex``. rules/common/setup.smk now prepends the workflow's own workflow_scripts/ to
PYTHONPATH, which every job inherits.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from .campaigns import copy_workflow
from .conftest import REPO

TARGET = "results/tiny/runs/dense-pt-mistral24b-x8/cap600/run.json"
LOG = "logs/tiny/runs/dense-pt-mistral24b-x8/cap600.log"


def test_rule_scripts_import_the_workflows_own_library(tmp_path):
    # The venv's wattflex is the editable install of this checkout (the other clone here).
    installed = subprocess.run(
        [sys.executable, "-c", "import wattflex; print(wattflex.__file__)"],
        capture_output=True,
        text=True,
        check=True,
        cwd=tmp_path,
        env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"},
    ).stdout.strip()
    assert Path(installed).resolve().is_relative_to(REPO.resolve()), installed

    clone = copy_workflow(tmp_path / "clone")
    # Plant a marker in the clone's library: rule_logger logs which wattflex it belongs to.
    smk_py = clone / "workflow_scripts" / "wattflex" / "smk.py"
    text = smk_py.read_text()
    assert text.count("    return logger\n") == 1
    smk_py.write_text(
        text.replace(
            "    return logger\n",
            "    logger.info('wattflex library: %s', __file__)\n    return logger\n",
        )
    )
    work = tmp_path / "work"
    work.mkdir()
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}  # as a user runs it
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "snakemake",
            "-s",
            str(clone / "Snakefile"),
            "--directory",
            str(work),
            "--configfile",
            str(REPO / "tests" / "data" / "tiny.yaml"),
            "--cores",
            "1",
            TARGET,
        ],
        cwd=work,
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    log = (work / LOG).read_text()
    assert f"wattflex library: {clone / 'workflow_scripts' / 'wattflex' / 'smk.py'}" in log, log
