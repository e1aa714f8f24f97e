"""Derive the emulator's achieved dense-GEMM efficiency from torchtitan's published H100
throughput, and refit the power-level anchor with it (the two depend on each other: the
throughput at torchtitan's 500 W limit depends on the power curve, whose anchor is fitted on
the dense groups of Tables 7-8 with the efficiency in the jobs). Table 6 never enters.

    python benchmarks/derive_gemm_efficiency.py

Prints each fixed-point step and the constants to put in wattflex.runs.emulator.physics.Physics.
"""

import dataclasses

from wattflex.analysis import calibration as cal
from wattflex.config import REPO_ROOT, load_config
from wattflex.runs.emulator.physics import PHYSICS


def main() -> None:
    groups = cal.config_group_models(load_config(REPO_ROOT / "config" / "config.yaml"))
    tables = REPO_ROOT / "resources" / "paper" / "tables"
    ph = PHYSICS
    for step in range(6):
        eff, table = cal.derive_dense_gemm_eff(ph)
        base = dataclasses.replace(ph, dense_gemm_eff=eff)
        c = cal.calibrate_published(groups, tables, base=base)
        print(
            f"step {step}: dense_gemm_eff {eff:.2f} -> anchor {c.anchor_clock_mhz:.0f} MHz, "
            f"sm_dyn_w {c.curve.sm_dyn_w:.0f}, v_min {c.curve.v_min:.4f}, v_exp {c.curve.v_exp:.3f}, "
            f"calib_tensor_util {c.curve.calib_tensor_util:.4f}, table error {c.curve.max_table_error_mhz:.0f} MHz"
        )
        new = c.physics(base)
        if new == ph:
            break
        ph = new
    print(table.round(0).to_string(index=False))


if __name__ == "__main__":
    main()
