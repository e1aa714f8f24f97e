"""Odd inputs: one line and exit status 2, never a
traceback, a hang or a MemoryError. Every command's input passes one check
(``wattflex.ingest.reader.check_input_file``): a FIFO, a folder, a device or a file over the
size limit says what it is before it is opened; counts and GPU indices are bounded before a
list is made of them."""

import signal
from contextlib import contextmanager

import pytest

from tests.unit.test_cli_safety import SWEEPS as SWEEP

CURVES = "job,power_w,throughput\na,300,10\na,200,8\na,100,5\nb,300,10\nb,200,9\nb,100,7\n"

# command line of each input, IN standing for the odd file
INPUTS = {
    "pfi": ["pfi", "IN"],
    "stats": ["stats", "IN"],
    "allocate": ["allocate", "IN", "--cut", "0.2"],
    "offer": ["offer", "IN"],
    "offer --configfile": ["offer", "--configfile", "IN"],
    "predict --model": ["predict", "t.csv", "--model", "IN"],
    "doctor --configfile": ["doctor", "--configfile", "IN"],
    "cluster-control --signal": [
        "cluster-control",
        "--signal",
        "IN",
        "--budget-dir",
        "bd",
        "--duration-s",
        "1",
    ],
    "run-at-cap SPEC": ["run-at-cap", "IN", "out"],
    "calibrate --gpu-check": ["calibrate", "--gpu-check", "IN"],
}
KINDS = {
    "fifo": "is a FIFO (named pipe), not a regular file",
    "folder": "is a directory, not a file",
    "/dev/zero": "/dev/zero: is a character device, not a regular file",
    "sparse 1 GiB": "is 1,024 MiB, over the",
}


@contextmanager
def no_hang(seconds: int = 30):
    """A command that blocks on opening a FIFO fails the test instead of hanging it."""

    def stop(signum, frame):
        raise TimeoutError(f"the command still runs after {seconds} s (blocked opening the input?)")

    old = signal.signal(signal.SIGALRM, stop)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)


def odd_input(tmp_path, kind: str) -> str:
    path = tmp_path / "in"
    if kind == "fifo":
        import os

        os.mkfifo(path)
    elif kind == "folder":
        path.mkdir()
        (path / "x.csv").write_text(CURVES)
    elif kind == "sparse 1 GiB":
        with open(path, "wb") as fh:
            fh.truncate(2**30)  # sparse: no disk used
    else:
        return kind
    return "in"


def one_line(proc, command: str) -> str:
    assert proc.returncode == 2, (proc.returncode, proc.stderr[-2000:])
    assert "Traceback" not in proc.stderr, proc.stderr[-2000:]
    line = proc.stderr.strip().splitlines()[-1]
    assert line.startswith(f"wattflex {command}: error: "), proc.stderr[-2000:]
    return line


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("option", INPUTS)
def test_an_input_that_is_not_a_regular_file_or_too_big_says_what_it_is(
    tmp_path, option, kind, run_cli
):
    (tmp_path / "t.csv").write_text("job,dram_active\nj,0.5\n")
    name = odd_input(tmp_path, kind)
    argv = [name if a == "IN" else a for a in INPUTS[option]]
    with no_hang():
        line = one_line(run_cli(*argv, cwd=tmp_path), argv[0])
    assert KINDS[kind] in line and f"{name}:" in line, line
    if kind == "sparse 1 GiB":
        assert "MiB limit of an input" in line, line


def test_offer_refuses_an_absurd_job_count_before_making_its_rows(tmp_path, run_cli):
    (tmp_path / "c.csv").write_text(CURVES)
    line = one_line(run_cli("offer", "c.csv", "--job", "a=10000000000", cwd=tmp_path), "offer")
    assert "--job 'a=10000000000': N must be a whole number > 0 and at most 100,000" in line, line
    assert run_cli("offer", "c.csv", "--job", "a=3", cwd=tmp_path).returncode == 0


@pytest.mark.parametrize("spec, index", [("0-99999999999", 99999999999), ("0,1024", 1024)])
def test_control_refuses_a_gpu_index_no_node_has_before_expanding_the_range(
    tmp_path, run_cli, spec, index
):
    line = one_line(
        run_cli("control", "--dry-run", "--budget-w", "500", "--job-gpus", spec, cwd=tmp_path),
        "control",
    )
    assert f"--job-gpus {spec!r}: GPU index {index} is over 1023" in line, line


