"""The schema is the one source of defaults (wattflex.schema): the dataclasses a config section
becomes take their field defaults from it, and a group without compile / grad_checkpointing
gets the schema's group default wherever it is read."""

from dataclasses import fields

import pytest

from tests.unit.test_config_defaults import REPO, bare
from wattflex.allocation.settings import SimulationConfig, flatten
from wattflex.config import groups, prepare
from wattflex.ops.clustersim import ClusterConfig
from wattflex.ops.controller import ControlConfig
from wattflex.runs.sweep.steady import SteadyCriteria, SweepSettings
from wattflex.schema import defaults, group_default, read_schema, section_defaults
from wattflex.telemetry import SummaryProtocol

TINY = {
    "type": "object",
    "properties": {
        "a": {"type": "integer", "default": 1},
        "no_default": {"type": "string"},
        "listed": {"type": "array", "default": [1, 2]},
        "nested": {
            "type": "object",
            "default": {},
            "properties": {"x": {"default": 0.5}, "y": {"type": "number"}},
        },
        "given": {
            "type": "object",
            "default": {"x": 7},
            "properties": {"x": {"default": 0}, "z": {"default": 3}},
        },
        "sub": {
            "type": "object",
            "properties": {"deep": {"type": "object", "properties": {"k": {"default": "v"}}}},
        },
    },
}


def test_defaults_are_each_propertys_default_as_filling_an_empty_mapping_sets_them():
    assert defaults(TINY) == {
        "a": 1,
        "listed": [1, 2],
        "nested": {"x": 0.5},
        "given": {"x": 7, "z": 3},
    }
    assert section_defaults("sub", "deep", schema=TINY) == {"k": "v"}
    assert section_defaults("sub", schema=TINY) == {}  # no default: {} of its own, nothing filled


def test_defaults_are_copies_not_the_schemas_objects():
    first = defaults(TINY)
    first["listed"].append(3)
    first["nested"]["x"] = 9
    assert defaults(TINY) == {
        "a": 1,
        "listed": [1, 2],
        "nested": {"x": 0.5},
        "given": {"x": 7, "z": 3},
    }


def test_prepare_fills_what_section_defaults_says():
    # the helper mirrors fill_defaults: an empty section is filled with exactly these values
    cfg = prepare(bare(), base=REPO)
    for path in (
        ("summary",),
        ("staircase",),
        ("allocation",),
        ("control", "controller"),
        ("control", "cluster"),
    ):
        section = cfg
        for key in path:
            section = section[key]
        assert section == section_defaults(*path), path


def field_defaults(cls) -> dict:
    return {
        f.name: f.default_factory() if callable(f.default_factory) else f.default
        for f in fields(cls)
    }


@pytest.mark.parametrize(
    "cls, schema",
    [
        (SummaryProtocol, lambda: section_defaults("summary")),
        (
            SteadyCriteria,
            lambda: {
                k: v
                for k, v in section_defaults("staircase").items()
                if k in SteadyCriteria.__dataclass_fields__
            },
        ),
        (
            SweepSettings,
            lambda: {
                k: v
                for k, v in section_defaults("staircase").items()
                if k in SweepSettings.__dataclass_fields__
            },
        ),
        (
            ControlConfig,
            lambda: {
                **section_defaults("control", "controller"),
                "cap_step_w": section_defaults("control")["cap_step_w"],
            },
        ),
        (
            ClusterConfig,
            lambda: ClusterConfig.from_dict(section_defaults("control", "cluster")).__dict__,
        ),
        # policies: every registered one, the registry's (the schema keeps no copy of it)
        (
            SimulationConfig,
            lambda: {
                **flatten(section_defaults("allocation")),
                "policies": SimulationConfig.__dataclass_fields__["policies"].default_factory(),
            },
        ),
    ],
)
def test_every_dataclass_field_defaults_to_the_schemas_default(cls, schema):
    assert field_defaults(cls) == schema()


def test_the_staircase_section_is_the_two_dataclasses_and_nothing_else():
    keys = set(read_schema()["properties"]["staircase"]["properties"])
    assert keys == set(SteadyCriteria.__dataclass_fields__) | set(
        SweepSettings.__dataclass_fields__
    )


def test_every_group_of_a_loaded_config_has_compile_and_grad_checkpointing():
    raw = bare()
    raw["groups"].append({**raw["groups"][0], "id": "h", "compile": False})
    gs = groups(prepare(raw, base=REPO))
    assert [(g["compile"], g["grad_checkpointing"]) for g in gs] == [
        (group_default("compile"), group_default("grad_checkpointing")),
        (False, group_default("grad_checkpointing")),
    ]
