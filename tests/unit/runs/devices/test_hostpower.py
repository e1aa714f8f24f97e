"""RAPL host power from a powercap tree laid out like /sys/class/powercap (real files in tmp)."""

import math

import pytest

from wattflex.runs.devices.hostpower import RaplReader


def zone(root, name, label, energy_uj, max_uj=262143328850):
    d = root / name
    d.mkdir(parents=True)
    (d / "name").write_text(label + "\n")
    (d / "energy_uj").write_text(f"{energy_uj}\n")
    (d / "max_energy_range_uj").write_text(f"{max_uj}\n")
    return d


class Clock:
    t = 100.0

    def __call__(self):
        return self.t


def test_rapl_packages_and_dram_to_watts_with_wraparound(tmp_path):
    p0 = zone(tmp_path, "intel-rapl:0", "package-0", 1_000_000)
    p1 = zone(tmp_path, "intel-rapl:1", "package-1", 5_000_000, max_uj=10_000_000)
    d0 = zone(tmp_path, "intel-rapl:0:2", "dram", 0)
    zone(tmp_path, "intel-rapl:0:0", "core", 0)  # inside the package: not added again
    clock = Clock()
    r = RaplReader(tmp_path, clock=clock)
    assert r.available and len(r.zones["host_cpu_w"]) == 2 and len(r.zones["host_dram_w"]) == 1
    first = r.read()
    assert math.isnan(first["host_cpu_w"]) and math.isnan(first["host_dram_w"])
    clock.t += 2.0
    (p0 / "energy_uj").write_text("201000000\n")  # +200 J
    (p1 / "energy_uj").write_text("1000000\n")  # wrapped: +6 J
    (d0 / "energy_uj").write_text("40000000\n")  # +40 J
    w = r.read()
    assert w["host_cpu_w"] == pytest.approx((200 + 6) / 2)
    assert w["host_dram_w"] == pytest.approx(20.0)


def test_rapl_absent_or_unreadable_is_unavailable_not_an_error(tmp_path):
    r = RaplReader(tmp_path / "nope")
    assert not r.available and "unavailable" in r.describe()
    assert all(math.isnan(v) for v in r.read().values())
    d = zone(tmp_path, "intel-rapl:0", "package-0", 0)
    (d / "energy_uj").write_text("not a number")  # unreadable counter
    assert not RaplReader(tmp_path).available
