"""``wattflex run-at-cap`` / ``wattflex restore-caps`` and the readers of a
run's files stop on bad input with one line naming the file and what is wrong (exit 2 for
the commands), never a traceback, and never after the (possibly hour-long) run. The commands
run in this process (the ``run_cli`` fixture, tests/unit/conftest.py)."""

from __future__ import annotations

import json
import socket
import subprocess
from pathlib import Path

import pytest

from wattflex.telemetry import RunFileError, read_run_files


def one_line_error(proc: subprocess.CompletedProcess, command: str) -> str:
    assert proc.returncode == 2, (proc.returncode, proc.stdout, proc.stderr)
    assert "Traceback" not in proc.stderr, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"wattflex {command}: error: "), proc.stderr
    return lines[0]


@pytest.fixture
def spec(default_config) -> dict:
    from wattflex.config import run_spec

    s = run_spec(default_config, "moe-ft-qwen30ba3b-x8", "cap500")
    s["run"] = {**s["run"], "duration_s": 300, "eval_at_s": 200, "checkpoint_at_s": 250}
    return s


def _bad(spec: dict, change) -> str:
    s = json.loads(json.dumps(spec))
    change(s)
    return json.dumps(s)


RUN_AT_CAP_CASES = {
    # name: (spec text (None: no file), outdir, what the message says)
    "spec missing": (None, "out", "SPEC spec.json: no such file"),
    "spec not JSON": (
        "{not json",
        "out",
        "spec.json: cannot read the spec (Expecting property name",
    ),
    "spec a list": (
        "[1, 2]",
        "out",
        "spec.json: not a run spec (a JSON object expected, found list)",
    ),
    "spec no keys": (
        '{"a": 1}',
        "out",
        "spec.json: not a run spec: missing backend, cap_w, group, run_id, repeat",
    ),
    "no run_id": (lambda s: s.pop("run_id"), "out", "spec.json: not a run spec: missing run_id"),
    "cap_w text": (
        lambda s: s.update(cap_w="abc"),
        "out",
        "spec.json: cap_w: 'abc' is not a positive number of watts",
    ),
    "cap_w negative": (
        lambda s: s.update(cap_w=-5),
        "out",
        "spec.json: cap_w: -5 is not a positive number of watts",
    ),
    "cap_w infinite": (  # JSON's Infinity: issue 47, no non-finite number runs
        lambda s: s.update(cap_w=float("inf")),
        "out",
        "spec.json: cap_w: inf is not a positive number of watts",
    ),
    "group text": (
        lambda s: s.update(group="x"),
        "out",
        "spec.json: group: a JSON object with an id expected",
    ),
    "backend": (
        lambda s: s.update(backend="foo"),
        "out",
        "spec.json: backend: 'foo' is not one of emulated, cuda",
    ),
    "run text": (lambda s: s.update(run="x"), "out", "spec.json: run: a JSON object expected"),
    "gpus 0": (
        lambda s: s["group"].update(gpus=0),
        "out",
        "spec.json: group.gpus: 0 is not a positive whole number",
    ),
    "gpus text": (
        lambda s: s["group"].update(gpus="8"),
        "out",
        "spec.json: group.gpus: '8' is not a positive whole",
    ),
    "outdir a file": ("ok", "afile", "afile: OUTDIR is a file, not a directory"),
    "outdir under a file": (
        "ok",
        "afile/sub",
        "afile/sub: afile, a folder above OUTDIR, is a file, not a directory",
    ),
}


@pytest.mark.parametrize("case", RUN_AT_CAP_CASES, ids=list(RUN_AT_CAP_CASES))
def test_run_at_cap_bad_input_is_one_line(tmp_path, spec, case, run_cli):
    text, outdir, expected = RUN_AT_CAP_CASES[case]
    if text == "ok":
        text = json.dumps(spec)
    elif callable(text):
        text = _bad(spec, text)
    if text is not None:
        (tmp_path / "spec.json").write_text(text)
    (tmp_path / "afile").write_text("keep me\n")
    line = one_line_error(run_cli("run-at-cap", "spec.json", outdir, cwd=tmp_path), "run-at-cap")
    assert expected in line, line
    assert (tmp_path / "afile").read_text() == "keep me\n"  # nothing destroyed
    assert not (tmp_path / "out").exists()


