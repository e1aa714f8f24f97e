"""Every rule's params carry a fingerprint of the library modules its script imports
(directly or through other wattflex modules), so a code change reruns the rules that use
it: Snakemake itself only tracks the rule script (issue 8)."""

import ast
import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


LIB = REPO / "workflow_scripts" / "wattflex"
#: Modules that shape no result: artifact metadata, logging, the package itself.
PLUMBING = {"provenance", "smk", "__init__"}
#: The real backend's code is never fingerprinted: a real run depends on its spec alone, and
#: its outputs are write-protected (common.smk run_output).
REAL_BACKEND_ONLY = {"caps", "devices.base", "devices.nvml", "real_run", "hostpower", "training"}
#: run_at_cap fingerprints only what an emulated run's numbers come from (common.smk RUN_CODE).
RUN_AT_CAP_CODE = {"emulator", "devices.emulated", "runner"}


def _module_name(path: Path) -> str:
    rel = path.relative_to(LIB).with_suffix("")
    return ".".join(rel.parts[:-1]) if rel.name == "__init__" and len(rel.parts) > 1 else ".".join(rel.parts)


def _imports(path: Path) -> set[str]:
    """wattflex modules a file imports directly (lazy imports included)."""
    tree = ast.parse(path.read_text())
    pkg = _module_name(path).split(".")[:-1] if path.is_relative_to(LIB) else []
    if path.is_relative_to(LIB) and path.name == "__init__.py":
        pkg = _module_name(path).split(".")
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [a.name.removeprefix("wattflex.") for a in node.names if a.name.startswith("wattflex.")]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = pkg[: len(pkg) - (node.level - 1)] if node.level > 1 else pkg
                mod = ".".join([*base, *(node.module.split(".") if node.module else [])])
            elif node.module and (node.module == "wattflex" or node.module.startswith("wattflex.")):
                mod = node.module.removeprefix("wattflex").lstrip(".")
            else:
                continue
            names = [f"{mod}.{a.name}".lstrip(".") for a in node.names] + [mod]
        else:
            continue
        for name in names:
            if name and ((LIB / name.replace(".", "/")).with_suffix(".py").is_file()
                         or (LIB / name.replace(".", "/") / "__init__.py").is_file()):
                found.add(name)
    return found


def closure(script: Path) -> set[str]:
    todo, seen = list(_imports(script)), set()
    while todo:
        mod = todo.pop()
        if mod in seen:
            continue
        seen.add(mod)
        if mod.split(".")[0] in PLUMBING:  # metadata plumbing: what it imports shapes no result
            continue
        path = (LIB / mod.replace(".", "/")).with_suffix(".py")
        path = path if path.is_file() else LIB / mod.replace(".", "/") / "__init__.py"
        todo.extend(_imports(path))
    return seen


def rule_blocks() -> dict[str, str]:
    """{rule: its text} of every rule file the Snakefile includes."""
    blocks = {}
    included = re.findall(r'^\s*include: "(rules/[\w.]+\.smk)"', (REPO / "Snakefile").read_text(), re.M)
    for smk in sorted(REPO / f for f in included):
        parts = re.split(r"^rule (\w+):\n", smk.read_text(), flags=re.M)
        blocks.update({name: body for name, body in zip(parts[1::2], parts[2::2])})
    return blocks


def test_every_rule_fingerprints_the_library_code_its_script_uses():
    blocks = rule_blocks()
    assert {"run_at_cap", "summarize_run", "compute_pfi", "report"} <= set(blocks)
    missing = {}
    for name, body in blocks.items():
        script = re.search(r'script:\s*\n\s*"\.\./(workflow_scripts/[\w/]+\.py)"', body)
        if not script:
            continue
        if name == "run_at_cap":
            assert 'code=RUN_CODE' in body
            listed = set(re.findall(r'"([\w.]+)"', re.search(r"RUN_CODE = code_fingerprint\(([^)]*)\)",
                                                           (REPO / "rules" / "common.smk").read_text()).group(1)))
            assert listed == RUN_AT_CAP_CODE
            continue
        call = re.search(r"code=code_fingerprint\(([^)]*)\)", body)
        listed = set(re.findall(r'"([\w.]+)"', call.group(1))) if call else set()
        need = {m for m in closure(REPO / script.group(1)) if m.split(".")[0] not in PLUMBING
                and not any(m == r or m.startswith(r + ".") for r in REAL_BACKEND_ONLY)}
        if need - listed:
            missing[name] = sorted(need - listed)
    assert not missing, f"rules whose params miss a fingerprint of modules their script imports: {missing}"
