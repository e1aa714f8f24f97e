"""The output check every ``wattflex`` command runs before any work, in one place.

``wattflex.provenance.check_outputs`` refuses an input, a folder, a link or a device as an
output; this adds what only the command line must refuse: an output inside a measured run
(docs/reliability.md "Real runs are protected"), even one reached through a symlinked folder.
The workflow's own rules write a measured run's summary.json, so the core writers cannot refuse it.
"""

from __future__ import annotations

import os
from collections.abc import Iterable

from wattflex.provenance import OutputPathError
from wattflex.provenance import check_outputs as check_output_paths
from wattflex.runs.protection import DOCS_SECTION, measured_run_holding, recorded_backend


def check_not_in_measured_run(path: str | os.PathLike, what: str = "output") -> None:
    run_dir = measured_run_holding(path)
    if run_dir is not None:
        via = (
            ""
            if os.path.realpath(path) == os.path.abspath(path)
            else f" (through a link, as {os.path.realpath(path)})"
        )
        raise OutputPathError(
            f"{path}: {what} lies in the measured run {run_dir}{via}, whose run.json records "
            f"backend {recorded_backend(run_dir)}; the wattflex command never writes into a "
            f"measured run ({DOCS_SECTION}): give a path outside it"
        )


def check_outputs(
    outputs: Iterable[str | os.PathLike | None], inputs: Iterable[str | os.PathLike | None]
) -> None:
    """:func:`wattflex.provenance.check_outputs`, and no output inside a measured run."""
    outputs = [o for o in outputs if o is not None]
    check_output_paths(outputs, inputs)
    for out in outputs:
        check_not_in_measured_run(out)
