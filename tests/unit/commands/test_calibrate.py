"""``wattflex calibrate``: the anchor back from sweeps and a GPU-check reading made with a
known one, the paper's default fit, and one-line errors for input it cannot use."""

import json

import numpy as np
import pandas as pd
import pytest

from tests.conftest import REPO
from wattflex.analysis import calibration as cal
from wattflex.analysis import fidelity as fid
from wattflex.cli import main
from wattflex.config import load_config
from wattflex.gpus import GPUS
from wattflex.runs.emulator.physics import voltage
from wattflex.runs.emulator.step import power_model_clock_for_cap

CONFIG = REPO / "config" / "config.yaml"
DENSE = (
    "dense-ft-mistral24b-x8",
    "dense-pt-mistral24b-x8",
    "dense-pt-qwen32b-x8-compile",
    "h100-dense-ft-mistral24b-x8",
    "dense-ft-llama70b-x8-compile",
)


@pytest.fixture(scope="module")
def sweeps(tmp_path_factory):
    """Noise-free emulated sweeps of five dense groups made with anchor 1755 MHz, as a CSV."""
    groups = [g for g in cal.config_group_models(load_config(CONFIG)) if g.id in DENSE]
    truth = cal.physics_at_anchor(1755.0)
    rows = []
    for g in groups:
        power, tput = fid.noise_free_curve(g, truth)
        rows += [
            {"group": g.id, "cap_w": c, "power_w": p, "throughput": t}
            for c, p, t in zip(g.caps, power, tput)
        ]
    path = tmp_path_factory.mktemp("cal") / "sweeps.csv"
    pd.DataFrame(rows).to_csv(path, index=False)
    return path


def test_calibrate_recovers_the_anchor_of_the_sweeps_and_writes_a_file(sweeps, tmp_path, capsys):
    out = tmp_path / "mine.json"
    assert (
        main(
            [
                "calibrate",
                "--runs",
                str(sweeps),
                "--holdout",
                "dense-pt-qwen32b-x8-compile",
                "-o",
                str(out),
            ]
        )
        == 0
    )
    text = capsys.readouterr().out
    assert text.startswith("anchor 1755 MHz (fitted (sweeps.csv), 4 groups)")
    assert "holdout mean |PFI error| 0.000" in text and "out (holdout)" in text
    c = cal.read_calibration(out)
    assert c.anchor_clock_mhz == 1755.0 and "dense-pt-qwen32b-x8-compile" not in c.fit_groups
    assert c.curve.sm_dyn_w == pytest.approx(cal.fit_power_curve(1755.0).sm_dyn_w)


def test_calibrate_on_the_papers_default_set_is_a_what_if_beside_the_emulators_anchor(capsys):
    # the emulator's anchor is fitted on public sweeps (wattflex.analysis.calibration.public_anchor); the
    # paper's dense groups of Tables 7-8 still give their own fit on request
    assert main(["calibrate", "--published", cal.DEFAULT_FIT_SET]) == 0
    text = capsys.readouterr().out
    assert text.startswith("anchor ") and "(fitted (tables7-8-dense), 5" in text


def refused_runs(path, capsys, group: str, cap_w: list, power_w: list, throughput: list) -> str:
    """``wattflex calibrate --runs`` on a two-row sweep of ``group``: its error (exit 2)."""
    pd.DataFrame(
        {"group": [group] * 2, "cap_w": cap_w, "power_w": power_w, "throughput": throughput}
    ).to_csv(path, index=False)
    assert main(["calibrate", "--runs", str(path)]) == 2
    return capsys.readouterr().err


def test_groups_the_config_does_not_define_are_a_one_line_error(tmp_path, capsys):
    err = refused_runs(
        tmp_path / "other.csv", capsys, "gpt3-xl", [200, 300], [800, 1100], [1.0, 1.2]
    )
    assert (
        "group(s) gpt3-xl are not groups of --configfile" in err
        and "add them to the config's groups" in err
    )


PERSEUS = REPO / "resources" / "external" / "perseus-sosp24"


def _ingest(src, out, capsys):
    assert main(["ingest", "perseus-sosp24", str(src), "-o", str(out)]) == 0
    capsys.readouterr()
    return out


def test_the_perseus_a40_sweeps_are_refused_for_their_gpu(tmp_path, capsys):
    """The Perseus (SOSP'24) A100 + A40 power-limit sweeps shipped in resources/external, ingested
    as a user's would be: the A40 (GA102, GDDR6) is not in the catalogue."""
    runs = _ingest(PERSEUS, tmp_path / "runs.parquet", capsys)
    assert main(["calibrate", "--runs", str(runs)]) == 2
    assert (
        "runs on A40; the emulator models H200, H100, H100-94GB, A100 only"
        in capsys.readouterr().err
    )


