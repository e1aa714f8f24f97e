"""The flexibility statement (wattflex.ops.services.statement) on small campaigns whose answer is
known: linear curves, a known floor, known SEMs."""

import json

import numpy as np
import pandas as pd
import pytest

from tests.fakes.nvml_fixture import fake_nvml  # noqa: F401 (fixture)
from wattflex.ops.clustersim import ClusterConfig
from wattflex.ops.services import statement as st


def runs_table(sem: float = 0.0) -> pd.DataFrame:
    """Two groups of one job each: pt draws 1000 W uncapped, 400 W at its floor, tokens/s
    linear in power (100 -> 40); lora 500 W -> 300 W, 50 -> 45 (cheap to cap)."""
    rows = []
    for group, task, pw, tp in (
        ("pt", "pt", (400, 700, 1000), (40, 70, 100)),
        ("lora", "lora", (300, 400, 500), (45, 48, 50)),
    ):
        for cap, p, t in zip((200, 450, 700), pw, tp):
            rows.append(
                {
                    "group": group,
                    "task": task,
                    "gpus": 1,
                    "cap_w": cap,
                    "power_w": p,
                    "tokens_per_s": t,
                    "power_w_sem": sem,
                    "tokens_per_s_sem": sem,
                }
            )
    return pd.DataFrame(rows)


SITE = {"jobs_per_workload": 2, "mix": "random", "pretraining_fraction": 0.5, "seed": 1}
SETTINGS = st.StatementSettings(
    **SITE, depths=(0.1, 0.3, 0.6), n_draws=20, history_days=12, baseline=st.BaselineRule(days=10)
)


def test_one_job_of_each_costs_what_the_curves_say():
    groups = st.groups_from_runs(runs_table())
    s = st.StatementSettings(
        **{**SITE, "seed": 3},
        depths=(0.1, 0.3, 0.6),
        n_draws=1,
        history_days=12,
        baseline=st.BaselineRule(days=10),
    )
    shed = st.shed_by_depth(groups, s).set_index("depth")
    # the drawn site's uncapped power is the sum of its two jobs' (2000, 1500 or 1000 W)
    site_w = shed.loc[0.1, "site_kw"] * 1e3
    assert site_w in (pytest.approx(2000), pytest.approx(1500), pytest.approx(1000))
    assert shed.loc[0.1, "shed_kw"] == pytest.approx(0.1 * site_w / 1e3)
    # caps stop at the floors: 60 % is never reachable (floors are 40 % and 60 % of uncapped)
    assert shed.loc[0.6, "caps_feasible_share"] == 0.0 and np.isnan(
        shed.loc[0.6, "tokens_lost_per_h"]
    )


def test_a_site_of_one_linear_family_loses_in_proportion():
    runs = runs_table()
    groups = st.groups_from_runs(runs[runs["group"] == "pt"])
    s = st.StatementSettings(
        **SITE, depths=(0.3,), n_draws=3, history_days=12, baseline=st.BaselineRule(days=10)
    )
    row = st.shed_by_depth(groups, s).iloc[0]
    # two pt jobs: 2000 W; a 600 W cut on a 0.1 tok/s-per-W line costs 60 tok/s of 200
    assert row["shed_kw"] == pytest.approx(0.6) and row["tokens_lost_per_h"] == pytest.approx(
        60 * 3600
    )
    assert row["throughput_loss"] == pytest.approx(0.3) and row["caps_max_depth"] == pytest.approx(
        0.6
    )
    assert row["caps_feasible_share"] == 1.0


def test_ranges_widen_with_the_sems_and_hold_the_median():
    clean = st.shed_by_depth(st.groups_from_runs(runs_table(0.0)), SETTINGS)
    noisy = st.shed_by_depth(st.groups_from_runs(runs_table(3.0)), SETTINGS)
    width = lambda df: (df["tokens_lost_per_h_p95"] - df["tokens_lost_per_h_p5"]).iloc[0]  # noqa: E731
    assert width(noisy) > width(clean)
    assert (noisy["throughput_loss_p5"] <= noisy["throughput_loss"]).all()
    assert (noisy["throughput_loss"] <= noisy["throughput_loss_p95"]).all()


