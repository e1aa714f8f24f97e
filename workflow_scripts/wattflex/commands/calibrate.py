"""``wattflex calibrate``: fit the emulator's power level to your own measurements.

The emulator has one fitted global constant, the anchor (the SM clock a bf16 GEMM at the
reference activity anchor_tensor_util, 0.70, holds under 700 W; ``wattflex.analysis.calibration``). This command fits it, as
the default is fitted on the paper's Tables 7-8, on one of:

- ``--runs runs.parquet`` (or a CSV): measured sweeps, one row per run with ``group, cap_w,
  power_w`` and ``tokens_per_s`` (or ``throughput``, any unit): a measured campaign's
  ``runs.parquet``, or an ingested sweep table (``wattflex ingest``). Each group must be a
  group of ``--configfile`` (the emulator needs its job: model, task, GPUs, layout);
- ``--published SET``: the paper's facts (``tables7-8-dense``, ...; never Table 6);
- ``--gpu-check FILE``: the GPU check's ``anchor_gemm`` reading (``benchmarks/gpu_check.py``),
  a measurement of the anchor itself.

It prints the anchor, the constants it implies, the error in sample and out of sample
(leave-one-group-out over the fit groups, and on ``--holdout`` groups kept out of the fit),
and writes the calibration file (``-o``) that ``emulator: {calibration: FILE}`` reads, so an
emulated campaign can say what PFI unmeasured configurations would have on *your* GPUs.
"""

from __future__ import annotations

import argparse
import math
from pathlib import Path

from wattflex.commands import RenamedOption, name_list
from wattflex.errors import UserError

NAME = "calibrate"
HELP = "fit the emulator's power-level anchor to measured sweeps, the paper's tables or a GPU check"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """``wattflex calibrate``'s options on ``parser``: the measurements (``--runs``, ``--published``
    or ``--gpu-check``, one of them), the config whose groups describe the jobs, and the output.
    """
    src = parser.add_mutually_exclusive_group(required=True)
    src.add_argument(
        "--runs",
        type=Path,
        help="measured runs: runs.parquet or a CSV (group, cap_w, power_w, "
        "tokens_per_s or throughput)",
    )
    src.add_argument(
        "--published",
        metavar="SET",
        help="fit on a named set of the paper's facts "
        "(wattflex.analysis.calibration.FIT_SETS; never Table 6)",
    )
    src.add_argument("--gpu-check", type=Path, help="gpu_check JSON with an anchor_gemm reading")
    parser.add_argument(
        "--configfile",
        "--config",
        dest="config",
        action=RenamedOption,
        old=("--config",),
        type=Path,
        default=Path("config/config.yaml"),
        help="config whose groups describe the measured jobs (--config is the old spelling)",
    )
    parser.add_argument(
        "--holdout",
        default="",
        help="comma-separated groups kept out of the fit and scored out of sample",
    )
    parser.add_argument(
        "--paper-tables",
        type=Path,
        default=None,
        help="published tables folder (default: the shipped resources/paper/tables)",
    )
    parser.add_argument(
        "-o", "--output", type=Path, help="calibration file to write (JSON); omitted: print only"
    )


def _runs_table(path: Path):
    from wattflex.ingest.reader import read_typed_table

    if not path.is_file():
        raise UserError(f"--runs {path}: file not found")
    df = read_typed_table(path).drop(columns="_where")
    if "tokens_per_s" not in df and "throughput" in df:
        df = df.rename(columns={"throughput": "tokens_per_s"})  # Eq. 1 is a ratio: any unit will do
    return df


def _check_gpus(runs, path: Path) -> None:
    """Sweeps on a GPU the catalogue does not hold cannot calibrate the emulator (no power model of it)."""
    from wattflex.gpus import GPUS

    if "gpu_model" not in runs:
        return
    other = sorted({str(m) for m in runs["gpu_model"].dropna()} - set(GPUS))
    if other:
        raise UserError(
            f"--runs {path}: runs on {', '.join(other)}; the emulator models {', '.join(GPUS)} only "
            "(wattflex.gpus.GPUS: limits, clocks, peak rates and memory of each), so these sweeps "
            "cannot calibrate it: give sweeps measured on one of those"
        )


