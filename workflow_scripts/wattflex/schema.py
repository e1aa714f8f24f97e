"""The campaign schema (``config/schema/config.schema.yaml``): reading it, and the defaults it states.

The schema is the one place a config key's default is stated (``default:``);
``wattflex.config.prepare`` fills them into every config it loads. The library's dataclasses
that a config section becomes (``telemetry.SummaryProtocol`` of ``summary:``,
``runs.sweep`` of ``staircase:``, ``allocation.settings`` of ``allocation:``, ``control`` of
``control.controller`` and ``control.cluster``) take their field defaults from here too
(:func:`section_defaults`), so a dataclass built without a config (the library API, the
tests) gets the values the workflow runs with.

Below ``wattflex.config`` (it needs no jsonschema): a module of any layer may import it.
"""

from __future__ import annotations

import copy
import functools
import os
import stat
from pathlib import Path
from typing import Any

import yaml

from wattflex.errors import ConfigError

REPO_ROOT = Path(__file__).resolve().parents[2]
SCHEMA_PATH = REPO_ROOT / "config" / "schema" / "config.schema.yaml"


class _UniqueKeyLoader(getattr(yaml, "CSafeLoader", yaml.SafeLoader)):
    """libyaml's safe loader where PyYAML has it (same documents as ``yaml.safe_load``, ~10x
    faster: the schema is read at every ``snakemake`` start) that refuses a key given twice
    in one mapping: YAML requires unique keys, PyYAML silently keeps the last one."""

    def construct_mapping(self, node, deep=False):
        if isinstance(node, yaml.MappingNode):
            first: dict[Any, int] = {}
            for key_node, _ in node.value:
                if key_node.tag == "tag:yaml.org,2002:merge":
                    continue  # `<<: *defaults`: keys given beside it override, by design
                key = self.construct_object(key_node, deep=True)
                line = key_node.start_mark.line + 1
                try:
                    if key in first:
                        raise DuplicateKeyError(
                            line,
                            f"key {key!r} given twice in one mapping (first at line "
                            f"{first[key]}); YAML keeps only the last: delete one",
                        )
                    first[key] = line
                except TypeError:  # an unhashable (complex) key: the constructor reports it
                    pass
        return super().construct_mapping(node, deep=deep)


class DuplicateKeyError(yaml.YAMLError):
    """A YAML mapping that names one key twice (YAML allows it, silently keeping the last); ``line``
    is the 1-based line of the second one.
    """

    def __init__(self, line: int, message: str):
        super().__init__(message)
        self.line, self.message = line, message


# The largest YAML document read (a config, a site file, the catalogue): far above any real
# one, and a bound on what a wrong path (/dev/zero, a huge log) can make the reader load.
MAX_YAML_BYTES = 64 * 2**20


def read_yaml(path: str | Path) -> Any:
    """A YAML file (UTF-8, a byte-order mark allowed) with unique keys; a file in another
    encoding or with a key given twice raises :class:`ConfigError` naming the file (and line),
    as does a path that is not a regular file (``/dev/zero`` was read for ever), a missing one,
    or one over ``MAX_YAML_BYTES``."""
    try:
        st = os.stat(path)
    except OSError as exc:
        raise ConfigError(f"{path}: cannot be read ({exc.strerror or exc})") from None
    if not stat.S_ISREG(st.st_mode):
        kind = "a folder" if stat.S_ISDIR(st.st_mode) else "not a regular file (a device or FIFO)"
        raise ConfigError(f"{path}: is {kind}: give a YAML file")
    if st.st_size > MAX_YAML_BYTES:
        raise ConfigError(
            f"{path}: is {st.st_size / 2**20:,.0f} MiB, over the {MAX_YAML_BYTES // 2**20} MiB "
            "of a YAML document: is it the right file?"
        )
    with open(path, "rb") as fh:
        raw = fh.read(MAX_YAML_BYTES + 1)
    try:
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        found = (
            "UTF-16 (it starts with a UTF-16 byte-order mark)"
            if raw[:2] in (b"\xff\xfe", b"\xfe\xff")
            else f"byte {raw[exc.start]:#04x} at offset {exc.start} is not UTF-8"
        )
        raise ConfigError(f"{path}: not UTF-8 text: {found}; save it as UTF-8") from None
    try:
        return yaml.load(text, Loader=_UniqueKeyLoader)
    except DuplicateKeyError as exc:
        raise ConfigError(f"{path}:{exc.line}: {exc.message}") from None


@functools.cache
def read_schema() -> dict[str, Any]:
    """The shipped schema, read once per process (the dataclasses' defaults and every
    ``prepare`` share it). Shared: read it, never change it."""
    return read_yaml(SCHEMA_PATH)


def defaults(node: dict[str, Any]) -> dict[str, Any]:
    """The ``default:`` of each property of the object schema ``node``, copied, as
    ``wattflex.config.fill_defaults`` fills them into an empty mapping: a property whose
    default is a mapping (``{}``) gets its own properties' defaults inside it."""
    out = {}
    for key, sub in node.get("properties", {}).items():
        if isinstance(sub, dict) and "default" in sub:
            value = copy.deepcopy(sub["default"])
            if isinstance(value, dict):
                value = {**defaults(sub), **value}
            out[key] = value
    return out


def section_defaults(*path: str, schema: dict[str, Any] | None = None) -> dict[str, Any]:
    """The defaults of the config section at ``path`` (``"control", "controller"``: the
    ``controller:`` mapping inside ``control:``; ``*`` any key of a mapping, as in ``"control",
    "scenarios", "*"``), from ``schema`` (default: the shipped one)."""
    node = read_schema() if schema is None else schema
    for key in path:
        node = node["additionalProperties"] if key == "*" else node["properties"][key]
    return defaults(node)


def group_default(key: str) -> Any:
    """A group key's default, as ``prepare`` fills it into ``group_defaults`` (and so into every
    group of a loaded config), for a group dict that did not come from ``wattflex.config.groups``
    (the library API, tests)."""
    return section_defaults("group_defaults")[key]
