"""The README's set-up commands are the ones CI runs."""
import re
import subprocess


def _block(text: str, tag: str) -> str:
    m = re.search(rf"<!-- {tag} -->\s*```bash\n(.*?)\n```\s*<!-- /{tag} -->", text, re.S)
    assert m, f"README has no {tag} block"
    return m.group(1).strip()


def test_ci_runs_the_readme_test_command(repo):
    readme = (repo / "README.md").read_text()
    test_cmd = _block(readme, "test-command")
    extracted = subprocess.run(
        ["bash", "-c", "sed -n '/<!-- test-command -->/,/<!-- \\/test-command -->/p' README.md "
                       "| sed -n '/^```bash$/,/^```$/p' | sed '1d;$d'"],
        cwd=repo, capture_output=True, text=True, check=True).stdout.strip()
    assert extracted == test_cmd
    assert "torch==2.13.0" in test_cmd and test_cmd.rstrip().endswith("pytest")


def test_run_command_runs_the_default_workflow(repo):
    run_cmd = _block((repo / "README.md").read_text(), "run-command")
    assert "snakemake --cores all" in run_cmd and "pip install -e ." in run_cmd
