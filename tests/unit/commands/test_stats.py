"""``wattflex stats`` options checked where they are parsed."""

from tests.unit.test_cli_safety import STATS


def test_an_unknown_p_adjust_names_the_option_and_the_methods(tmp_path, run_cli):
    (tmp_path / "st.csv").write_text(STATS)
    proc = run_cli("stats", "st.csv", "--p-adjust", "bogus", cwd=tmp_path)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    line = proc.stderr.strip().splitlines()[-1]
    assert line.startswith(
        "wattflex stats: error: --p-adjust 'bogus': not a multiple-comparison method of statsmodels; "
        "one of b, s, h, hs, "
    ), line
    assert "fdr_bh" in line and "holm" in line, line
    for method in ("holm", "h", "HOLM", "fdr_i", "bonferroni"):
        assert run_cli("stats", "st.csv", "--p-adjust", method, cwd=tmp_path).returncode == 0, (
            method
        )