def test_run_at_cap_good_spec_still_runs(tmp_path, spec, run_cli):
    (tmp_path / "spec.json").write_text(json.dumps(spec))
    proc = run_cli("run-at-cap", "spec.json", "out", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert {p.name for p in (tmp_path / "out").iterdir()} == {
        "telemetry.parquet",
        "steps.parquet",
        "run.json",
    }


@pytest.mark.parametrize("held", ["real", "emulated", "other"])
def test_run_at_cap_refuses_an_outdir_that_holds_files(tmp_path, spec, held, run_cli):
    """`run-at-cap SPEC <a measured run's dir>` is refused: it would replace the measured run."""
    out = tmp_path / "out"
    out.mkdir()
    files = {"train.log": b"the measured run's log\n"}
    if held != "other":
        files["run.json"] = json.dumps(
            {"provenance": {"backend": "cuda" if held == "real" else "emulated"}}
        ).encode()
    for name, data in files.items():
        (out / name).write_bytes(data)
    (tmp_path / "spec.json").write_text(json.dumps(spec))
    line = one_line_error(run_cli("run-at-cap", "spec.json", "out", cwd=tmp_path), "run-at-cap")
    what = {
        "real": "holds a run (cuda backend)",
        "emulated": "holds a run (emulated backend)",
        "other": "is not empty",
    }
    assert f"out: OUTDIR {what[held]}: {', '.join(sorted(files))}; " in line, line
    assert {p.name: p.read_bytes() for p in out.iterdir()} == files


def test_run_at_cap_writes_into_an_empty_outdir(tmp_path, spec, run_cli):
    (tmp_path / "out").mkdir()
    (tmp_path / "spec.json").write_text(json.dumps(spec))
    assert run_cli("run-at-cap", "spec.json", "out", cwd=tmp_path).returncode == 0
    assert (tmp_path / "out" / "run.json").is_file()


def test_restore_caps_state_dir_a_file_is_one_line(tmp_path, run_cli):
    (tmp_path / "afile").write_text("x")
    line = one_line_error(
        run_cli("restore-caps", "--state-dir", "afile", cwd=tmp_path), "restore-caps"
    )
    assert line.endswith("afile: the state dir is a file, not a directory")


def test_restore_caps_missing_state_dir_has_nothing_to_restore(tmp_path, run_cli):
    proc = run_cli("restore-caps", "--state-dir", "nodir", cwd=tmp_path)
    assert proc.returncode == 0 and "nothing to restore" in proc.stdout


STATE_FILES = {
    "list": ("[1]", "a JSON object expected, found list"),
    "pid": ('{"pid": "x", "gpus": []}', "pid 'x' is not an integer"),
    "gpus": ('{"pid": 999999999, "gpus": "abc"}', "gpus is not a list"),
    "gpu entry": (
        '{"pid": 999999999, "gpus": [{"index": 0}]}',
        "lacks an integer index and a finite original_limit_w",
    ),
    "not JSON": ("{", "unreadable: "),
}


def test_restore_caps_bad_state_files_are_reported_each_and_others_go_on(tmp_path, run_cli):
    """A malformed state file is named with what is wrong (exit 1), never a traceback that
    would stop an epilog from restoring the other files."""
    sd = tmp_path / "sd"
    sd.mkdir()
    host = socket.gethostname()
    for i, (text, _) in enumerate(STATE_FILES.values()):
        (sd / f"caps-{host}-{i}.json").write_text(text)
    proc = run_cli("restore-caps", "--state-dir", "sd", "--dry-run", cwd=tmp_path)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr
    lines = proc.stdout.strip().splitlines()
    assert len(lines) == len(STATE_FILES)
    for i, (_, expected) in enumerate(STATE_FILES.values()):
        line = next(ln for ln in lines if ln.startswith(f"sd/caps-{host}-{i}.json: unreadable"))
        assert expected in line, line


# --- the readers of a run's files ---------------------------------------------------------


@pytest.fixture
def run_dir(tmp_path, spec) -> Path:
    from wattflex.runs.runner import run_at_cap

    return run_at_cap(spec, tmp_path / "results" / "t" / "runs" / "g" / "cap500")


def _files(d: Path) -> tuple[Path, Path, Path]:
    return d / "telemetry.parquet", d / "steps.parquet", d / "run.json"


def _drop_column(path: Path, column: str) -> None:
    import pyarrow.parquet as pq

    t = pq.read_table(path)
    pq.write_table(t.drop([column]).replace_schema_metadata(t.schema.metadata), path)


def _empty(path: Path) -> None:
    import pyarrow.parquet as pq

    t = pq.read_table(path)
    pq.write_table(t.slice(0, 0), path)


CORRUPT = {
    # name: (file, how, what the message says)
    "telemetry truncated": (
        "telemetry.parquet",
        lambda p: p.write_bytes(p.read_bytes()[:100]),
        "not a readable parquet file (",
    ),
    "telemetry text": (
        "telemetry.parquet",
        lambda p: p.write_text("hello"),
        "not a readable parquet file (",
    ),
    "telemetry empty file": (
        "telemetry.parquet",
        lambda p: p.write_bytes(b""),
        "not a readable parquet file (",
    ),
    "telemetry no power": (
        "telemetry.parquet",
        lambda p: _drop_column(p, "power_w"),
        "column(s) power_w missing",
    ),
    "telemetry no rows": ("telemetry.parquet", _empty, "no rows"),
    "steps truncated": (
        "steps.parquet",
        lambda p: p.write_bytes(p.read_bytes()[:-50]),
        "not a readable parquet file (",
    ),
    "steps no tokens": (
        "steps.parquet",
        lambda p: _drop_column(p, "tokens"),
        "column(s) tokens missing",
    ),
    "run.json truncated": (
        "run.json",
        lambda p: p.write_text(p.read_text()[:40]),
        "not a readable run record (",
    ),
    "run.json a list": (
        "run.json",
        lambda p: p.write_text("[]"),
        "not a run record (a JSON object expected, found list)",
    ),
    "run.json binary": (
        "run.json",
        lambda p: p.write_bytes(b"\xff\xfe\x00"),
        "not a readable run record (",
    ),
}


@pytest.mark.parametrize("case", CORRUPT, ids=list(CORRUPT))
def test_damaged_run_file_names_the_file_and_the_rerun(run_dir, case):
    name, damage, expected = CORRUPT[case]
    damage(run_dir / name)
    with pytest.raises(RunFileError) as err:
        read_run_files(*_files(run_dir))
    msg = str(err.value)
    assert "\n" not in msg
    assert msg.startswith(f"{run_dir / name}: {expected}"), msg
    assert msg.endswith(
        f"; redo that run alone: WATTFLEX_REDO_RUNS=g/cap500 snakemake --cores all --force "
        f"{run_dir / 'run.json'}"
    ), msg


def test_intact_run_files_read_back(run_dir):
    run, tel, steps = read_run_files(*_files(run_dir))
    assert run["run_id"] == "cap500" and len(tel) and len(steps)
