"""Host power beyond the GPUs: CPU package and DRAM power from Linux powercap (RAPL).

The paper measured GPU board power only. Where ``/sys/class/powercap/intel-rapl:*``
(also used for AMD RAPL) is readable — ``energy_uj`` is root-only on most kernels since
2020 — this reads the package zones (``package-N``) and their ``dram`` subzones and turns
energy counter differences into watts, handling counter wrap-around. Unreadable or absent:
``available`` is False and readings are NaN; a run never fails for lack of RAPL.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from pathlib import Path

POWERCAP = Path("/sys/class/powercap")


def _read_int(path: Path) -> int | None:
    try:
        return int(path.read_text().strip())
    except (OSError, ValueError):
        return None


class RaplReader:
    """Node-level ``host_cpu_w`` (sum of CPU packages) and ``host_dram_w`` (sum of DRAM
    zones), averaged since the previous ``read()``; the first read returns NaN."""

    def __init__(self, root: str | Path = POWERCAP, clock: Callable[[], float] = time.monotonic):
        self.root, self.clock = Path(root), clock
        self.zones: dict[str, list[Path]] = {"host_cpu_w": [], "host_dram_w": []}
        for zone in sorted(self.root.glob("intel-rapl:*")):
            name = (zone / "name").read_text().strip() if (zone / "name").is_file() else ""
            if _read_int(zone / "energy_uj") is None:
                continue  # not readable by this user
            if name.startswith("package"):
                self.zones["host_cpu_w"].append(zone)
            elif name == "dram":
                self.zones["host_dram_w"].append(zone)
        self._last: tuple[float, dict[Path, int]] | None = None

    @property
    def available(self) -> bool:
        """Whether any RAPL zone's energy counter is readable."""
        return any(self.zones.values())

    def describe(self) -> str:
        """One line for run.json: the zones found per key, or why RAPL is unavailable."""
        if not self.available:
            return f"unavailable ({self.root} absent or energy_uj not readable)"
        return "rapl: " + ", ".join(f"{k}={len(v)} zone(s)" for k, v in self.zones.items())

    def read(self) -> dict[str, float]:
        """The host's power in W per key (package, dram...) since the last call, from the RAPL energy
        counters (a wrapped counter corrected); NaN on the first call or when a zone is unreadable.
        """
        now = self.clock()
        counters = {z: _read_int(z / "energy_uj") for zs in self.zones.values() for z in zs}
        out = {k: math.nan for k in self.zones}
        if self._last is not None:
            t_prev, prev = self._last
            dt = now - t_prev
            for key, zones in self.zones.items():
                if not zones or dt <= 0:
                    continue
                total = 0.0
                for z in zones:
                    a, b = prev.get(z), counters.get(z)
                    if a is None or b is None:
                        total = math.nan
                        break
                    delta = b - a
                    if delta < 0:  # the counter wrapped
                        delta += _read_int(z / "max_energy_range_uj") or 0
                    total += delta / 1e6 / dt
                out[key] = total
        self._last = (now, counters)
        return out
