"""Defaults are stated once, as ``default:`` in the config schema, and filled once when a config
is loaded (wattflex.config.prepare); names are checked against the registries that define them."""

import copy
from pathlib import Path

import pytest
import yaml

from wattflex.config import (
    ConfigError,
    defaulted_sections,
    fill_defaults,
    load_config,
    merge_config,
    prepare,
)

REPO = Path(__file__).resolve().parents[2]
SCHEMA = REPO / "config" / "schema" / "config.schema.yaml"


def bare() -> dict:
    """A campaign as --replace-workflow-config sees it: only what the user wrote."""
    return {
        "campaign": "bare",
        "cap_grids": {"four": [200, 500, 600, 700]},
        "groups": [{"id": "g", "model": "Qwen3-32B", "task": "pt", "gpus": 8, "cap_grid": "four"}],
    }


def schema_default(*path: str):
    node = yaml.safe_load(SCHEMA.read_text())
    for key in path:
        node = node["properties"][key]
    return node["default"]


def test_a_config_that_leaves_keys_out_gets_the_schemas_defaults():
    cfg = prepare(bare(), base=REPO)
    assert cfg["backend"] == schema_default("backend") == "emulated"
    assert cfg["sweep"] == "separate" and cfg["source"] == "generate" and cfg["seed"] == 0
    assert cfg["run"]["duration_s"] == schema_default("run", "duration_s") == 1800
    assert cfg["run"]["eval_at_s"] is None and cfg["run"]["retries"] == 1
    assert cfg["summary"] == {
        "aggregate": "top10",
        "top_fraction": 0.10,
        "train_util_threshold": 50,
        "warmup_fb_gib": 10,
    }
    assert cfg["pfi"]["mc_samples"] == 10000 and cfg["figures"]["dpi"] == 110
    assert cfg["cuda"]["cap_control"] == "nvml" and cfg["control"]["scenarios"] == {}


def test_given_keys_win_and_filling_twice_changes_nothing():
    raw = bare()
    raw["run"] = {"duration_s": 600}
    cfg = prepare(raw, base=REPO)
    assert cfg["run"]["duration_s"] == 600 and cfg["run"]["sample_period_s"] == 5
    again = copy.deepcopy(cfg)
    fill_defaults(again)
    assert again == cfg


def test_filled_defaults_are_copies_not_the_schemas_objects():
    a, b = prepare(bare(), base=REPO), prepare(bare(), base=REPO)
    a["stats"]["sets"].append("validation")
    a["control"]["scenarios"]["x"] = {}
    assert b["stats"]["sets"] == ["headline"] and b["control"]["scenarios"] == {}


def test_group_keys_default_in_group_defaults_so_group_defaults_still_apply():
    raw = bare()
    raw["group_defaults"] = {"gpu": "H100"}
    raw["groups"].append(
        {
            "id": "h",
            "model": "Qwen3-32B",
            "task": "pt",
            "gpus": 8,
            "cap_grid": "four",
            "gpu": "H200",
        }
    )
    cfg = prepare(raw, base=REPO)
    assert "gpu" not in cfg["groups"][0]  # the group itself is left as written
    assert cfg["group_defaults"]["set"] == "headline" and cfg["group_defaults"]["matches"] == ""
    from wattflex.config import groups

    assert [g["gpu"] for g in groups(cfg)] == ["H100", "H200"]


def test_an_ingested_campaign_is_filled_too_and_not_told_its_runs_keys_came_from_the_default(
    tmp_path,
):
    path = REPO / "config" / "zeus-nsdi23.yaml"
    cfg = load_config(path, base=REPO)
    assert cfg["source"] == "ingest" and cfg["summary"]["aggregate"] == "top10"
    assert (
        cfg["backend"] == "emulated" and cfg["run"]["duration_s"] == 1800
    )  # read by no ingest rule
    assert defaulted_sections(cfg, [path]) == []


def test_schema_defaults_are_not_reported_as_the_default_configs_sections(tmp_path):
    user = tmp_path / "mine.yaml"
    user.write_text(yaml.safe_dump(bare()))
    cfg = prepare(bare(), base=REPO)
    assert defaulted_sections(cfg, [user]) == []


def test_doctor_loads_a_configfile_as_snakemake_runs_it(tmp_path):
    """`wattflex doctor --configfile` (load_config onto_default): the default config's sections,
    then the schema's defaults: the config the workflow's rules see."""
    user = tmp_path / "mine.yaml"
    user.write_text(yaml.safe_dump({"campaign": "mine", "run": {"duration_s": 1500}}))
    doctor = load_config(user, base=REPO, onto_default=True)
    default = yaml.safe_load((REPO / "config" / "config.yaml").read_text())
    workflow = prepare(
        merge_config(default, {"campaign": "mine", "run": {"duration_s": 1500}}),
        base=REPO,
    )
    assert doctor == workflow
    assert (
        doctor["run"]["duration_s"] == 1500 and doctor["run"]["eval_at_s"] == 600
    )  # config.yaml's
    assert doctor["cuda"]["telemetry"] == "auto"  # the schema's


@pytest.mark.parametrize(
    "section, bad, known",
    [
        ("allocation", "pfi-awre", "equal-weight, pfi-aware, pfi-aware-measured"),
        (
            "control",
            "oracle",
            "equal-weight, pfi-aware, moe-ft-weighted, raw-dcgm, curve-aware, online-learning",
        ),
    ],
)
def test_policy_names_are_checked_against_the_registry(section, bad, known):
    raw = bare()
    raw[section] = {"policies": ["equal-weight", bad]}
    with pytest.raises(
        ConfigError,
        match=rf"^config error at {section}\.policies\[1\]: unknown .*policy "
        rf"'{bad}'; known: {known}",
    ):
        prepare(raw, base=REPO)


def test_dcgm_fields_are_checked_against_the_metric_registry():
    raw = bare()
    raw["cuda"] = {"dcgm": {"fields": [1005, 155]}}
    with pytest.raises(
        ConfigError,
        match=r"^config error at cuda\.dcgm\.fields\[1\]: unknown DCGM profiling "
        r"field 155; known: 203, 204, 1005, 1002, 1004$",
    ):
        prepare(raw, base=REPO)
