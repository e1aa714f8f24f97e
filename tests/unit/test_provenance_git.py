"""Provenance names the git commit of the wattflex source tree a result was made with, and
whether that tree had uncommitted changes; a tree outside git claims neither."""

import shutil
import subprocess
import sys

import pytest

from tests.conftest import REPO
from wattflex.provenance import code_version


def _git(*args: str) -> str:
    return subprocess.run(
        ["git", "-C", str(REPO), *args], capture_output=True, text=True, check=True
    ).stdout.strip()


def test_a_git_checkout_records_its_commit_and_whether_it_is_dirty():
    try:
        head = _git("rev-parse", "HEAD")
    except (OSError, subprocess.CalledProcessError):
        pytest.skip("this checkout is not a git repository")
    version = code_version()
    assert version["git_commit"] == head
    assert version["git_dirty"] == bool(
        _git("status", "--porcelain", "--", "workflow_scripts/wattflex")
    )


def test_a_copy_outside_git_claims_no_commit(tmp_path):
    shutil.copytree(
        REPO / "workflow_scripts" / "wattflex",
        tmp_path / "wattflex",
        ignore=shutil.ignore_patterns("__pycache__"),
    )
    out = subprocess.run(
        [
            sys.executable,
            "-c",
            "from wattflex.provenance import code_version; "
            "v = code_version(); print(v['git_commit'], v['git_dirty'])",
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        check=True,
        env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(tmp_path)},
    ).stdout.split()
    assert out == ["None", "None"]


def _outer_git(repo, *args: str) -> str:
    return subprocess.run(
        ["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@t", *args],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()


def _code_version_of(package_parent) -> list[str]:
    return subprocess.run(
        [
            sys.executable,
            "-B",
            "-c",
            "from wattflex.provenance import code_version; "
            "v = code_version(); print(v['git_commit'], v['git_dirty'])",
        ],
        cwd=package_parent,
        capture_output=True,
        text=True,
        check=True,
        env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(package_parent)},
    ).stdout.split()


@pytest.mark.parametrize("ignored", [False, True], ids=["untracked", "ignored"])
def test_a_copy_inside_another_repository_claims_its_commit_only_once_tracked_there(
    tmp_path, ignored
):
    """A copy without .git in another repository's folder, untracked or ignored there, has no
    commit (not that repository's HEAD). Once that repository tracks the copy,
    its commit is the copy's, and an edit makes it dirty."""
    outer, vendor = tmp_path / "outer", tmp_path / "outer" / "vendor"
    outer.mkdir()
    _outer_git(outer, "init", "-q")
    (outer / ".gitignore").write_text("vendor/\n" if ignored else "")
    _outer_git(outer, "add", "-A")
    _outer_git(outer, "commit", "-q", "-m", "another project")
    shutil.copytree(
        REPO / "workflow_scripts" / "wattflex",
        vendor / "wattflex",
        ignore=shutil.ignore_patterns("__pycache__"),
    )
    assert _code_version_of(vendor) == ["None", "None"]
    _outer_git(outer, "add", "--force", "vendor")
    _outer_git(outer, "commit", "-q", "-m", "vendor wattflex")
    head = _outer_git(outer, "rev-parse", "HEAD")
    assert _code_version_of(vendor) == [head, "False"]
    with open(vendor / "wattflex" / "labels.py", "a") as fh:
        fh.write("# a local change\n")
    assert _code_version_of(vendor) == [head, "True"]
