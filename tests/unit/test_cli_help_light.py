"""`wattflex --help` stays light: it imports every command module (wattflex.cli), so those
import their heavy libraries inside ``run``, never at the top. This test is what keeps it so
(benchmarks/bench_cli_help.py measures the time)."""

import os
import subprocess
import sys

HEAVY = ("numpy", "pandas", "pyarrow", "scipy", "sklearn", "matplotlib", "torch", "snakemake")


def test_help_imports_no_heavy_library(repo):
    code = (
        "import contextlib, io, sys\n"
        "from wattflex.cli import main\n"
        "with contextlib.redirect_stdout(io.StringIO()) as out:\n"
        "    try:\n        main(['--help'])\n    except SystemExit:\n        pass\n"
        "assert 'COMMAND' in out.getvalue(), out.getvalue()\n"
        f"heavy = sorted(m for m in {HEAVY!r} if m in sys.modules)\n"
        "assert not heavy, heavy\n"
    )
    env = {**os.environ, "PYTHONPATH": str(repo / "workflow_scripts")}
    res = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120
    )
    assert res.returncode == 0, res.stderr
