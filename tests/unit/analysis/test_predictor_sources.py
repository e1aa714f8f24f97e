"""The predictor refuses a campaign whose runs mix telemetry sources unless told
(``predictor.telemetry_sources``, ``predictor.allow_mixed_sources``)."""

import pandas as pd
import pytest

from wattflex.analysis import predictor


def runs(*sources):
    return pd.DataFrame(
        {
            "group": [f"g{i}" for i in range(len(sources))],
            "cap_w": 700.0,
            "telemetry_source": list(sources),
        }
    )


def test_one_source_is_returned():
    assert predictor.telemetry_sources(runs("dcgm", "dcgm", "dcgm")) == ["dcgm"]


def test_mixed_sources_are_refused_naming_each_and_the_switch():
    with pytest.raises(
        ValueError,
        match=r"mix telemetry sources \(dcgm: 1 run\(s\), nvml: 2 run\(s\)\).*"
        r"predictor.allow_mixed_sources: true",
    ):
        predictor.telemetry_sources(runs("nvml", "dcgm", "nvml"))


def test_mixed_sources_are_fitted_when_allowed():
    assert predictor.telemetry_sources(runs("nvml", "dcgm"), allow_mixed=True) == ["dcgm", "nvml"]


def test_tables_without_the_column_are_not_checked():
    assert predictor.telemetry_sources(runs("nvml").drop(columns="telemetry_source")) == []


def test_fit_predictor_rule_script_fails_with_the_message_in_its_log(tmp_path):
    """The rule script (workflow_scripts/fit_predictor.py, run as Snakemake runs it: with a
    ``snakemake`` object) stops on a mixed campaign: exit 1, one line in its log, no model."""
    import subprocess
    import sys
    from pathlib import Path

    from wattflex.config import fill_defaults
    from wattflex.provenance import write_parquet

    repo = Path(__file__).resolve().parents[3]
    mixed = runs("nvml", "dcgm", "nvml").assign(backend="cuda")
    write_parquet(mixed, tmp_path / "runs.parquet")
    write_parquet(
        pd.DataFrame({"group": ["g0", "g1", "g2"], "pfi_ratio": [1.2, 1.5, 1.8]}),
        tmp_path / "pfi.parquet",
    )
    # the rule's params.predictor: the prepared config's section (the schema's defaults filled in)
    predictor_section = {"campaign": "t", "predictor": {"features": "dram_copy_product"}}
    fill_defaults(predictor_section)
    code = f"""
import runpy, types
ns = types.SimpleNamespace
smk = ns(input=ns(runs={str(tmp_path / "runs.parquet")!r}, pfi={str(tmp_path / "pfi.parquet")!r}),
         params=ns(predictor={predictor_section["predictor"]!r}, paper_tables="resources/paper"),
         output=ns(model={str(tmp_path / "model.json")!r}), log=[{str(tmp_path / "fit.log")!r}],
         scriptdir={str(repo / "workflow_scripts")!r})
runpy.run_path({str(repo / "workflow_scripts" / "fit_predictor.py")!r}, init_globals={{"snakemake": smk}})
"""
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    log = (tmp_path / "fit.log").read_text()
    assert proc.returncode == 1, proc.stderr
    assert (
        "ERROR runs.parquet: the campaign's runs mix telemetry sources (dcgm: 1 run(s), nvml: 2 run(s))"
        in log
    )
    assert "Traceback" not in log and not (tmp_path / "model.json").exists()
