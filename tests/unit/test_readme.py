"""The README's set-up commands are the ones CI runs; the command table and examples of docs/cli.md are true."""

import re
import subprocess

import pandas as pd


def _block(text: str, tag: str) -> str:
    m = re.search(rf"<!-- {tag} -->\s*```bash\n(.*?)\n```\s*<!-- /{tag} -->", text, re.S)
    assert m, f"README has no {tag} block"
    return m.group(1).strip()


def test_ci_runs_the_readme_test_command(repo):
    readme = (repo / "README.md").read_text()
    test_cmd = _block(readme, "test-command")
    extracted = subprocess.run(
        [
            "bash",
            "-c",
            "sed -n '/<!-- test-command -->/,/<!-- \\/test-command -->/p' README.md "
            "| sed -n '/^```bash$/,/^```$/p' | sed '1d;$d'",
        ],
        cwd=repo,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    assert extracted == test_cmd
    # the three suites (tests/tiers.py), the unit one first, on 4 xdist workers
    assert "torch==2.13.0" in test_cmd and " ".join(test_cmd.split()).endswith(
        "pytest -m unit -n 4 --dist loadgroup"
        ' && pytest -m "integration or conformance" -n 4 --dist loadgroup'
    )


def test_run_command_runs_the_default_workflow(repo):
    run_cmd = _block((repo / "README.md").read_text(), "run-command")
    assert "snakemake --cores all" in run_cmd and "pip install -e ." in run_cmd


def test_every_wattflex_command_is_documented_in_the_docs(repo):
    from wattflex import cli

    page = (repo / "docs" / "cli.md").read_text()
    table = page[page.index("| command | what it does |") : page.index("## Input rules")]
    missing = [
        name
        for name in cli._command_modules()
        if f"`wattflex {name.replace('_', '-')} " not in table
    ]
    assert not missing, f"commands without a line in docs/cli.md's command table: {missing}"


def test_the_docs_own_sweep_table_gives_a_pfi(repo, tmp_path):
    from wattflex import cli

    page = (repo / "docs" / "cli.md").read_text()
    table = re.search(r"```csv\n(group,gpus,cap_w,power_w,throughput\n.*?)```", page, re.S).group(1)
    (tmp_path / "sweeps.csv").write_text(table)
    assert cli.main(["pfi", str(tmp_path / "sweeps.csv"), "-o", str(tmp_path / "pfi.csv")]) == 0
    assert "llama-ft" in (tmp_path / "pfi.csv").read_text()
    # and as the `source: ingest` campaign it documents (a job's 5200 W is the job's, not one GPU's)
    assert (
        cli.main(
            [
                "ingest",
                "sweep-table",
                str(tmp_path / "sweeps.csv"),
                "-o",
                str(tmp_path / "runs.parquet"),
            ]
        )
        == 0
    )
    assert len(pd.read_parquet(tmp_path / "runs.parquet")) == 3
