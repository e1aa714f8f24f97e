"""The same input, the same verdict: `wattflex pfi` and `wattflex ingest
sweep-table` read a sweep table with one reader and one set of rules, so each input gets the
same verdict from both, with one message per problem (not one per row)."""

import pandas as pd
import pytest

from wattflex import cli

CAPS = [200.0, 400.0, 700.0]


def sweep(group="g", caps=CAPS, power=(1500.0, 3000.0, 5400.0), throughput=(60.0, 85.0, 100.0)):
    return pd.DataFrame(
        {"group": group, "cap_w": caps, "power_w": power, "throughput": throughput, "gpus": 8}
    )


def both(tmp_path, capsys, df):
    """(exit code, output) of pfi and of ingest on the same CSV."""
    src = tmp_path / "sweeps.csv"
    df.to_csv(src, index=False)
    out = {}
    for name, argv in {
        "pfi": ["pfi", str(src), "-o", str(tmp_path / "pfi.csv"), "--mc-samples", "0"],
        "ingest": [
            "ingest",
            "sweep-table",
            str(src),
            "-o",
            str(tmp_path / "runs.csv"),
            "--on-bad-rows",
            "skip",
        ],
    }.items():
        try:
            code = cli.main(argv)
        except SystemExit as exc:
            code = exc.code
        cap = capsys.readouterr()
        out[name] = (code, cap.out + cap.err)
    return out


def test_caps_in_kw_are_left_out_by_both_with_the_units_hint(tmp_path, capsys):
    df = pd.concat([sweep("watts"), sweep("kilowatts", caps=[0.2, 0.4, 0.7])], ignore_index=True)
    out = both(tmp_path, capsys, df)
    for name, (code, text) in out.items():
        assert code == 0, (name, text)
        assert "per GPU, in W" in text, (name, text)
    pfi = pd.read_csv(tmp_path / "pfi.csv").set_index("group")
    runs = pd.read_csv(tmp_path / "runs.csv")
    assert pfi.loc["watts", "status"] == "ok" and pfi.loc["kilowatts", "status"] == "too_few_caps"
    assert set(runs.group) == {"watts"}  # ingest skipped the same rows


def test_a_table_with_no_valid_row_is_an_error_for_both(tmp_path, capsys):
    df = sweep(power=(-1.0, -2.0, -3.0))
    for name, (code, text) in both(tmp_path, capsys, df).items():
        assert code == 2, (name, text)
        assert "Traceback" not in text


@pytest.mark.parametrize("group", ["meta-llama/Llama-3.1-8B", "org/model:fp8@a100"])
def test_group_names_with_a_slash_are_accepted_by_both(tmp_path, capsys, group):
    out = both(tmp_path, capsys, sweep(group))
    for name, (code, text) in out.items():
        assert code == 0 and "rejected" not in text.replace("0 row(s) rejected", ""), (name, text)
    assert pd.read_csv(tmp_path / "pfi.csv").group.tolist() == [group]
    assert set(pd.read_csv(tmp_path / "runs.csv").group) == {group}