def test_events_and_calendar_scale_with_hours():
    shed = st.shed_by_depth(st.groups_from_runs(runs_table()), SETTINGS)
    ev = st.events_table(shed, SETTINGS)
    one = ev[(ev["depth"] == 0.1) & (ev["hours"] == 1.0)].iloc[0]
    four = ev[(ev["depth"] == 0.1) & (ev["hours"] == 4.0)].iloc[0]
    assert four["tokens_lost"] == pytest.approx(4 * one["tokens_lost"])
    cal = st.calendar_table(shed, SETTINGS)
    row = cal[(cal["curtailment_rate"] == 0.005) & (cal["depth"] == 0.1)].iloc[0]
    assert row["hours_per_year"] == pytest.approx(43.8) and row["events_per_year"] == pytest.approx(
        21.9
    )
    assert row["tokens_lost_per_year"] == pytest.approx(43.8 * one["tokens_lost"])


def test_response_and_notice_come_from_mv_records():
    mv = pd.DataFrame(
        {
            "policy": ["a", "a", "b"],
            "response_time_s": [20.0, 40.0, 90.0],
            "max_ramp_down_w_per_s": [5e3, 7e3, 1e3],
            "max_ramp_up_w_per_s": [1e3, 1e3, 1e3],
            "restore_time_s": [30.0, None, 60.0],
            "deadline_met": [True, True, False],
            "sample_s": [1.0, 1.0, 5.0],
        }
    )
    resp = st.response_table(mv, "a")
    assert resp.iloc[0]["response_time_s_max"] == 40.0 and resp.iloc[0][
        "ramp_down_kw_per_s"
    ] == pytest.approx(6.0)
    assert resp.iloc[0]["sample_s"] == 1.0
    notice = st.notice_table(resp, SETTINGS).set_index("notice_s")
    assert not notice.loc[30.0, "met_from_start"] and notice.loc[30.0, "short_for_s"] == 10.0
    assert notice.loc[60.0, "met_from_start"]
    assert st.response_table(None).empty


def test_a_flat_history_has_exact_meter_baselines():
    groups = st.groups_from_runs(runs_table())
    t = np.arange(0.0, 12 * st.DAY_S, 600.0)
    flat = np.full(len(t), 5e3)
    err = st.baseline_errors(t, flat, flat, SETTINGS)
    assert len(err) == 2  # days 10 and 11 have 10 days before them
    assert np.allclose(err.filter(like="_error_pct").to_numpy(), 0.0)
    assert groups.names


def test_the_site_history_follows_the_job_stream():
    groups = st.groups_from_runs(runs_table())
    cc = ClusterConfig(gpus=8, mean_interarrival_s=3600.0)
    p_max, _ = st.curve_powers(groups, np.random.default_rng(0))
    t, load = st.site_history(
        groups, p_max, cc, SETTINGS, idle_w_per_gpu=50.0, rng=np.random.default_rng(1)
    )
    assert len(t) == 12 * 1440
    assert load.min() >= 8 * 50.0 - 1e-9  # never below all GPUs idle
    assert load.max() <= 8 * 1000.0 + 1e-9  # never above 8 uncapped jobs (1 GPU each)
    assert load.std() > 0  # jobs come and go


def test_openadr3_objects_validate_with_toadr3():
    from toadr3.models import Program, Report

    shed = st.shed_by_depth(st.groups_from_runs(runs_table()), SETTINGS)
    resp = st.response_table(
        pd.DataFrame(
            {
                "policy": ["a"],
                "response_time_s": [20.0],
                "max_ramp_down_w_per_s": [1.0],
                "max_ramp_up_w_per_s": [1.0],
                "restore_time_s": [5.0],
                "deadline_met": [True],
            }
        )
    )
    program, report = st.openadr3_objects(shed, resp, SETTINGS, "demo", "emulated")
    prog = Program.model_validate(json.loads(json.dumps(program)))
    rep = Report.model_validate(json.loads(json.dumps(report)))
    # every field given is one the specification's models know and read back unchanged
    for ours, model in ((program, prog), (report, rep)):
        back = model.model_dump(mode="json", by_alias=True, exclude_none=True)
        assert set(ours) <= set(back)
        assert {k: back[k] for k in ours if k not in ("resources",)} == {
            k: v for k, v in ours.items() if k != "resources"
        }
    assert prog.program_name == "wattflex-demo" and rep.program_id == "wattflex-demo"
    kw = rep.resources[0].intervals[0].payloads[0].values[0]
    sure = shed[shed["caps_feasible_share"] >= 0.95]
    assert kw == pytest.approx(sure["shed_kw_p5"].max(), abs=1e-3)
    assert len(rep.resources[0].intervals) == len(SETTINGS.durations_h)


