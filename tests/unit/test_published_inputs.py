"""The published tables each rule declares as input (rules/common/paths.smk PUBLISHED_BY_RULE)
are the ones its code reads, so editing a published CSV reruns what shows it (the
rerun itself: tests/workflow/test_relocation.py)."""

import ast
import re
from pathlib import Path

from wattflex.fingerprint import closure

ROOT = Path(__file__).resolve().parents[2]
SCRIPTS = ROOT / "workflow_scripts"
LIB = SCRIPTS / "wattflex"
TABLES = ROOT / "resources" / "paper" / "tables"
SCRIPT_OF = {"report": "make_report"}  # rule -> its script, where the names differ
# a published table read by stem: load_published(<dir>, "<stem>"), or shown beside a report item
READS = re.compile(r'load_published\([^,()]+,\s*"(\w+)"\)|published="(\w+)"')


def published_by_rule() -> dict[str, tuple[str, ...]]:
    text = (ROOT / "rules" / "common" / "paths.smk").read_text()
    block = re.search(r"^PUBLISHED_BY_RULE = (\{.*?^\})", text, re.M | re.S).group(1)
    return ast.literal_eval(block)


def stems(path: Path) -> set[str]:
    return {a or b for a, b in READS.findall(path.read_text())}


def module_file(module: str) -> Path:
    base = LIB.joinpath(*module.split("."))
    return base.with_suffix(".py") if base.with_suffix(".py").is_file() else base / "__init__.py"


def test_every_declared_table_exists_and_its_rules_code_can_read_it():
    for rule, declared in published_by_rule().items():
        script = SCRIPTS / f"{SCRIPT_OF.get(rule, rule)}.py"
        readable = stems(script).union(*(stems(module_file(m)) for m in closure(script)))
        assert set(declared) <= readable, (
            f"{rule} declares tables its code never reads: {set(declared) - readable}"
        )
        assert all((TABLES / f"{s}.csv").is_file() for s in declared), rule


def test_a_rule_script_reads_only_the_tables_its_rule_declares():
    by_rule = published_by_rule()
    for rule, declared in by_rule.items():
        own = stems(SCRIPTS / f"{SCRIPT_OF.get(rule, rule)}.py")
        assert own <= set(declared), (
            f"{rule}'s script reads {own - set(declared)}, not in its input"
        )


def test_every_table_the_library_reads_is_some_rules_input():
    read = set().union(*(stems(p) for p in [*LIB.rglob("*.py"), *SCRIPTS.glob("*.py")]))
    declared = set().union(*published_by_rule().values())
    assert read and read <= declared, f"read by the library but no rule's input: {read - declared}"
