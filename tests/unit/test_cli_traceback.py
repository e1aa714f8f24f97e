"""An error is one line (docs/cli.md); WATTFLEX_TRACEBACK=1 adds the traceback above it, for the
error whose line names nothing the user gave (a bug to report)."""

BAD = "group,cap_w,power_w,throughput\na,300,abc,80\na,400,380,95\n"


def test_an_error_is_one_line_without_a_traceback(run_cli, tmp_path, monkeypatch):
    (tmp_path / "bad.csv").write_text(BAD)
    monkeypatch.delenv("WATTFLEX_TRACEBACK", raising=False)
    r = run_cli("pfi", "bad.csv", cwd=tmp_path)
    assert r.returncode == 2
    assert r.stderr.splitlines() == [
        "wattflex pfi: error: 1 bad row(s): bad.csv line 2: power_w is not a number: 'abc'"
    ]


def test_wattflex_traceback_prints_where_the_error_came_from_above_the_line(
    run_cli, tmp_path, monkeypatch
):
    (tmp_path / "bad.csv").write_text(BAD)
    monkeypatch.setenv("WATTFLEX_TRACEBACK", "1")
    r = run_cli("pfi", "bad.csv", cwd=tmp_path)
    lines = r.stderr.splitlines()
    assert r.returncode == 2 and lines[0] == "Traceback (most recent call last):"
    assert any("wattflex/ingest/reader.py" in line for line in lines)  # the frame that refused it
    assert lines[-1].startswith("wattflex pfi: error: 1 bad row(s)")


def test_wattflex_traceback_0_is_off(run_cli, tmp_path, monkeypatch):
    (tmp_path / "bad.csv").write_text(BAD)
    monkeypatch.setenv("WATTFLEX_TRACEBACK", "0")
    assert "Traceback" not in run_cli("pfi", "bad.csv", cwd=tmp_path).stderr
