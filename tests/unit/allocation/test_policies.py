"""The policy registry (wattflex.policies) is the single source of policy names:
config validation (wattflex.config.check_names), the CLI and the controller use it; it stays light enough for
``wattflex --help``; and the allocation/control packages never draw figures."""

import argparse
import os
import subprocess
import sys

from wattflex import cli
from wattflex.policies import (
    CLUSTER_REFERENCES,
    CONTROL_POLICIES,
    CURVE_POLICIES,
    POLICIES,
    POLICY_FEATURES,
    REGISTRY,
    WEIGHTED_POLICIES,
)


def test_derived_tuples_are_views_of_the_registry():
    assert POLICIES == tuple(n for n, p in REGISTRY.items() if p.allocation)
    assert WEIGHTED_POLICIES == tuple(n for n in POLICIES if REGISTRY[n].weighted)
    assert set(POLICIES) - set(WEIGHTED_POLICIES) == {"curve-aware", "oracle"}
    assert CONTROL_POLICIES == tuple(n for n, p in REGISTRY.items() if p.control)
    assert CURVE_POLICIES == ("curve-aware", "online-learning")
    assert CLUSTER_REFERENCES == ("oracle", "uncapped")
    assert POLICY_FEATURES == {n: REGISTRY[n].feature for n in POLICIES if REGISTRY[n].feature}
    assert all(name == p.name for name, p in REGISTRY.items())


def _policy_choices(command):
    parser = cli.build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return tuple(next(a for a in sub.choices[command]._actions if a.dest == "policy").choices)


def test_cli_policy_choices_are_the_registry():
    assert _policy_choices("allocate") == POLICIES
    assert _policy_choices("control") == CONTROL_POLICIES


def test_registry_and_policy_commands_import_no_numpy_or_pandas(repo):
    code = (
        "import sys, wattflex.policies, wattflex.commands.allocate, wattflex.commands.control; "
        "heavy = sorted(m for m in ('numpy', 'pandas', 'matplotlib') if m in sys.modules); "
        "assert not heavy, heavy"
    )
    env = {**os.environ, "PYTHONPATH": str(repo / "workflow_scripts")}
    res = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60
    )
    assert res.returncode == 0, res.stderr


def test_every_policy_carries_its_look_and_the_figures_read_it():
    # one place per policy: its look is an attribute of the registry's object
    from wattflex.plots.style import UNKNOWN_POLICY_LOOK, policy_look

    for name, policy in REGISTRY.items():
        assert policy.look.color.startswith("#") and policy.look.label
        assert policy_look(name) is policy.look
    assert policy_look("a real controller's record") == UNKNOWN_POLICY_LOOK