def _check_layouts(runs, groups, path: Path) -> None:
    """A measured group's layout must be its config group's: the same pipeline depth (``pp``;
    an ingested Perseus sweep has one) and no tensor parallelism, which the emulator does not model."""
    jobs = {g.id: g.job for g in groups}
    for col, want in (("pp", lambda j: j.pp), ("tp", lambda j: 1)):
        if col not in runs:
            continue
        for gid, value in zip(runs["group"].astype(str), runs[col]):
            if gid in jobs and value == value and int(value) != want(jobs[gid]):
                raise UserError(
                    f"--runs {path}: group {gid} ran with {col} {int(value)}, its config group has "
                    f"{col} {want(jobs[gid])}"
                    + (
                        "; the emulator models no tensor parallelism, so it "
                        "cannot describe this job"
                        if col == "tp"
                        else f"; set {col}: {int(value)} (and microbatches) in the config's group"
                    )
                )


def _unknown_groups(runs, facts, known, catalog, args) -> list[str]:
    """Measured groups the config does not describe: an error if that is all of them, else
    left out of the fit (returned), with what keeps the emulator from describing them."""
    unknown = sorted(set(facts.index) - known)
    if not unknown:
        return []
    rows = runs[runs["group"].astype(str).isin(unknown)]
    why = []
    models = sorted({str(m) for m in (rows["model"] if "model" in rows else [])} - set(catalog))
    if models:
        why.append(f"models not in the config's catalogue: {', '.join(models)}")
    if "pp" in rows and (rows["pp"].fillna(1) > 1).any():
        why.append(
            f"pipeline-parallel (pp {'/'.join(str(int(v)) for v in sorted(rows['pp'].dropna().unique()))}): "
            "a group of theirs needs pp and microbatches"
        )
    names = f"{', '.join(unknown[:6])}{' ...' if len(unknown) > 6 else ''}"
    if len(unknown) == len(facts):
        raise UserError(
            f"--runs {args.runs}: group(s) {names} are not groups of --configfile {args.config}; the emulator "
            "needs each measured job's model, task, GPUs and layout: add them to the config's groups"
            + (f" ({'; '.join(why)})" if why else "")
        )
    print(
        f"left out (not groups of --configfile {args.config}): {names}"
        + (f" ({'; '.join(why)})" if why else "")
    )
    return unknown


def _check_group_gpus(runs, groups, path: Path) -> None:
    """A measured group must be on the GPU its config group names (the fit emulates that one)."""
    if "gpu_model" not in runs:
        return
    want = {g.id: g.gpu for g in groups}
    wrong = sorted(
        {
            (str(g), str(m), want[g])
            for g, m in zip(runs["group"], runs["gpu_model"])
            if g in want and isinstance(m, str) and m != want[g]
        }
    )
    if wrong:
        g, m, w = wrong[0]
        raise UserError(
            f"--runs {path}: group {g} ran on {m} but its config group says gpu: {w}"
            f"{f' (and {len(wrong) - 1} more)' if len(wrong) > 1 else ''}; set gpu: {m} in the "
            "config's group so the fit emulates the GPU the sweep was measured on"
        )


def _no_facts(args: argparse.Namespace) -> str:
    """Why there is no PFI fact to fit on, by the source the facts came from."""
    if args.runs:
        return (
            f"--runs {args.runs}: no group has a PFI to fit on (each needs finite power_w and throughput "
            "at 2 or more caps)"
        )
    return (
        f"--published {args.published}: none of the groups of --configfile {args.config} has a published PFI "
        "in this set; give another set or the config whose groups it holds"
    )


