"""The tree is clean under ruff's lint rules and formatter as pyproject.toml configures them
([tool.ruff])."""

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def _ruff(*args):
    return subprocess.run(
        [sys.executable, "-m", "ruff", *args], cwd=REPO, capture_output=True, text=True
    )


def test_ruff_check_is_clean():
    r = _ruff("check", "--no-cache", "--output-format", "concise", ".")
    assert r.returncode == 0, r.stdout + r.stderr


def test_ruff_format_leaves_the_tree_as_it_is():
    r = _ruff("format", "--check", "--no-cache", ".")
    assert r.returncode == 0, "run `ruff format .`:\n" + r.stdout + r.stderr