PERSEUS_CONFIG = REPO / "config" / "perseus-sosp24-a100-emulated.yaml"


def test_the_perseus_a100_sweeps_against_the_default_config_say_what_the_emulator_lacks(
    tmp_path, capsys
):
    """Every Perseus A100 job is a 4-stage pipeline (dp 1, tp 1, pp 4) of a model outside the
    paper's catalogue: against config/config.yaml nothing is left to fit, and the error says why."""
    runs = _ingest(PERSEUS / "power_limit_sweeps_A100.csv", tmp_path / "a100.parquet", capsys)
    assert main(["calibrate", "--runs", str(runs)]) == 2
    err = capsys.readouterr().err
    assert "are not groups of --configfile config/config.yaml" in err
    assert (
        "models not in the config's catalogue: bert-huge-uncased, bloom-3b, gpt3-xl, t5-3b, wide-resnet101_8"
        in err
    )
    assert "pipeline-parallel (pp 4): a group of theirs needs pp and microbatches" in err
    assert err.count("\n") == 1


def test_calibrate_fits_an_a100_anchor_on_the_shipped_perseus_a100_sweeps(tmp_path, capsys):
    """The decoder-only Perseus A100 jobs (BLOOM-3B, GPT-3 XL; config/perseus-sosp24-a100-emulated.yaml
    describes them as 4-stage pipelines) fit an anchor inside the A100's clock range, with finite
    errors in sample and leave-one-group-out; BERT, T5 and Wide-ResNet are left out with the reason."""
    runs = _ingest(PERSEUS / "power_limit_sweeps_A100.csv", tmp_path / "a100.parquet", capsys)
    out = tmp_path / "perseus_a100.json"
    assert (
        main(
            ["calibrate", "--runs", str(runs), "--configfile", str(PERSEUS_CONFIG), "-o", str(out)]
        )
        == 0
    )
    text = capsys.readouterr().out
    assert text.startswith("left out (not groups of --configfile ")
    assert (
        "a100-bert_huge_uncased-dp1tp1pp4-b256, a100-t5_3b-dp1tp1pp4-b128, a100-wide_resnet101_8"
        in text
    )
    c = cal.read_calibration(out)
    assert c.gpu_die == "GA100"
    assert set(c.fit_groups) == {"a100-bloom_3b-dp1tp1pp4-b512", "a100-gpt3_xl-dp1tp1pp4-b1024"}
    grid = cal.anchor_grid("GA100")
    assert grid[0] < c.anchor_clock_mhz < grid[-1]  # not pinned at an end of the search
    assert 0 < c.in_sample_mae < 0.3 and np.isfinite(c.out_of_sample_mae)
    assert f"out of sample (leave one group out) {c.out_of_sample_mae:.3f}" in text
    # the measured PFI the fit saw are Eq. 1 on the sweeps themselves
    facts = cal.measured_facts(pd.read_parquet(runs))
    pfi = fid.noise_free_pfi(cal.config_group_models(load_config(PERSEUS_CONFIG)), c.physics())
    for gid, res in c.residuals.items():
        assert res == pytest.approx(pfi[gid] - facts[gid])


A100_DENSE = (
    "dense-ft-mistral24b-x8",
    "dense-pt-mistral24b-x8",
    "dense-pt-qwen32b-x8-compile",
    "dense-ft-llama70b-x8-compile",
)


@pytest.fixture(scope="module")
def a100(tmp_path_factory):
    """A config whose dense groups run on A100s (caps 150-400 W), and their noise-free emulated
    sweeps made with a known A100 anchor (1275 MHz), as a user's measured A100 sweeps would be."""
    import yaml

    tmp = tmp_path_factory.mktemp("a100")
    raw = yaml.safe_load(CONFIG.read_text())
    raw["groups"] = [
        {**g, "gpu": "A100", "caps": [150, 200, 250, 300, 350, 400], "set": "other"}
        for g in raw["groups"]
        if g["id"] in A100_DENSE
    ]
    raw["repeats"] = []
    config = tmp / "a100.yaml"
    config.write_text(yaml.safe_dump(raw))
    groups = cal.config_group_models(load_config(config))
    truth = cal.physics_at_anchor(1275.0, die="GA100")
    rows = []
    for g in groups:
        power, tput = fid.noise_free_curve(g, truth)
        rows += [
            {"group": g.id, "cap_w": c, "power_w": p, "throughput": t, "gpu_model": "A100"}
            for c, p, t in zip(g.caps, power, tput)
        ]
    sweeps = tmp / "a100_sweeps.csv"
    pd.DataFrame(rows).to_csv(sweeps, index=False)
    return config, sweeps, groups


