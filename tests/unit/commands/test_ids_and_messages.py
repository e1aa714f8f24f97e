"""Issue 47, "Reliability classes": group ids are text everywhere, and messages say what is
wrong. ``pfi`` merged groups ``01`` and ``1`` (its reader typed the column as numbers), as did
cluster-control's runs CSV; a blank after a comma in a schedule's header gave "unknown key(s)
start_s ... (known: ... start_s ...)"; a file name that is not UTF-8 failed with a bare codec
error, as did a schedule, signal or knob choice whose content is not UTF-8."""

from __future__ import annotations

import os

import pytest

from wattflex.errors import UserError
from wattflex.ops.adapters.slurm import read_group_curves
from wattflex.ops.adapters.slurm_knobs import read_choice
from wattflex.ops.events import ScheduleError, read_schedule, read_signal

SWEEP = "{g},300,290,{t}\n{g},400,380,95\n{g},500,450,100\n"
TWO_GROUPS = (
    "group,cap_w,power_w,throughput\n" + SWEEP.format(g="01", t=80) + SWEEP.format(g="1", t=60)
)


def test_pfi_keeps_groups_01_and_1_apart(tmp_path, run_cli):
    """Before: one group '1' (the two groups' points pooled), exit 0."""
    (tmp_path / "g.csv").write_text(TWO_GROUPS)
    proc = run_cli("pfi", "g.csv", "--mc-samples", "0", "-o", "out.csv", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    import pandas as pd

    out = pd.read_csv(tmp_path / "out.csv", dtype={"group": str}).set_index("group")
    assert sorted(out.index) == ["01", "1"] and (out["n_caps"] == 3).all()
    assert out.loc["01", "pfi_ratio"] != out.loc["1", "pfi_ratio"]


def test_cluster_control_runs_csv_keeps_groups_01_and_1_apart(tmp_path):
    rows = ["group,cap_w,power_w,tokens_per_s,gpus"]
    rows += [
        f"{g},{c},{p},{t},1"
        for g, k in (("01", 0), ("1", 20))
        for c, p, t in ((300, 290, 80 - k), (500, 450, 100))
    ]
    (tmp_path / "runs.csv").write_text("\n".join(rows) + "\n")
    curves = read_group_curves(tmp_path / "runs.csv")
    assert sorted(curves.groups) == ["01", "1"]


def test_a_blank_after_a_comma_in_a_schedule_header_is_no_unknown_key(tmp_path):
    """Before: "unknown key(s)  end_s,  start_s,  target_kw (known: ... start_s ...)"."""
    (tmp_path / "s.csv").write_text("event_id, start_s, end_s, target_kw\ne1, 0, 5, 1\n")
    (event,) = read_schedule(tmp_path / "s.csv").events
    assert (event.start_s, event.end_s, event.target_w) == (0.0, 5.0, 1000.0)


def test_a_json_key_with_a_blank_is_named_with_its_blank(tmp_path):
    (tmp_path / "s.json").write_text('{"events": [{"start_s ": 0, "end_s": 5, "target_kw": 1}]}')
    with pytest.raises(ScheduleError, match=r"'start_s ' have blanks around them: write 'start_s'"):
        read_schedule(tmp_path / "s.json")


def test_a_file_name_that_is_not_utf8_is_read_and_named(tmp_path, run_cli):
    """Before: "'utf-8' codec can't encode character '\\udce9' in position 3", no file named."""
    name = os.fsdecode(b"caf\xe9.csv")
    (tmp_path / name).write_text(TWO_GROUPS)
    proc = run_cli("pfi", name, "--mc-samples", "0", cwd=tmp_path)
    assert proc.returncode == 0 and "01" in proc.stdout, proc.stderr
    # a bad row is named by the file, its byte escaped
    (tmp_path / name).write_text(TWO_GROUPS + "1,600,abc,1\n")
    proc = run_cli("stats", name, "--group-col", "group", "--value-col", "power_w", cwd=tmp_path)
    assert proc.returncode == 2 and "caf\\xe9.csv line" in proc.stderr, proc.stderr


@pytest.mark.parametrize(
    ("read", "name", "body", "role"),
    [
        (read_schedule, "s.csv", b"event_id,start_s,end_s,target_kw\ncaf\xe9,0,5,1\n", "schedule"),
        (read_signal, "sig.csv", b"time_s,fraction\n0,0.5\xe9\n", "signal"),
        (read_choice, "k.csv", b"job,knob\ncaf\xe9,cap\n", "knob choice"),
        (read_group_curves, "r.csv", b"group,cap_w\ncaf\xe9,300\n", "--curves"),
    ],
)
def test_content_that_is_not_utf8_names_the_file(tmp_path, read, name, body, role):
    """Before: "'utf-8' codec can't decode byte 0xe9 in position 3", no file named."""
    (tmp_path / name).write_bytes(body)
    with pytest.raises((ValueError, UserError)) as info:
        read(tmp_path / name)
    message = str(info.value)
    assert f"{role} {tmp_path / name}: not UTF-8 text" in message, message
