"""The documentation site builds with every page link and anchor resolving (mkdocs.yml's validation + --strict)."""

import os
import re
import subprocess
import sys


def test_mkdocs_build_strict_is_green(repo, tmp_path):
    # mkdocs is in the test extra (pyproject.toml), so a missing mkdocs is a failure, not a skip
    env = {
        **os.environ,
        "NO_MKDOCS_2_WARNING": "1",
    }  # material's end-of-life banner, not about these pages
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "mkdocs",
            "build",
            "--strict",
            "-f",
            str(repo / "mkdocs.yml"),
            "-d",
            str(tmp_path / "site"),
        ],
        cwd=repo,
        capture_output=True,
        text=True,
        env=env,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    cli_page = (tmp_path / "site" / "cli" / "index.html").read_text()
    # docs/hooks/table_pipes.py: GitHub's `\|` in a table's code span renders as a plain pipe on the site
    assert (
        "<code>wattflex allocate CURVES.csv (--cut 0.3 | --budget-w W)" in cli_page
        and "\\|" not in cli_page
    )


def test_every_docs_page_is_in_the_nav_and_every_nav_page_exists(repo):
    import yaml

    def pages(node):
        if isinstance(node, str):
            yield node
        elif isinstance(node, list):
            for n in node:
                yield from pages(n)
        elif isinstance(node, dict):
            for v in node.values():
                yield from pages(v)

    nav = set(pages(yaml.safe_load((repo / "mkdocs.yml").read_text())["nav"]))
    on_disk = {p.relative_to(repo / "docs").as_posix() for p in (repo / "docs").rglob("*.md")}
    assert nav == on_disk


def test_the_readme_links_to_pages_that_exist(repo):
    readme = (repo / "README.md").read_text()
    linked = re.findall(r"\]\((docs/[^)#]+)", readme)
    assert linked, "README links to no docs page"
    assert [p for p in linked if not (repo / p).is_file()] == []


def test_the_docs_requirements_are_the_docs_extra_alone(repo):
    """docs/requirements.txt installs the docs tools without the scientific stack that
    `pip install -e '.[docs]'` brings (the package's own dependencies), at the same ranges."""
    import tomllib

    extra = tomllib.loads((repo / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    lines = (repo / "docs" / "requirements.txt").read_text().splitlines()
    reqs = [x.strip() for x in lines if x.strip() and not x.startswith("#")]
    assert sorted(reqs) == sorted(r.replace(" ", "") for r in extra["docs"])
