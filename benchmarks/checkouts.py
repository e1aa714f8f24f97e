"""Workflow copies for the workflow benchmarks, each in a fresh directory, and a timed
`snakemake` call on one.

A copy is the workflow's parts (Snakefile, rules/, workflow_scripts/, config/, ...) of either
a commit (`git archive`, nothing in the checkout's .git changes) or the working tree as it is
(uncommitted edits included). Beside the copy sits a symlink `shared` to the checkout's
`../shared`: early commits (the first landing, 20fe11c) read the published tables from
`<workflow>/../shared/paper/tables`. Each copy runs its own library (PYTHONPATH), never the
checkout's editable install.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
WORKFLOW_PARTS = (
    "Snakefile",
    "rules",
    "workflow_scripts",
    "config",
    "envs",
    "profiles",
    "resources",
)
FIRST_LANDING = "20fe11c"


def _link_shared(root: Path) -> None:
    shared = REPO.parent / "shared"
    if shared.is_dir() and not (root / "shared").exists():
        (root / "shared").symlink_to(shared, target_is_directory=True)


def from_commit(rev: str, root: Path) -> Path:
    """The workflow of commit ``rev`` in ``root/wattflex`` (``root/shared`` beside it)."""
    dst = root / "wattflex"
    dst.mkdir(parents=True)
    listed = subprocess.run(
        ["git", "-C", str(REPO), "ls-tree", "--name-only", rev],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    parts = [p for p in WORKFLOW_PARTS if p in listed]
    archive = subprocess.run(
        ["git", "-C", str(REPO), "archive", rev, *parts], capture_output=True, check=True
    )
    subprocess.run(["tar", "-x", "-C", str(dst)], input=archive.stdout, check=True)
    _link_shared(root)
    return dst


def from_working_tree(root: Path) -> Path:
    """The checkout's workflow as it is now (uncommitted edits too) in ``root/wattflex``."""
    dst = root / "wattflex"
    dst.mkdir(parents=True)
    ignore = shutil.ignore_patterns("__pycache__", "*.egg-info", ".pytest_cache")
    for part in WORKFLOW_PARTS:
        src = REPO / part
        if src.is_dir():
            shutil.copytree(src, dst / part, ignore=ignore, symlinks=True)
        elif src.is_file():
            shutil.copy2(src, dst / part)
    _link_shared(root)
    return dst


def workflow_copy(ref: str, root: Path) -> Path:
    """``ref``: a commit (or any git revision), or ``tree`` for the working tree."""
    return from_working_tree(root) if ref == "tree" else from_commit(ref, root)


def describe(ref: str) -> str:
    if ref == "tree":
        head = subprocess.run(
            ["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"], capture_output=True, text=True
        )
        return f"working tree (HEAD {head.stdout.strip()} + uncommitted edits)"
    full = subprocess.run(
        ["git", "-C", str(REPO), "rev-parse", "--short", ref], capture_output=True, text=True
    )
    return f"commit {full.stdout.strip() or ref}"


def snakemake(
    workflow: Path, work: Path, config: Path, *args: str, check: bool = True
) -> tuple[float, int, str]:
    """(wall seconds, jobs in its job table, output) of one `snakemake` call of ``workflow``
    in the working directory ``work``; a failure exits unless ``check`` is False, when the
    output starts with FAILED and names the failing rules."""
    work.mkdir(parents=True, exist_ok=True)
    cmd = [
        sys.executable,
        "-m",
        "snakemake",
        "-s",
        str(workflow / "Snakefile"),
        "-d",
        str(work),
        "--configfile",
        str(config),
        *args,
    ]
    env = {**os.environ, "PYTHONPATH": str(workflow / "workflow_scripts")}
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, cwd=workflow, capture_output=True, text=True, env=env)
    dt = time.perf_counter() - t0
    out = proc.stdout + proc.stderr
    if proc.returncode:
        if check:
            sys.exit(f"failed: {' '.join(cmd)}\n{out[-4000:]}")
        out = (
            "FAILED in "
            + ", ".join(sorted(set(re.findall(r"^Error in rule (\w+):", out, re.M))))
            + "\n"
            + out
        )
    m = re.search(r"^total\s+(\d+)$", out, re.M)
    return dt, int(m.group(1)) if m else 0, out


def jobs_by_rule(out: str) -> dict[str, int]:
    """{rule: jobs} from the job table of a `snakemake` output (``all`` left out)."""
    table = out[out.index("Job stats:") :] if "Job stats:" in out else ""
    counts = {}
    for line in table.splitlines()[3:]:
        m = re.match(r"^(\w+)\s+(\d+)$", line.strip())
        if not m or m.group(1) == "total":
            break
        if m.group(1) != "all":
            counts[m.group(1)] = int(m.group(2))
    return counts


def per_group_summaries(counts: dict[str, int]) -> dict[str, int]:
    """``counts`` with the per-group summary rules (summaries_<group>, rules/runs.smk) folded
    into one entry, so a table row stays readable."""
    groups = {r: n for r, n in counts.items() if r.startswith("summaries_")}
    out = {r: n for r, n in counts.items() if r not in groups}
    if groups:
        out["summaries_<group>"] = sum(groups.values())
    return out