def test_calibrate_recovers_a_known_a100_anchor_and_the_file_runs_a100_groups_only(
    a100, tmp_path, capsys
):
    config, sweeps, groups = a100
    out = tmp_path / "a100_cal.json"
    assert (
        main(["calibrate", "--runs", str(sweeps), "--configfile", str(config), "-o", str(out)]) == 0
    )
    text = capsys.readouterr().out
    assert text.startswith("anchor 1275 MHz (fitted (a100_sweeps.csv), 4 groups)")
    assert "GA100: no cap -> clock table, GH100 voltage shape assumed" in text
    assert "in-sample mean |PFI error| 0.000; out of sample (leave one group out) 0.000" in text
    c = cal.read_calibration(out)
    assert c.gpu_die == "GA100" and c.curve.sm_dyn_w == pytest.approx(
        cal.table_free_curve(1275.0, GPUS["A100"]).sm_dyn_w
    )
    # the file's physics emulates an A100 at its anchor: a bf16 GEMM at anchor_tensor_util holds
    # 1275 MHz under the A100's 400 W default limit
    ph = c.physics()
    assert (
        power_model_clock_for_cap(GPUS["A100"], 400, tensor_util=ph.anchor_tensor_util, physics=ph)
        == 1275.0
    )
    # an A100 campaign without it, or an H200 run with it, is refused with the way out
    from wattflex.runs.emulator.physics import physics_for_gpu

    with pytest.raises(
        ValueError, match=r"no power curve for A100 \(GA100 die\): no calibration is given; fit one"
    ):
        physics_for_gpu(GPUS["A100"], None)
    with pytest.raises(
        ValueError, match="H200 \\(GH100 die\\): emulator.calibration was fitted on GA100 sweeps"
    ):
        physics_for_gpu(GPUS["H200"], c.to_json())
    assert physics_for_gpu(GPUS["A100"], c.to_json()) == ph


def test_a100_sweeps_fitted_with_the_anchor_recovered_give_the_sweeps_back(a100):
    """Not only the anchor: the PFI the fitted A100 physics gives each group is the sweep's, and a
    different anchor gives visibly different PFI (the fit can fail)."""
    _, sweeps, groups = a100
    facts = cal.measured_facts(pd.read_csv(sweeps).rename(columns={"throughput": "tokens_per_s"}))
    c = cal.calibrate(groups, facts, "fitted (test)")
    assert c.anchor_clock_mhz == 1275.0 and c.in_sample_mae < 1e-9
    pfi = fid.noise_free_pfi(groups, c.physics())
    assert np.allclose(pfi[facts.index], facts, atol=1e-9)
    other = fid.noise_free_pfi(groups, cal.physics_at_anchor(1150.0, die="GA100"))
    assert (other[facts.index] - facts).abs().max() > 0.02
    lo, hi = cal.anchor_grid("GA100")[[0, -1]]
    assert (
        GPUS["A100"].sm_clock_min_mhz
        < lo
        < c.anchor_clock_mhz
        < hi
        == GPUS["A100"].sm_clock_max_mhz
    )


def test_a100_sweeps_against_a_config_group_on_another_gpu_or_die_mix_are_one_line_errors(
    a100, tmp_path, capsys
):
    _, sweeps, _ = a100
    # the default config's groups run on H200 / H100
    rows = pd.read_csv(sweeps)
    rows[rows["group"] == "dense-pt-mistral24b-x8"].to_csv(tmp_path / "one.csv", index=False)
    assert main(["calibrate", "--runs", str(tmp_path / "one.csv")]) == 2
    assert (
        "group dense-pt-mistral24b-x8 ran on A100 but its config group says gpu: H200"
        in capsys.readouterr().err
    )
    # one fit, one power curve: A100 and H100 groups together are refused
    cfg = load_config(CONFIG)
    mixed = [
        g for g in cal.config_group_models(cfg) if g.id == "h100-dense-pt-mistral24b-x8"
    ] + a100[2][:1]
    facts = pd.Series({g.id: 1.2 for g in mixed})
    with pytest.raises(
        ValueError, match=r"different dies \(GA100, GH100\); fit each die's sweeps separately"
    ):
        cal.calibrate(mixed, facts, "fitted (mixed)")


def _gemm_reading(anchor_mhz: float, activity: float, gpu: str = "H200") -> dict:
    """What the GPU check would read from a GEMM of ``activity`` on a GPU whose anchor is ``anchor_mhz``."""
    ph = cal.physics_at_anchor(anchor_mhz)
    spec = GPUS[gpu]
    clock = power_model_clock_for_cap(
        spec, 700, tensor_util=activity, dram_util=ph.calib_dram_util, physics=ph
    )
    x = clock / spec.sm_clock_max_mhz
    power = (
        spec.idle_w
        + spec.mem_dyn_w * ph.calib_dram_util
        + ph.sm_dyn_w * x * voltage(x, ph) ** 2 * (ph.sm_busy_weight + ph.tensor_weight * activity)
    )
    return {
        "sm_clock_mhz": clock,
        "power_w": float(power),
        "power_limit_w": 700.0,
        "tensor_activity": activity,
        "gpu_model": gpu,
    }


