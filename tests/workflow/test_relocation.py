"""A finished campaign is a folder that can move: every path the rules see is relative, so a
`cp -a` of the workflow with its finished tiny campaign plans nothing (the README's
promise); and the paper's published tables are inputs of the rules that show them, so
editing one reruns exactly those (and the report), with the real Snakemake CLI."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from .campaigns import finished_campaign, planned, snakemake

pytestmark = pytest.mark.slow

TABLES = Path("resources/paper/tables")


@pytest.fixture(scope="module")
def finished(tmp_path_factory) -> Path:
    """The workflow with the tiny campaign run to the end inside it (its own working directory),
    shared with test_rerun_scope: read only, copied before any change."""
    return finished_campaign(tmp_path_factory)


def copied(finished: Path, dst: Path) -> Path:
    """``cp -a`` of the finished folder (mtimes, .snakemake metadata and all) to ``dst``."""
    dst.parent.mkdir(parents=True, exist_ok=True)
    subprocess.run(["cp", "-a", str(finished), str(dst)], check=True)
    return dst


def plan(root: Path) -> dict[str, int]:
    return planned(snakemake(root, root, root / "tiny.yaml", "-n", "--cores", "2"))


def test_the_tiny_campaign_has_a_control_study(finished):
    # the control study's signal file was the absolute path that made a moved run rerun
    assert (finished / "results" / "tiny" / "control" / "summary.csv").is_file()


def test_a_finished_run_copied_elsewhere_plans_nothing(finished, tmp_path):
    moved = copied(finished, tmp_path / "somewhere" / "else")
    assert plan(moved) == {}


def edit_published(root: Path, stem: str) -> None:
    """Change one published value (the last cell of the first data row)."""
    path = root / TABLES / f"{stem}.csv"
    lines = path.read_text().splitlines()
    head, _, last = lines[1].rpartition(",")
    lines[1] = f"{head},{last}9" if last else f"{head},1"
    path.write_text("\n".join(lines) + "\n")


@pytest.mark.parametrize(
    "stem, expected",
    [
        # Tables 6-7: the comparison, the figure that draws it, the fidelity tables and their figure
        (
            "table6_pfi_h200",
            {"compare_pfi_published": 1, "core_figures": 1, "fidelity": 1, "fidelity_figure": 1},
        ),
        # Table 1 is shown in the report only
        ("table1_experiment_matrix", {}),
    ],
)
def test_editing_a_published_table_reruns_its_tables_and_the_report(
    finished, tmp_path, stem, expected
):
    camp = copied(finished, tmp_path / "edited")
    edit_published(camp, stem)
    assert plan(camp) == {**expected, "report": 1, "all": 1}
