"""Code fingerprints for rule params, derived from what a rule script actually imports.

Snakemake reruns a job when its rule script changes but not when a library module the
script imports changes. Each rule therefore puts ``script_fingerprint(script)`` in its
params: a hash of every wattflex module in the script's import closure (direct imports
and imports inside functions), so a new
import can never be forgotten and a removed one never reruns anything.

Two kinds of module are left out of every closure, on purpose:
- plumbing that shapes no result (artifact metadata, logging, errors, this module);
- the real-GPU backend (NVML, caps, the training harness, real runs): a real run's result
  depends on its spec alone, and its outputs are write-protected (rules/common/protection.smk).
"""

from __future__ import annotations

import ast
import functools
import hashlib
import re
from pathlib import Path

LIB = Path(__file__).resolve().parent

#: Modules that shape no result: artifact metadata, logging, errors, the package itself.
PLUMBING = ("", "provenance", "smk", "errors", "fingerprint")
#: The real backend is never fingerprinted (module docstring).
REAL_BACKEND = (
    "runs.real_run",
    "runs.training",
    "runs.devices.base",
    "runs.devices.nvml",
    "runs.devices.caps",
    "runs.devices.hostpower",
    "runs.sweep.real",
    "runs.command_run",
    "runs.throughput",
)  # a group's own command (real runs only)


def _source(module: str) -> Path | None:
    """The file of a wattflex module (``"allocation.oracle"``; ``""`` is the package)."""
    base = LIB.joinpath(*module.split(".")) if module else LIB
    if base.with_suffix(".py").is_file():
        return base.with_suffix(".py")
    if (base / "__init__.py").is_file():
        return base / "__init__.py"
    return None


def _module_of(path: Path) -> tuple[str, bool]:
    """(dotted module name, is a package) of a file under the library."""
    rel = path.resolve().relative_to(LIB).with_suffix("")
    parts = rel.parts[:-1] if rel.name == "__init__" else rel.parts
    return ".".join(parts), rel.name == "__init__"


def direct_imports(path: str | Path) -> frozenset[str]:
    """wattflex modules a file imports (at the top or inside functions)."""
    st = Path(path).stat()
    return _direct_imports(Path(path), st.st_mtime_ns, st.st_size)


#: An import statement at the start of a line (``from x import (...)`` over several lines,
#: backslash continuations): parsing only these, not the whole module, keeps the
#: fingerprints of every rule at ~0.1 s of each `snakemake` start instead of ~1 s.
_IMPORT = re.compile(
    r"^[ \t]*(?:from[ \t]+[.\w]+[ \t]+import[ \t]*\([^)]*\)"
    r"|(?:from[ \t]+[.\w]+[ \t]+)?import[ \t](?:[^\n]*\\\n)*[^\n]*)",
    re.M,
)


def _import_nodes(source: str) -> list[ast.stmt]:
    """Every import statement of ``source``, wherever it is (top level, functions, ifs).

    Each line that starts like an import is parsed on its own; if any does not parse (a
    docstring line that only looks like one), the whole module is parsed instead. A docstring
    line that *does* parse as a wattflex import can only add a module, never drop one."""
    nodes: list[ast.stmt] = []
    for m in _IMPORT.finditer(source):
        try:
            nodes.extend(ast.parse(m.group(0).strip()).body)
        except SyntaxError:
            return [
                n
                for n in ast.walk(ast.parse(source))
                if isinstance(n, (ast.Import, ast.ImportFrom))
            ]
    return nodes


@functools.cache
def _direct_imports(path: Path, mtime_ns: int, size: int) -> frozenset[str]:
    inside = path.resolve().is_relative_to(LIB)
    here, is_pkg = _module_of(path) if inside else ("", False)
    pkg = here.split(".") if is_pkg else here.split(".")[:-1]
    pkg = [p for p in pkg if p]
    found: set[str] = set()
    for node in _import_nodes(path.read_text()):
        if isinstance(node, ast.Import):
            found.update(
                a.name.removeprefix("wattflex").lstrip(".")
                for a in node.names
                if a.name == "wattflex" or a.name.startswith("wattflex.")
            )
            continue
        if not isinstance(node, ast.ImportFrom):
            continue
        if node.level:
            base = pkg[: len(pkg) - (node.level - 1)]
            mod = ".".join([*base, *(node.module.split(".") if node.module else [])])
        elif node.module == "wattflex" or (node.module or "").startswith("wattflex."):
            mod = node.module.removeprefix("wattflex").lstrip(".")
        else:
            continue
        found.add(mod)
        for alias in node.names:
            sub = f"{mod}.{alias.name}".lstrip(".")
            if _source(sub) is not None:
                found.add(sub)
            elif alias.name in handed_on(mod):  # a name of the package's face: its module
                found.add(handed_on(mod)[alias.name])
    return frozenset(m for m in found if _source(m) is not None)


@functools.cache
def handed_on(package: str) -> dict[str, str]:
    """The names a package hands on (its ``__init__.pyi``, read by lazy_loader), each mapped
    to the module that defines it (``{"kruskal_dunn": "analysis.stats"}``); ``{}`` for a module
    or a package without a face. ``from wattflex.analysis import kruskal_dunn`` thus depends on
    ``analysis.stats`` alone, not on every module the face names."""
    stub = (LIB.joinpath(*package.split(".")) if package else LIB) / "__init__.pyi"
    if not stub.is_file():
        return {}
    return {
        alias.asname or alias.name: ".".join(p for p in (package, node.module) if p)
        for node in ast.parse(stub.read_text()).body
        if isinstance(node, ast.ImportFrom) and node.level == 1 and node.module
        for alias in node.names
    }


def _excluded(module: str, ignore: tuple[str, ...]) -> bool:
    return module in PLUMBING or any(
        module == x or module.startswith(x + ".") for x in (*REAL_BACKEND, *ignore)
    )


def closure(*roots: str | Path, ignore: tuple[str, ...] = ()) -> list[str]:
    """wattflex modules that ``roots`` (script paths or module names) depend on, sorted.

    Plumbing and the real backend are neither listed nor followed; nor is ``ignore``."""
    todo: list[str] = []
    for root in roots:
        if isinstance(root, Path) or str(root).endswith(".py"):
            todo.extend(direct_imports(Path(root)))
        else:
            todo.append(str(root))
    seen: set[str] = set()
    while todo:
        mod = todo.pop()
        if mod in seen or _excluded(mod, ignore):
            continue
        seen.add(mod)
        todo.extend(direct_imports(_source(mod)))
    # A package counts only through the modules it names: its __init__ holds no logic.
    return sorted(m for m in seen if _source(m).name != "__init__.py")


#: Files beside the code that a module reads as part of its logic (its templates).
DATA_FILES = {"report": ("templates/report.html.j2",)}


def code_fingerprint(*modules: str) -> str:
    """Hash of the source of wattflex modules (e.g. ``"runs.emulator"``) and of the
    ``DATA_FILES`` they read."""
    h = hashlib.sha256()
    for mod in sorted(set(modules)):
        f = _source(mod)
        if f is None:
            raise ValueError(f"no wattflex module {mod!r}")
        for path in (f, *(LIB / d for d in DATA_FILES.get(mod, ()))):
            h.update(path.relative_to(LIB).as_posix().encode())
            h.update(path.read_bytes())
    return h.hexdigest()[:16]


def script_fingerprint(*roots: str | Path, ignore: tuple[str, ...] = ()) -> str:
    """Fingerprint of everything ``roots`` import (see ``closure``)."""
    return code_fingerprint(*closure(*roots, ignore=ignore))
