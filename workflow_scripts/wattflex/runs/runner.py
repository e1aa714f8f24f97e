"""One run at one cap, whatever the backend: writes telemetry.parquet, steps.parquet and
run.json into a run directory (telemetry.parquet, steps.parquet, run.json)."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from wattflex.provenance import provenance, write_json, write_parquet
from wattflex.runs.emulator import run_emulated_tables
from wattflex.runs.spec import RunSpec

if TYPE_CHECKING:
    import pandas as pd


@contextmanager
def atomic_run_dir(outdir: str | Path) -> Iterator[Path]:
    """A temporary sibling of ``outdir`` whose files move into ``outdir`` on success.

    A crash never leaves a half-written run that looks complete; the temporary directory
    is removed on every exit path.
    """
    outdir = Path(outdir)
    outdir.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{outdir.name}.", dir=outdir.parent))
    try:
        yield tmp
        outdir.mkdir(parents=True, exist_ok=True)
        for f in tmp.iterdir():
            f.replace(outdir / f.name)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def write_run_files(
    rundir: Path,
    spec: RunSpec,
    telemetry: pa.Table | pd.DataFrame,
    steps: pa.Table | pd.DataFrame,
    record: dict[str, Any],
    **run_fields: Any,
) -> None:
    """telemetry.parquet, steps.parquet and run.json of one (emulated) run, with provenance."""
    prov = provenance(
        params=spec.raw, backend=spec.backend, device_model=record.get("device_model")
    )
    ids = {"run_id": spec.run_id, "group": spec.group_id}
    write_parquet(telemetry, rundir / "telemetry.parquet", prov, **ids)
    write_parquet(steps, rundir / "steps.parquet", prov, **ids)
    write_json({**ids, **run_fields, "spec": spec.raw, **record}, rundir / "run.json", prov)


def run_at_cap(spec: dict[str, Any] | RunSpec, outdir: str | Path) -> Path:
    """Run ``spec`` and write its artifacts atomically into ``outdir``. The spec is parsed
    here, once (``RunSpec``); the backends read the parsed one."""
    spec = RunSpec.of(spec, backend=None)  # no backend: refused
    with atomic_run_dir(outdir) as tmp:
        if spec.backend == "emulated":
            # Arrow tables, not frames: the job of each emulated run never imports pandas.
            tel, steps, facts = run_emulated_tables(spec)
            write_run_files(
                tmp,
                spec,
                tel,
                steps,
                facts,
                cap_w=spec.cap_w,
                repeat=spec.repeat,
                **spec.clock_fields,
            )
        elif spec.command:  # the group's own training command
            from wattflex.runs.command_run import run_command

            run_command(spec, tmp)
        else:
            from wattflex.runs.real_run import run_real

            run_real(spec, tmp)
    return Path(outdir)