def test_the_sweep_fixture_still_reads(tmp_path, run_cli):
    # the bound is a limit on odd files, not on ordinary ones
    (tmp_path / "s.csv").write_text(SWEEP)
    assert run_cli("pfi", "s.csv", cwd=tmp_path).returncode == 0


# ---- TypeError on odd tables and models: a UserError naming the column or field -------------


def _parquet(tmp_path, name: str, columns: dict) -> str:
    import pandas as pd

    pd.DataFrame(columns).to_parquet(tmp_path / name)
    return name


SWEEP_COLUMNS = {
    "group": ["a"] * 3,
    "cap_w": [300, 400, 500],
    "power_w": [290, 380, 450],
    "throughput": [80, 95, 100],
}


@pytest.mark.parametrize("argv", [["pfi", "IN"], ["ingest", "sweep-table", "IN", "-o", "runs.csv"]])
def test_two_columns_one_name_once_stripped_are_named(tmp_path, run_cli, argv):
    name = _parquet(tmp_path, "dup.parquet", {**SWEEP_COLUMNS, " cap_w": [1, 2, 3]})
    line = one_line(run_cli(*[name if a == "IN" else a for a in argv], cwd=tmp_path), argv[0])
    assert (
        "dup.parquet: duplicate column name(s) 'cap_w' (blanks around a name do not count" in line
    ), line


def test_allocate_refuses_a_curve_column_given_twice_once_stripped(tmp_path, run_cli):
    (tmp_path / "c.csv").write_text("job,power_w, power_w,throughput\na,300,1,80\na,200,1,70\n")
    line = one_line(run_cli("allocate", "c.csv", "--cut", "0.2", cwd=tmp_path), "allocate")
    assert "c.csv: duplicate column name(s) 'power_w'" in line, line


@pytest.mark.parametrize(
    "argv, columns, column",
    [
        (["pfi", "IN"], {**SWEEP_COLUMNS, "group": [["a"]] * 3}, "group"),
        (
            ["allocate", "IN", "--cut", "0.2"],
            {"job": [["a"]] * 3, "power_w": [300, 400, 500], "throughput": [80, 95, 100]},
            "job",
        ),
        (
            ["offer", "IN"],
            {"job": [["a"]] * 3, "power_w": [300, 400, 500], "throughput": [80, 95, 100]},
            "job",
        ),
        (
            ["stats", "IN"],
            {
                "group": ["g1", "g2", "g3", "g4"],
                "cluster": [{"c": "dense"}] * 4,
                "pfi_ratio": [1.0, 2, 3, 4],
            },
            "cluster",
        ),
    ],
)
def test_a_table_cell_that_holds_a_list_or_map_is_named_by_column(
    tmp_path, run_cli, argv, columns, column
):
    name = _parquet(tmp_path, "nested.parquet", columns)
    line = one_line(run_cli(*[name if a == "IN" else a for a in argv], cwd=tmp_path), argv[0])
    assert (
        f"nested.parquet: cells must hold one number or text each: column {column!r} holds a"
        in line
    ), line
    assert "in row 1" in line, line


@pytest.mark.parametrize(
    "model, field",
    [
        (
            {"features": [{}], "coefficients": {}, "intercept": 0.0},
            "features: [{}] is not a list of feature names",
        ),
        (
            {
                "features": ["dram_copy_product"],
                "coefficients": {"dram_copy_product": [1]},
                "intercept": 0.0,
            },
            "coefficients.dram_copy_product: [1] is not a number",
        ),
        ({"features": [], "coefficients": {}, "intercept": "x"}, "intercept: 'x' is not a number"),
    ],
)
def test_a_model_with_odd_features_or_numbers_names_the_field(tmp_path, run_cli, model, field):
    import json

    (tmp_path / "m.json").write_text(json.dumps({"schema_version": "1.0", **model}))
    (tmp_path / "t.csv").write_text("job,dram_active,mem_copy_util\nj,0.5,10\n")
    line = one_line(run_cli("predict", "t.csv", "--model", "m.json", cwd=tmp_path), "predict")
    assert f"m.json: {field}" in line, line
