"""One run at one cap, whatever the backend: writes telemetry.parquet, steps.parquet and
run.json into a run directory (the files DESIGN.md names)."""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path
from typing import Any

from .provenance import provenance, write_json, write_parquet


def run_at_cap(spec: dict[str, Any], outdir: str | Path) -> Path:
    """Run ``spec`` and write its artifacts atomically into ``outdir``.

    Files are written to a temporary sibling directory first and moved in place at the
    end, so a crash never leaves a half-written run that looks complete.
    """
    outdir = Path(outdir)
    outdir.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{outdir.name}.", dir=outdir.parent))
    try:
        if spec["backend"] == "emulated":
            from .devices.emulated import run_emulated

            tel, steps, facts = run_emulated(spec)
            prov = provenance(params=spec, backend="emulated", device_model=facts["device_model"])
            write_parquet(tel, tmp / "telemetry.parquet", prov, run_id=spec["run_id"], group=spec["group"]["id"])
            write_parquet(steps, tmp / "steps.parquet", prov, run_id=spec["run_id"], group=spec["group"]["id"])
            write_json({"run_id": spec["run_id"], "group": spec["group"]["id"], "cap_w": spec["cap_w"],
                        "repeat": spec["repeat"], "spec": spec, **facts}, tmp / "run.json", prov)
        elif spec["backend"] == "cuda":
            from .real_run import run_real

            run_real(spec, tmp)
        else:
            raise ValueError(f"unknown backend {spec['backend']!r} (emulated | cuda)")
        outdir.mkdir(parents=True, exist_ok=True)
        for f in tmp.iterdir():
            f.replace(outdir / f.name)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return outdir