def test_a_gpu_check_anchor_gemm_reading_gives_the_anchor_back(tmp_path, capsys):
    path = tmp_path / "gpu_check.json"
    path.write_text(json.dumps({"steps": {"anchor_gemm": _gemm_reading(1740.0, 0.62)}}))
    assert main(["calibrate", "--gpu-check", str(path), "-o", str(tmp_path / "c.json")]) == 0
    c = cal.read_calibration(tmp_path / "c.json")
    assert abs(c.anchor_clock_mhz - 1740.0) <= 15 and c.source.startswith("measured (")
    assert capsys.readouterr().out.startswith("anchor ")


def test_a_gemm_that_never_reached_the_limit_is_no_calibration(tmp_path, capsys):
    reading = {**_gemm_reading(1740.0, 0.62), "power_w": 540.0}
    path = tmp_path / "gpu_check.json"
    path.write_text(json.dumps({"steps": {"anchor_gemm": reading}}))
    assert main(["calibrate", "--gpu-check", str(path)]) == 2
    assert "the limit did not bind" in capsys.readouterr().err
    path.write_text(json.dumps({"steps": {}}))
    assert main(["calibrate", "--gpu-check", str(path)]) == 2
    assert "no steps.anchor_gemm reading" in capsys.readouterr().err


def test_no_fact_to_fit_on_names_the_real_reason_not_a_holdout(tmp_path, capsys):
    # one cap per group: the reason is no PFI, not "nothing left ... after --holdout" (none given)
    err = refused_runs(
        tmp_path / "onecap.csv",
        capsys,
        "dense-ft-mistral24b-x8",
        [300, 300],
        [2000, 2010],
        [10.0, 10.0],
    )
    assert (
        "onecap.csv: no group has a PFI to fit on (each needs finite power_w and throughput at 2 or more caps)"
        in err
    )
    assert "--holdout" not in err


def test_a_holdout_of_every_group_says_so(sweeps, capsys):
    assert main(["calibrate", "--runs", str(sweeps), "--holdout", ",".join(DENSE)]) == 2
    err = capsys.readouterr().err
    assert (
        f"--holdout {','.join(DENSE)}: holds out every fact group" in err
        and "nothing is left to fit on" in err
    )


def test_a_sweep_with_caps_but_no_measured_draws_is_refused_not_fitted(tmp_path, capsys):
    # the power level is read from the draws; caps alone cannot show it
    err = refused_runs(
        tmp_path / "capsonly.csv",
        capsys,
        "dense-ft-mistral24b-x8",
        [300, 700],
        [float("nan")] * 2,
        [8.0, 10.0],
    )
    assert (
        "capsonly.csv: the sweep has caps (300, 700 W, 2 runs) but no measured power draw (power_w empty)"
        in err
    )
    assert "cannot be fitted on these runs" in err
    path = tmp_path / "nopower.csv"
    pd.DataFrame(
        {"group": ["dense-ft-mistral24b-x8"] * 2, "cap_w": [300, 700], "throughput": [8.0, 10.0]}
    ).to_csv(path, index=False)
    assert main(["calibrate", "--runs", str(path)]) == 2
    assert "no measured power draw (no power_w column)" in capsys.readouterr().err


def test_a_fit_on_the_edge_of_its_grid_is_reported_unpinned(tmp_path, capsys):
    # sweeps made with an anchor below the grid: the best fit is the grid's floor, a bound
    groups = [g for g in cal.config_group_models(load_config(CONFIG)) if g.id in DENSE[:2]]
    truth = cal.physics_at_anchor(cal.ANCHOR_GRID_MHZ[0] - 60.0)
    rows = []
    for g in groups:
        power, tput = fid.noise_free_curve(g, truth)
        rows += [
            {"group": g.id, "cap_w": c, "power_w": p, "throughput": t}
            for c, p, t in zip(g.caps, power, tput)
        ]
    path, out = tmp_path / "low.csv", tmp_path / "low.json"
    pd.DataFrame(rows).to_csv(path, index=False)
    assert main(["calibrate", "--runs", str(path), "-o", str(out)]) == 0
    text = capsys.readouterr().out
    assert (
        text.startswith(f"anchor {cal.ANCHOR_GRID_MHZ[0]:.0f} MHz")
        and "unpinned: the fit landed on the edge" in text
    )
    assert cal.read_calibration(out).pinned is False
    assert cal.read_calibration(out).to_json()["pinned"] is False