def test_settings_out_of_range_are_refused():
    with pytest.raises(ValueError, match="depths"):
        st.StatementSettings(**SITE, depths=(1.2,))
    with pytest.raises(ValueError, match="history_days"):
        st.StatementSettings(**SITE, history_days=5)
    allocation = {
        "jobs_per_workload": 7,
        "headline": {"mix": "production"},
        "production": {"pretraining_fraction": 0.3},
        "seed": 5,
    }
    s = st.StatementSettings.from_config(
        {"depths": [0.2, 0.4], "baseline": {"days": 5}, "history_days": 8}, allocation
    )
    assert (
        s.depths == (0.2, 0.4)
        and s.baseline.days == 5
        and s.jobs_per_workload == 7
        and s.mix == "production"
    )


def test_the_defaults_are_the_schemas():
    from wattflex.schema import section_defaults

    s, d = st.StatementSettings(**SITE), section_defaults("statement")
    assert list(s.depths) == d["depths"] and list(s.curtailment_rates) == d["curtailment_rates"]
    assert s.baseline.days == d["baseline"]["days"] and s.event_hours == d["event_hours"]


def statement_inputs(tmp_path):
    """A runs.parquet of :func:`runs_table` and the default config with fewer draws."""
    from pathlib import Path

    from wattflex.provenance import write_parquet

    repo = Path(__file__).resolve().parents[3]
    runs = runs_table(1.0).assign(backend="emulated", set="headline", gpu_model="H200")
    write_parquet(runs, tmp_path / "runs.parquet")
    cfg = tmp_path / "cfg.yaml"
    cfg.write_text(
        (repo / "config" / "config.yaml").read_text().replace("n_draws: 200", "n_draws: 20")
        + "\nstatement: {n_draws: 4, history_days: 12}\n"
    )
    return cfg


