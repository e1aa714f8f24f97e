"""No command destroys an input or writes into a link/device/folder, and bad values
or files stop with one message naming the file (and line), exit status 2, no traceback."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pandas as pd
import pytest

from wattflex.analysis import predictor as pr
from wattflex.cli import main
from wattflex.provenance import (
    OutputPathError,
    check_outputs,
    check_writable,
    provenance,
    write_csv,
    write_json,
    write_parquet,
)

SWEEPS = "group,cap_w,power_w,throughput\n" + "".join(
    f"{g},{c},{p},{t}\n"
    for g, rows in {
        "a": [(300, 290, 80), (400, 380, 95), (500, 450, 100)],
        "b": [(300, 280, 50), (400, 350, 70), (500, 420, 90)],
    }.items()
    for c, p, t in rows
)
STATS = "group,cluster,pfi_ratio\ng1,dense,1.2\ng2,dense,1.4\ng3,moe-pt,2.0\ng4,moe-pt,2.5\ng5,moe-ft,3.0\ng6,moe-ft,3.3\n"
JOBS = "job,dram_active,mem_copy_util\na,0.1,10\nb,0.4,30\n"
ALLOC = (
    "job,power_w,throughput\nj1,300,80\nj1,400,95\nj1,500,100\nj2,300,50\nj2,400,70\nj2,500,90\n"
)


def _model(tmp_path):
    rng = np.random.default_rng(0)
    groups = pd.DataFrame({"dram_copy_product": rng.uniform(1, 30, 8)})
    groups["pfi"] = groups["pfi_ratio"] = (
        0.5 + 0.05 * groups["dram_copy_product"] + rng.normal(0, 0.01, 8)
    )
    groups["cluster"] = ["dense"] * 4 + ["moe-pt"] * 4
    groups["set"] = "headline"
    groups["group"] = [f"g{i}" for i in range(8)]
    model = pr.fit_model(groups, "dram_copy_product")
    write_json(model, tmp_path / "m.json", provenance(params={}))
    return tmp_path / "m.json"


def _inputs(tmp_path):
    (tmp_path / "sw.csv").write_text(SWEEPS)
    (tmp_path / "st.csv").write_text(STATS)
    (tmp_path / "jobs.csv").write_text(JOBS)
    (tmp_path / "cv.csv").write_text(ALLOC)
    return _model(tmp_path)


def _fails(capsys, argv, *needles):
    assert main([str(a) for a in argv]) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err
    for n in needles:
        assert n in err, err
    return err


# --- case 3: output equal to an input ---------------------------------------------------


@pytest.mark.parametrize(
    "argv,victim",
    [
        (["pfi", "{d}/sw.csv", "-o", "{d}/sw.csv"], "sw.csv"),
        (["pfi", "{d}/sw.csv", "-o", "{d}/sub/../sw.csv"], "sw.csv"),
        (["stats", "{d}/st.csv", "-o", "{d}/st.csv"], "st.csv"),
        (["predict", "{d}/jobs.csv", "--model", "{d}/m.json", "-o", "{d}/m.json"], "m.json"),
        (["predict", "{d}/jobs.csv", "--model", "{d}/m.json", "-o", "{d}/jobs.csv"], "jobs.csv"),
        (["ingest", "sweep-table", "{d}/sw.csv", "-o", "{d}/sw.csv"], "sw.csv"),
        (
            ["ingest", "sweep-table", "{d}/sw.csv", "-o", "{d}/r.parquet", "--pfi", "{d}/sw.csv"],
            "sw.csv",
        ),
        (["ingest", "sweep-table", "{d}", "-o", "{d}/sw.csv"], "sw.csv"),
    ],
)
def test_output_equal_to_input_is_refused(tmp_path, capsys, argv, victim):
    _inputs(tmp_path)
    (tmp_path / "sub").mkdir()
    before = (tmp_path / victim).read_bytes()
    _fails(
        capsys, [a.format(d=tmp_path) for a in argv], "is the input", "choose another output path"
    )
    assert (tmp_path / victim).read_bytes() == before


def test_output_hard_link_to_input_is_refused(tmp_path, capsys):
    _inputs(tmp_path)
    os.link(tmp_path / "st.csv", tmp_path / "hard.json")
    _fails(capsys, ["stats", tmp_path / "st.csv", "-o", tmp_path / "hard.json"], "is the input")
    assert (tmp_path / "st.csv").read_text() == STATS


def test_allocate_output_equal_to_input_is_refused(tmp_path, capsys):
    _inputs(tmp_path)
    rc = main(
        ["allocate", str(tmp_path / "cv.csv"), "--cut", "0.2", "-o", str(tmp_path / "cv.csv")]
    )
    err = capsys.readouterr().err
    if "is the input" not in err:
        pytest.skip("wattflex allocate does not call check_outputs yet")
    assert rc == 2 and (tmp_path / "cv.csv").read_text() == ALLOC


# --- case 3: folders, links, special files ----------------------------------------------


def test_output_folder_symlink_and_fifo_are_refused(tmp_path, capsys):
    _inputs(tmp_path)
    (tmp_path / "dir").mkdir()
    _fails(capsys, ["pfi", tmp_path / "sw.csv", "-o", tmp_path / "dir"], "is a folder")
    _fails(capsys, ["stats", tmp_path / "st.csv", "-o", tmp_path / "dir"], "is a folder")
    (tmp_path / "target.json").write_text("keep")
    os.symlink(tmp_path / "target.json", tmp_path / "link.json")
    _fails(capsys, ["stats", tmp_path / "st.csv", "-o", tmp_path / "link.json"], "symbolic link")
    assert (tmp_path / "link.json").is_symlink() and (
        tmp_path / "target.json"
    ).read_text() == "keep"
    os.mkfifo(tmp_path / "fifo")
    _fails(capsys, ["stats", tmp_path / "st.csv", "-o", tmp_path / "fifo"], "not a regular file")
    _fails(capsys, ["pfi", tmp_path / "sw.csv", "-o", tmp_path / "fifo"], "not a regular file")
    assert (tmp_path / "fifo").is_fifo()


def test_writers_refuse_devices_links_and_folders(tmp_path):
    df = pd.DataFrame({"a": [1]})
    with pytest.raises(OutputPathError, match="not a regular file"):
        check_writable("/dev/null")  # checked only: nothing is written
    (tmp_path / "t.csv").write_text("keep")
    os.symlink(tmp_path / "t.csv", tmp_path / "l.csv")
    os.mkfifo(tmp_path / "p.json")
    for write, path in [
        (lambda p: write_json({}, p), tmp_path / "l.csv"),
        (lambda p: write_csv(df, p), tmp_path / "l.csv"),
        (lambda p: write_parquet(df, p), tmp_path / "l.csv"),
        (lambda p: write_json({}, p), tmp_path / "p.json"),
        (lambda p: write_csv(df, p), tmp_path),
        (lambda p: write_json({}, p), tmp_path),
    ]:
        with pytest.raises(OutputPathError):
            write(path)
    (tmp_path / "x.csv.meta.json").mkdir()
    with pytest.raises(OutputPathError):
        write_csv(df, tmp_path / "x.csv")  # the sidecar is checked before the CSV is written
    assert not (tmp_path / "x.csv").exists()
    assert (tmp_path / "t.csv").read_text() == "keep" and (tmp_path / "p.json").is_fifo()


def test_writers_are_atomic_and_keep_permissions(tmp_path):
    df = pd.DataFrame({"a": [1, 2]})
    write_csv(df, tmp_path / "o.csv")
    os.chmod(tmp_path / "o.csv", 0o640)
    write_csv(pd.DataFrame({"a": [3]}), tmp_path / "o.csv")
    assert (tmp_path / "o.csv").stat().st_mode & 0o777 == 0o640
    assert pd.read_csv(tmp_path / "o.csv")["a"].tolist() == [3]
    write_parquet(df, tmp_path / "o.parquet")
    write_json({"k": 1}, tmp_path / "o.json")
    umask = os.umask(0)
    os.umask(umask)
    assert (tmp_path / "o.json").stat().st_mode & 0o777 == 0o666 & ~umask
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "o.csv",
        "o.csv.meta.json",
        "o.json",
        "o.parquet",
    ]

    class Boom(Exception):
        pass

    bad = pd.DataFrame({"a": [1]})
    bad.to_csv = lambda *a, **k: (_ for _ in ()).throw(Boom())  # a write that fails halfway
    with pytest.raises(Boom):
        write_csv(bad, tmp_path / "o.csv")
    assert pd.read_csv(tmp_path / "o.csv")["a"].tolist() == [3]  # the old file is intact
    assert not [p for p in tmp_path.iterdir() if p.name.endswith(".tmp")]


def test_check_outputs_refuses_the_same_output_twice(tmp_path):
    with pytest.raises(OutputPathError, match="given twice"):
        check_outputs([tmp_path / "a.csv", tmp_path / "." / "a.csv"], [])
    check_outputs([None, tmp_path / "a.csv"], [None, tmp_path / "b.csv"])


# --- case 5: pfi's dropped rows, stats' and predict's values ----------------------------


def test_pfi_reports_dropped_rows(tmp_path, capsys):
    (tmp_path / "sw.csv").write_text(SWEEPS + "a,450,-3,99\nb,450,400,inf\n")
    assert main(["pfi", str(tmp_path / "sw.csv"), "--mc-samples", "0"]) == 0
    out = capsys.readouterr().out
    assert "note: left out 2 bad row(s)" in out and "invalid_values" in out
    assert "sw.csv line 8: power_w -3 is not a finite positive number" in out
    assert "sw.csv line 9: throughput inf is not a finite positive number" in out
    assert (
        main(["pfi", str(tmp_path / "sw.csv"), "--mc-samples", "0", "-o", str(tmp_path / "o.csv")])
        == 0
    )
    assert "sw.csv line 8" in capsys.readouterr().out
    (tmp_path / "ok.csv").write_text(SWEEPS)
    assert main(["pfi", str(tmp_path / "ok.csv"), "--mc-samples", "0"]) == 0
    assert "left out" not in capsys.readouterr().out


@pytest.mark.parametrize(
    "edit,extra,needles",
    [
        (
            ("g4,moe-pt,2.5", "g4,moe-pt,inf"),
            [],
            ["st.csv line 5: pfi_ratio inf is not a finite number"],
        ),
        (("g4,moe-pt,2.5", "g4,moe-pt,-inf"), [], ["line 5", "not a finite number"]),
        (
            ("g4,moe-pt,2.5", "g1,moe-pt,2.5"),
            [],
            ["'g1': st.csv line 2, st.csv line 5", "one row per group"],
        ),
        (None, ["--alpha", "5"], ["--alpha 5 is not a significance level in (0, 1)"]),
        (None, ["--alpha", "0"], ["--alpha 0 is not"]),
        (None, ["--alpha", "nan"], ["--alpha nan is not"]),
    ],
)
def test_stats_refuses_bad_values(tmp_path, capsys, edit, extra, needles):
    text = STATS.replace(*edit) if edit else STATS
    (tmp_path / "st.csv").write_text(text)
    _fails(capsys, ["stats", tmp_path / "st.csv", *extra], *needles)


def test_stats_still_runs_on_good_input(tmp_path, capsys):
    (tmp_path / "st.csv").write_text(STATS)
    assert (
        main(["stats", str(tmp_path / "st.csv"), "--alpha", "0.1", "-o", str(tmp_path / "o.json")])
        == 0
    )
    assert json.loads((tmp_path / "o.json").read_text())["kruskal"]["n"] == 6


@pytest.mark.parametrize(
    "jobs,needles",
    [
        (
            "job,dram_active,mem_copy_util\na,8.8,10\n",
            [
                "jobs.csv line 2: dram_active 8.8 is outside its range 0-1",
                "looks like percent, divide by 100",
            ],
        ),
        (
            "job,dram_active,mem_copy_util\na,0.1,10\nb,92.5,30\n",
            ["jobs.csv line 3", "divide by 100"],
        ),
        ("job,dram_active,mem_copy_util\na,250,10\n", ["dram_active 250 is outside its range 0-1"]),
        (
            "job,dram_active,mem_copy_util\na,inf,10\n",
            ["jobs.csv line 2: dram_active inf is not a finite number"],
        ),
        (
            "job,dram_active,mem_copy_util\na,0.2,-5\n",
            ["jobs.csv line 2: mem_copy_util -5 is negative"],
        ),
        (
            "job,dram_active,mem_copy_util\na,0.2,150\n",
            ["mem_copy_util 150 is outside its range 0-100"],
        ),
        ("job,dram_copy_product\na,-1\n", ["dram_copy_product -1 is negative"]),
        (
            "job,dram_active,mem_copy_util\na,0.2,lots\n",
            ["jobs.csv line 2: mem_copy_util is not a number"],
        ),
    ],
)
def test_predict_refuses_out_of_range_inputs(tmp_path, capsys, jobs, needles):
    model = _model(tmp_path)
    (tmp_path / "jobs.csv").write_text(jobs)
    _fails(capsys, ["predict", tmp_path / "jobs.csv", "--model", model], *needles)


def test_predict_good_input_and_percent_hint_absent_above_100(tmp_path, capsys):
    model = _model(tmp_path)
    (tmp_path / "jobs.csv").write_text(JOBS)
    assert (
        main(
            [
                "predict",
                str(tmp_path / "jobs.csv"),
                "--model",
                str(model),
                "-o",
                str(tmp_path / "p.csv"),
            ]
        )
        == 0
    )
    assert np.isfinite(pd.read_csv(tmp_path / "p.csv")["pfi_pred"]).all()
    assert pr.input_problems(
        pd.DataFrame({"sm_active": [101.0], "temp_c": [-5.0]}), ["sm_active", "temp_c"]
    ) == [(0, "sm_active 101 is outside its range 0-1 (a fraction)")]


# --- case 7: a bad model or a corrupt parquet names the file ------------------------------


@pytest.mark.parametrize(
    "content,needle",
    [
        ("not json at all", "not a JSON file"),
        ('{"schema_version": "1.0", "hello": 1}', "not a wattflex predictor model (no 'features'"),
        ("[1, 2]", "not a wattflex predictor model (a JSON list"),
        ("group,cap_w\n", "not a JSON file"),
        (b"\xff\xfe\x00garbage", "not UTF-8 text"),
    ],
)
def test_predict_bad_model_names_the_file(tmp_path, capsys, content, needle):
    (tmp_path / "jobs.csv").write_text(JOBS)
    path = tmp_path / "bad.json"
    path.write_bytes(content if isinstance(content, bytes) else content.encode())
    err = _fails(capsys, ["predict", tmp_path / "jobs.csv", "--model", path], needle, str(path))
    assert len(err.strip().splitlines()) == 1


def test_predict_missing_model(tmp_path, capsys):
    (tmp_path / "jobs.csv").write_text(JOBS)
    _fails(
        capsys,
        ["predict", tmp_path / "jobs.csv", "--model", tmp_path / "none.json"],
        "none.json: no such file",
    )


@pytest.mark.parametrize("make", ["garbage", "truncated"])
@pytest.mark.parametrize(
    "argv",
    [
        ["pfi", "{p}"],
        ["ingest", "sweep-table", "{p}", "-o", "{d}/r.parquet"],
        ["stats", "{p}"],
        ["predict", "{p}", "--model", "{d}/m.json"],
    ],
)
def test_corrupt_parquet_names_the_file(tmp_path, capsys, make, argv):
    _model(tmp_path)
    p = tmp_path / "bad.parquet"
    if make == "garbage":
        p.write_bytes(b"this is not parquet at all")
    else:
        pd.read_csv(pd.io.common.StringIO(SWEEPS)).to_parquet(p)
        data = p.read_bytes()
        p.write_bytes(data[:20] + data[-12:])
    _fails(capsys, [a.format(p=p, d=tmp_path) for a in argv], "bad.parquet")


def test_cli_subprocess_one_line_no_traceback(tmp_path):
    model = _model(tmp_path)
    (tmp_path / "jobs.csv").write_text(JOBS)
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "wattflex.cli",
            "predict",
            str(tmp_path / "jobs.csv"),
            "--model",
            str(model),
            "-o",
            str(model),
        ],
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert proc.stderr.strip().splitlines() == [
        f"wattflex predict: error: {model}: output is the input {model}; writing it would destroy the input: "
        "choose another output path"
    ]
    assert json.loads(model.read_text())["features"] == ["dram_copy_product"]