def run(args: argparse.Namespace) -> int:
    """Fit the emulator's anchor (MHz) to the measurements and write the fitted value with its fit
    statistics as JSON. Returns the exit status, 0.

    Raises UserError for an ingested campaign's config, runs the config's groups do not describe,
    a named set without facts, or a fit that cannot be made.
    """
    import pandas as pd

    from wattflex.analysis import calibration as cal
    from wattflex.commands._outputs import check_outputs
    from wattflex.config import REPO_ROOT, load_config
    from wattflex.runs.emulator.physics import DEFAULT_DIE

    check_outputs([args.output], [args.runs, args.gpu_check, args.config])
    tables = args.paper_tables or REPO_ROOT / "resources" / "paper" / "tables"
    if args.gpu_check:
        return _from_gpu_check(args, cal)
    cfg = load_config(args.config)
    if cfg["source"] != "generate":
        raise UserError(
            f"--configfile {args.config}: an ingested campaign's config has no jobs for the emulator; "
            "give the config whose groups describe the measured jobs"
        )
    groups = cal.config_group_models(cfg)
    if args.runs:
        runs = _runs_table(args.runs)
        unseen = cal.unmeasured_draws(runs)
        if unseen:
            raise UserError(f"--runs {args.runs}: {unseen}")
        _check_gpus(runs, args.runs)
        _check_layouts(runs, groups, args.runs)
        _check_group_gpus(runs, groups, args.runs)
        facts, source = cal.measured_facts(runs), f"fitted ({args.runs.name})"
        facts = facts.drop(
            _unknown_groups(runs, facts, {g.id for g in groups}, cfg["_catalog"], args)
        )
    else:
        facts, source = (
            cal.published_facts(groups, tables, args.published),
            f"fitted ({args.published})",
        )
    if facts.empty:
        raise UserError(_no_facts(args))
    holdout = name_list(args.holdout)
    missing = sorted(set(holdout) - set(facts.index))
    if missing:
        raise UserError(
            f"--holdout: {', '.join(missing)} not among the fact groups ({', '.join(facts.index)})"
        )
    fit_facts = facts.drop(holdout)
    if len(fit_facts) < 1:
        raise UserError(
            f"--holdout {args.holdout}: holds out every fact group ({', '.join(facts.index)}); "
            "nothing is left to fit on"
        )
    try:
        c = cal.calibrate(groups, fit_facts, source)
    except ValueError as exc:  # fit groups on GPUs of different dies
        raise UserError(str(exc)) from None
    table_fit = (
        f"DGEMM table max error {c.curve.max_table_error_mhz:.0f} MHz"
        if c.gpu_die == DEFAULT_DIE
        else f"{c.gpu_die}: no cap -> clock table, GH100 voltage shape assumed"
    )
    print(
        f"anchor {c.anchor_clock_mhz:.0f} MHz ({c.source}, {len(fit_facts)} groups): sm_dyn_w {c.curve.sm_dyn_w:.0f} W, "
        f"v_min {c.curve.v_min:.3f}, v_exp {c.curve.v_exp:.2f}; {table_fit}"
    )
    if not c.pinned:
        grid = cal.anchor_grid(c.gpu_die)
        print(
            f"unpinned: the fit landed on the edge of its search grid ({grid[0]:.0f}-{grid[-1]:.0f} MHz): the facts "
            f"want a level at or beyond {c.anchor_clock_mhz:.0f} MHz, so they bound it but do not pin it; the "
            "calibration file says pinned: false"
        )
    print(
        f"in-sample mean |PFI error| {c.in_sample_mae:.3f}; out of sample (leave one group out) "
        + ("n/a (< 2 groups)" if math.isnan(c.out_of_sample_mae) else f"{c.out_of_sample_mae:.3f}")
    )
    from wattflex.analysis.fidelity import noise_free_pfi

    pred = noise_free_pfi([g for g in groups if g.id in facts.index], c.physics())
    table = pd.DataFrame(
        {
            "group": facts.index,
            "pfi_measured": facts.to_numpy(),
            "pfi_emulated": pred.reindex(facts.index).to_numpy(),
            "sample": ["out (holdout)" if g in holdout else "in" for g in facts.index],
        }
    )
    table["error"] = table["pfi_emulated"] - table["pfi_measured"]
    if holdout:
        print(
            f"holdout mean |PFI error| {table.loc[table['sample'] != 'in', 'error'].abs().mean():.3f}"
        )
    print(table.to_string(index=False, float_format=lambda v: f"{v:.3f}"))
    if args.output:
        cal.write_calibration(c, args.output)
        print(f"wrote {args.output} (use it with emulator: {{calibration: {args.output}}})")
    return 0


def _from_gpu_check(args: argparse.Namespace, cal) -> int:
    path = args.gpu_check
    data = cal.read_json(path, "--gpu-check", "benchmarks/gpu_check.py --out writes it")
    reading = (data.get("steps") or {}).get("anchor_gemm") if isinstance(data, dict) else None
    if not isinstance(reading, dict):
        raise UserError(
            f"--gpu-check {path}: no steps.anchor_gemm reading; run benchmarks/gpu_check.py "
            "(its anchor step) on the GPU first"
        )
    c = cal.calibration_from_gpu_check(reading, where=f"--gpu-check {path}")
    print(
        f"anchor {c.anchor_clock_mhz:.0f} MHz ({c.source}): sm_dyn_w {c.curve.sm_dyn_w:.0f} W; measured GEMM "
        f"{reading['sm_clock_mhz']:.0f} MHz at {reading['power_w']:.0f} W, tensor activity "
        f"{reading['tensor_activity']:.3f}"
    )
    if args.output:
        cal.write_calibration(c, args.output)
        print(f"wrote {args.output} (use it with emulator: {{calibration: {args.output}}})")
    return 0
