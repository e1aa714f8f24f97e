"""Snakemake reads --configfile itself and keeps the last of duplicate keys; the
workflow reads the files again as wattflex does and refuses, naming file, line and key."""

from __future__ import annotations

import pytest

from .conftest import REPO, snakemake

pytestmark = pytest.mark.slow


def test_a_key_given_twice_in_the_configfile_stops_snakemake(tmp_path):
    config = tmp_path / "c.yaml"
    tiny = (REPO / "tests" / "data" / "tiny.yaml").read_text()
    config.write_text(tiny.replace("seed: 1\n", "seed: 1\nseed: 2\n", 1))
    line = tiny[: tiny.index("seed: 1\n")].count("\n") + 2
    proc = snakemake("-n", "--cores", "1", "--configfile", str(config), cwd=tmp_path, check=False)
    text = proc.stdout + proc.stderr
    assert proc.returncode != 0, text[-2000:]
    assert (
        f"{config}:{line}: key 'seed' given twice in one mapping (first at line {line - 1})" in text
    ), text[-2000:]
