import subprocess

import pytest


@pytest.fixture
def run_cli(monkeypatch, capsys):
    """``wattflex ARGS`` in folder ``cwd``, run in this process (``wattflex.cli.main``): the exit
    status, stdout and stderr a subprocess would give, without paying a Python start and the
    library's imports per call (~1.5 s of CPU each). What only a process shows (a closed pipe,
    a real signal, the console script) keeps its subprocess tests."""
    from wattflex.cli import main

    def run(*args, cwd) -> subprocess.CompletedProcess:
        monkeypatch.chdir(cwd)
        capsys.readouterr()  # what the test printed before is not the command's
        argv = [str(a) for a in args]
        try:
            status = main(argv)
        except SystemExit as exc:  # argparse's usage errors and --help
            status = exc.code if isinstance(exc.code, int) else int(exc.code is not None)
        out, err = capsys.readouterr()
        return subprocess.CompletedProcess(["wattflex", *argv], status, out, err)

    return run
