"""Provenance names the git commit of the wattflex source tree a result was made with, and
whether that tree had uncommitted changes; a tree outside git claims neither."""

import shutil
import subprocess
import sys

import pytest

from wattflex.provenance import code_version

from tests.conftest import REPO


def _git(*args: str) -> str:
    return subprocess.run(["git", "-C", str(REPO), *args], capture_output=True, text=True, check=True).stdout.strip()


def test_a_git_checkout_records_its_commit_and_whether_it_is_dirty():
    try:
        head = _git("rev-parse", "HEAD")
    except (OSError, subprocess.CalledProcessError):
        pytest.skip("this checkout is not a git repository")
    version = code_version()
    assert version["git_commit"] == head
    assert version["git_dirty"] == bool(_git("status", "--porcelain", "--", "workflow_scripts/wattflex"))


def test_a_copy_outside_git_claims_no_commit(tmp_path):
    shutil.copytree(REPO / "workflow_scripts" / "wattflex", tmp_path / "wattflex",
                    ignore=shutil.ignore_patterns("__pycache__"))
    out = subprocess.run([sys.executable, "-c", "from wattflex.provenance import code_version; "
                          "v = code_version(); print(v['git_commit'], v['git_dirty'])"],
                         cwd=tmp_path, capture_output=True, text=True, check=True,
                         env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(tmp_path)}).stdout.split()
    assert out == ["None", "None"]