def test_offer_statement_writes_every_file(tmp_path, run_cli):
    from wattflex.provenance import read_csv

    cfg = statement_inputs(tmp_path)
    res = run_cli("offer", "runs.parquet", "--configfile", cfg, "--statement", "st", cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    for name in (
        "shed.csv",
        "calendar.csv",
        "baselines.csv",
        "openadr3_program.json",
        "statement.md",
    ):
        assert (tmp_path / "st" / name).is_file() and (
            tmp_path / "st" / f"{name}.meta.json"
        ).is_file()
    shed = read_csv(tmp_path / "st" / "shed.csv")
    assert len(shed) == 12 and "caps_feasible_share" in shed
    page = (tmp_path / "st" / "statement.md").read_text()
    assert (
        "EMULATED" in page and "production mix needs both" not in page
    )  # pt and lora groups: production works
    assert "no controlled events" in page  # no --mv


def test_offer_statement_refuses_a_curve_table(tmp_path, run_cli):
    pd.DataFrame({"job": ["a", "a"], "power_w": [1, 2], "throughput": [1, 2]}).to_csv(
        tmp_path / "c.csv", index=False
    )
    res = run_cli("offer", "c.csv", "--statement", "st", cwd=tmp_path)
    assert res.returncode == 2 and "runs.parquet" in res.stderr and not (tmp_path / "st").exists()


PLAN = pd.DataFrame(
    {"group": ["pt", "lora"], "startup_s": [120.0, 60.0], "checkpoint_write_s": [30.0, 10.0]}
)
DEEP = st.StatementSettings(
    **SITE,
    depths=(0.1,),
    n_draws=2,
    history_days=12,
    baseline=st.BaselineRule(days=10),
    deep_depths=(0.3, 0.8),
    deep_notice_s=600.0,
)


def test_deep_events_past_the_caps_floor_take_the_cheapest_mix():
    groups = st.groups_from_runs(runs_table())
    jobs = st.knob_jobs(groups, np.array([0, 1]), PLAN, 1800.0, np.random.default_rng(0))
    knobs, per_job = st.deep_events(jobs, DEEP)
    by = knobs.set_index(["depth", "strategy"])
    # floors: 400 + 300 of 1500 W, so caps reach 53 % and not 80 %
    assert by.loc[(0.3, "caps only"), "feasible"] and not by.loc[(0.8, "caps only"), "feasible"]
    mix = by.loc[(0.8, "chosen mix")]
    assert (
        mix["feasible"] and mix["tokens_lost"] <= by.loc[(0.8, "pause only"), "tokens_lost"] + 1e-6
    )
    assert (
        by.loc[(0.3, "chosen mix"), "tokens_lost"]
        <= by.loc[(0.3, "caps only"), "tokens_lost"] + 1e-6
    )
    assert set(per_job["depth"]) == {0.8} and per_job["why"].map(bool).all()
    assert any("cannot" in line for line in st.knob_lines(knobs))


def test_two_power_sets_on_one_job_stream_are_each_ones_own_history():
    groups = st.groups_from_runs(runs_table())
    cc = ClusterConfig(gpus=8, mean_interarrival_s=3600.0)
    p_max, known = st.curve_powers(groups, np.random.default_rng(0))
    t, both = st.site_history(
        groups, np.stack([p_max, known + 10.0]), cc, SETTINGS, 50.0, np.random.default_rng(1)
    )
    _, one = st.site_history(groups, p_max, cc, SETTINGS, 50.0, np.random.default_rng(1))
    _, other = st.site_history(groups, known + 10.0, cc, SETTINGS, 50.0, np.random.default_rng(1))
    assert (
        both.shape == (2, len(t))
        and np.array_equal(both[0], one)
        and np.array_equal(both[1], other)
    )


def with_clock_group(runs: pd.DataFrame) -> pd.DataFrame:
    """``runs_table`` and a ``knob: clock`` group that ran pt's job at three locked clocks, all
    at the default limit: 400 W -> 60 tokens/s, 700 W -> 90, 1000 W -> 100 (the clock's
    slowdown shallower than the cap's, 40 and 70 at those powers)."""
    clock = pd.DataFrame(
        {
            "group": "pt-clk",
            "task": "pt",
            "gpus": 1,
            "knob": "clock",
            "cap_w": 700,
            "clock_mhz": [795.0, 1395.0, 1980.0],
            "power_w": [400.0, 700.0, 1000.0],
            "tokens_per_s": [60.0, 90.0, 100.0],
            "power_w_sem": 0.0,
            "tokens_per_s_sem": 0.0,
        }
    )
    return pd.concat([runs.assign(knob="cap"), clock], ignore_index=True)


def test_a_clock_group_is_its_jobs_clock_curve_not_a_group_of_its_own():
    groups = st.groups_from_runs(with_clock_group(runs_table()))
    assert sorted(groups.names) == ["lora", "pt"]
    pt, lora = groups.names.index("pt"), groups.names.index("lora")
    assert groups.clock_groups[pt] == "pt-clk" and groups.clock_groups[lora] == ""
    P, T = groups.clocks[pt]
    assert list(P) == [400.0, 700.0, 1000.0] and list(T) == [60.0, 90.0, 100.0]
    assert groups.clocks[lora] is None and list(groups.curves.throughput[pt]) == [40, 70, 100]


def test_the_deep_event_menu_takes_the_clock_where_it_is_cheaper():
    groups = st.groups_from_runs(with_clock_group(runs_table()))
    jobs = st.knob_jobs(groups, np.array([0, 1]), PLAN, 1800.0, np.random.default_rng(0))
    knobs, per_job = st.deep_events(jobs, DEEP)
    by = knobs.set_index(["depth", "strategy"])
    # 450 W of 1500: lora's cap (0.025 tok/s per W, 200 W) then pt's clock (1/30 per W, 250 W)
    # = 5 + 8.33 tok/s; caps only take pt's cap at 0.1 per W: 5 + 25 tok/s
    hour = 3600.0 * DEEP.event_hours
    assert by.loc[(0.3, "caps + clock"), "tokens_lost"] == pytest.approx((5 + 250 / 30) * hour)
    assert by.loc[(0.3, "caps only"), "tokens_lost"] == pytest.approx(30 * hour)
    assert by.loc[(0.3, "chosen mix"), "tokens_lost"] == pytest.approx((5 + 250 / 30) * hour)
    assert "clock 1" in by.loc[(0.3, "chosen mix"), "knobs"]
    assert not by.loc[(0.8, "caps + clock"), "feasible"]  # the clock's floor is 400 W too
    assert any("caps and clock locks" in line for line in st.knob_lines(knobs))
    # the 80 % cut's per-job table prices the clock beside the other knobs
    pt = per_job[per_job["job"].str.endswith(":pt")].iloc[0]
    assert "clock" in pt["why"] and "tok/kWh" in pt["why"]


def test_the_statement_names_its_clock_curves_and_says_when_there_are_none():
    cc = ClusterConfig(gpus=8, mean_interarrival_s=3600.0)
    s = st.StatementSettings(
        **SITE, depths=(0.1, 0.3), n_draws=4, history_days=12, baseline=st.BaselineRule(days=10)
    )
    with_clock = st.build_statement(with_clock_group(runs_table()), None, s, cc, "c", plan=PLAN)
    assert "clock-lock curves (knob: clock groups) for pt from pt-clk" in with_clock.notes
    assert "caps + clock" in set(with_clock.tables["knobs"]["strategy"])
    without = st.build_statement(runs_table(), None, s, cc, "c", plan=PLAN)
    assert any("no knob: clock group" in n for n in without.notes)
    assert "caps + clock" not in set(without.tables["knobs"]["strategy"])


@pytest.mark.fake_gpu
def test_offer_statement_takes_a_real_control_runs_mv_fake_nvml(fake_nvml, tmp_path, run_cli):
    """``wattflex control`` on FAKE NVML (two fake H200s, 650 W each uncapped) follows a 30 %
    event and writes mv.json and mv_intervals.csv (control.mv.write_run_mv); the statement
    reads its response time and ramp from either, and refuses anything else in one line."""
    from wattflex.provenance import read_csv, read_json

    ev = tmp_path / "events.json"
    ev.write_text(
        json.dumps(
            {
                "events": [
                    {"event_id": "ev", "start_s": 0.5, "end_s": 2.0, "fraction": 0.7},
                ]
            }
        )
    )
    control = run_cli(
        "control",
        "--signal",
        ev,
        "--period-s",
        "0.1",
        "--state-dir",
        tmp_path / "st",
        "--mv-out",
        tmp_path / "mv",
        "--duration-s",
        "3",
        cwd=tmp_path,
    )
    assert control.returncode == 0, control.stderr
    event = read_json(tmp_path / "mv" / "mv.json")["events"][0]
    cfg = statement_inputs(tmp_path)
    for k, given in enumerate(("mv/mv.json", "mv/mv_intervals.csv")):
        res = run_cli(
            "offer", "runs.parquet", "--configfile", cfg, "--statement", f"st{k}", "--mv", given,
            cwd=tmp_path,
        )  # fmt: skip
        assert res.returncode == 0, res.stderr
        resp = read_csv(tmp_path / f"st{k}" / "response.csv").iloc[0]
        assert resp["source"] == "real" and resp["policy"] == "equal-weight"
        assert resp["response_time_s_max"] == pytest.approx(event["response_time_s"])
        assert resp["ramp_down_kw_per_s"] == pytest.approx(event["max_ramp_down_w_per_s"] / 1e3)
        assert resp["sample_s"] == pytest.approx(event["sample_s"])
        page = (tmp_path / f"st{k}" / "statement.md").read_text()
        assert "In 1 real controlled event(s) (policy equal-weight" in page
    for bad in ("runs.parquet", "mv/timeseries.csv", "events.json"):
        res = run_cli(
            "offer", "runs.parquet", "--configfile", cfg, "--statement", "bad", "--mv", bad,
            cwd=tmp_path,
        )  # fmt: skip
        assert res.returncode == 2 and res.stderr.count("\n") == 1, res.stderr
        assert f"--mv {bad}" in res.stderr and "mv.json" in res.stderr


def test_the_figure_shows_the_deep_events_and_says_which_strategy_cannot():
    from wattflex.plots.grid import statement_figure
    from wattflex.plots.style import figure_problems

    cc = ClusterConfig(gpus=8, mean_interarrival_s=3600.0)
    stmt = st.build_statement(runs_table(), None, DEEP, cc, "c", plan=PLAN)
    t = stmt.tables
    fig = statement_figure(
        t["shed"], t["calendar"], t["baseline_days"], "emulated", 0.1, t["knobs"]
    )
    panel = next(a for a in fig.axes if "knob strategy" in a.get_title())
    knobs = t["knobs"]
    assert len(panel.patches) == len(knobs)  # one bar per depth and strategy
    marks = [x for x in panel.texts if x.get_text().strip() == "infeasible"]
    assert len(marks) == (~knobs["feasible"].astype(bool)).sum() > 0
    assert any("EMULATED" in x.get_text() for x in fig.texts)
    assert figure_problems(fig) == []  # its bands and error bars named, no label struck
