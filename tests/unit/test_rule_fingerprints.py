"""Every rule's params carry a fingerprint of the library code its script imports, derived
from the script's import closure (wattflex.fingerprint), so a code change reruns the rules
that use it and nothing else: Snakemake itself only tracks the rule script."""

import re
import textwrap
from pathlib import Path

import pytest

from wattflex import fingerprint as fp

REPO = Path(__file__).resolve().parents[2]
SCRIPTS = REPO / "workflow_scripts"


def rule_blocks() -> dict[str, str]:
    """{rule: its text} of every rule file the Snakefile includes. A rule made in a loop
    (``rule:`` with ``name:``, e.g. one summary rule per sweep group) is keyed by the
    expression of its name, ``name: <expr>``."""
    blocks = {}
    included = re.findall(
        r'^\s*include: "(rules/[\w.]+\.smk)"', (REPO / "Snakefile").read_text(), re.M
    )
    for smk in sorted(REPO / f for f in included):
        parts = re.split(r"^[ \t]*rule(?: (\w+))?:\n", smk.read_text(), flags=re.M)
        for name, body in zip(parts[1::2], parts[2::2]):
            named = re.search(r"^\s*name:\s*\n?\s*(\S+)", body, re.M)
            blocks[name or f"name: {named.group(1) if named else '?'}"] = body
    return blocks


def test_every_rule_with_a_script_fingerprints_that_script_closure():
    blocks = rule_blocks()
    assert {"run_at_cap", "compute_pfi", "report"} <= set(blocks)
    # The per-group summary rules (rules/runs.smk), made in a loop, are checked like the rest.
    assert any(
        re.search(r'"\.\./workflow_scripts/summarize_run\.py"', body)
        for name, body in blocks.items()
        if name.startswith("name: ")
    )
    wrong = {}
    for name, body in blocks.items():
        script = re.search(r'script:\s*\n\s*"\.\./workflow_scripts/(\w+)\.py"', body)
        if not script:
            continue
        if name == "run_at_cap":
            assert "code=RUN_CODE" in body
            continue
        if f'code=script_code("{script.group(1)}")' not in body:
            wrong[name] = script.group(1)
    assert not wrong, f"rules whose code param is not their own script's fingerprint: {wrong}"


def test_closures_follow_imports_and_leave_out_plumbing_and_the_real_backend():
    alloc = fp.closure(SCRIPTS / "simulate_allocation.py")
    assert "allocation.oracle" in alloc
    assert not any(m.startswith("plots") for m in alloc), (
        "the allocation simulation must not depend on plot code"
    )
    run_code = fp.closure("runs.runner", ignore=("telemetry", "runs.failures"))
    assert {"runs.runner", "runs.emulator.step", "runs.emulator.device"} <= set(run_code)
    for script in SCRIPTS.glob("*.py"):
        for mod in fp.closure(script):
            assert mod not in fp.PLUMBING
            assert not any(mod == r or mod.startswith(r + ".") for r in fp.REAL_BACKEND), (
                script.name,
                mod,
            )


def test_an_import_added_or_removed_changes_the_fingerprint(tmp_path):
    script = tmp_path / "rule_script.py"
    script.write_text("from wattflex.pfi import pfi_table\n")
    with_pfi = fp.script_fingerprint(script)
    # pfi and the library modules it imports
    assert fp.closure(script) == ["pfi", "pfi_tolerances", "schema"]
    script.write_text(
        textwrap.dedent("""
        from wattflex.pfi import pfi_table

        def later():
            from wattflex.analysis import stats  # imports inside functions count too
    """)
    )
    assert "analysis.stats" in fp.closure(script)
    assert fp.script_fingerprint(script) != with_pfi
    script.write_text("from wattflex.pfi import pfi_table\nimport numpy\n")
    assert fp.script_fingerprint(script) == with_pfi  # nothing reruns for a removed import


def test_code_fingerprint_is_order_free_and_refuses_unknown_modules():
    assert fp.code_fingerprint("runs.emulator") != fp.code_fingerprint("telemetry")
    assert fp.code_fingerprint("runs.emulator", "telemetry") == fp.code_fingerprint(
        "telemetry", "runs.emulator"
    )
    with pytest.raises(ValueError, match="no wattflex module"):
        fp.code_fingerprint("emulator")
