"""Cluster-wide events on SLURM (wattflex.ops.adapters.slurm): jobs and GPUs from ``squeue --json``,
the budget split over (job, node) units with a unit that stops answering counted at its
uncapped power, and the agent side (``wattflex control --budget-file``) on FAKE NVML
(tests/fakes/fake_pynvml.py: two fake H200s, 650 W each uncapped) following the
coordinator's files, holding the last budget to the event's end when the coordinator goes
quiet, then restoring. The squeue documents below are shaped after Slurm 22.05's and
23.02's ``squeue --json`` (job_state a string, then a list); the live run on the local
SLURM cluster is not here."""

import json
import threading
import time

import numpy as np
import pytest

from tests.fakes.nvml_fixture import control_popen, control_process, fake_nvml, limits_w  # noqa: F401 (fixture)
from wattflex.allocation.nested import Laminar
from wattflex.ops.adapters.slurm import (
    SlurmJob,
    agent_command,
    coordinate_once,
    expand_hostlist,
    gres_indices,
    parse_squeue,
    split_budget,
)

SQUEUE = {
    "jobs": [
        {
            "job_id": 41,
            "name": "llama-ft",
            "job_state": "RUNNING",
            "nodes": "wattflex-node[0-1]",
            "gres_detail": ["gpu:h200:2(IDX:0-1)", "gpu:h200:2(IDX:2-3)"],
        },
        {"job_id": 42, "name": "pending", "job_state": "PENDING", "nodes": "", "gres_detail": []},
        {
            "job_id": 43,
            "name": "cpu-only",
            "job_state": ["RUNNING"],
            "nodes": "wattflex-node1",
            "gres_detail": [],
        },
        {
            "job_id": 44,
            "name": "qwen-pt",
            "job_state": ["RUNNING"],
            "nodes": "wattflex-node1",
            "gres_detail": ["gpu:4(IDX:0,1,4-5)"],
        },
    ]
}


def test_hostlists_and_gres_indices():
    assert expand_hostlist("n[0-2,5],gpu7,x[08-10]") == [
        "n0",
        "n1",
        "n2",
        "n5",
        "gpu7",
        "x08",
        "x09",
        "x10",
    ]
    assert gres_indices("gpu:h200:2(IDX:0-1)") == (0, 1)
    assert gres_indices("gpu:4(IDX:0,1,4-5)") == (0, 1, 4, 5)
    assert gres_indices("gpu:0(IDX:N/A)") == ()


def test_running_gpu_jobs_are_read_from_squeue_json():
    jobs = parse_squeue(SQUEUE)
    assert jobs == [
        SlurmJob("41", "llama-ft", {"wattflex-node0": (0, 1), "wattflex-node1": (2, 3)}),
        SlurmJob("44", "qwen-pt", {"wattflex-node1": (0, 1, 4, 5)}),
    ]
    assert jobs[0].units() == ["41.wattflex-node0", "41.wattflex-node1"]


def test_only_the_jobs_of_the_partitions_asked_for_are_followed():
    doc = {
        "jobs": [
            {**j, "partition": p}
            for j, p in zip(SQUEUE["jobs"], ["gpu", "gpu,long", "gpu", "inference"])
        ]
    }
    assert [j.job_id for j in parse_squeue(doc)] == ["41", "44"]
    assert [j.job_id for j in parse_squeue(doc, ["gpu"])] == ["41"]
    assert [j.job_id for j in parse_squeue(doc, ["inference", "gpu"])] == ["41", "44"]
    assert parse_squeue(doc, ["long"]) == []  # 42 is pending there, not running


def test_a_unit_that_stops_answering_is_charged_uncapped_and_the_rest_share_the_cut():
    floor, ceil = np.array([400.0, 400, 800]), np.array([1400.0, 1400, 2800])
    share = split_budget(4500.0, floor, ceil, np.array([True, False, True]))
    assert np.isnan(share[1])
    np.testing.assert_allclose(share[[0, 2]].sum(), 4500 - 1400)  # the dead unit at its ceiling
    np.testing.assert_allclose(
        [1400 - share[0], 2800 - share[2]], [550, 550]
    )  # equal weights: equal cuts
    deep = split_budget(3500.0, floor, ceil, np.array([True, False, True]))
    np.testing.assert_allclose(deep[[0, 2]], [400, 1700])  # one unit down to its floor
    assert np.isinf(split_budget(np.inf, floor, ceil, np.ones(3, bool))).all()


def test_a_rack_whose_units_all_stop_answering_is_held_at_their_ceilings_and_the_rest_split():
    # two racks of two units; rack r1's units fall silent (their agents slow to start): the
    # split must go on over r2's units (it once failed on r1's empty water-fill)
    fam = Laminar(
        np.array([-1, -1]),
        np.array([1500.0, np.inf]),
        np.array([0, 0, 1, 1]),
        ("rack:r1", "rack:r2"),
    )
    floor, ceil = np.full(4, 200.0), np.full(4, 700.0)
    share = split_budget(2000.0, floor, ceil, np.array([False, False, True, True]), nested=fam)
    assert np.isnan(share[:2]).all()
    np.testing.assert_allclose(share[2:], [300.0, 300.0])  # 2000 less r1's 1400 uncapped
    silent = split_budget(2000.0, floor, ceil, np.zeros(4, bool), nested=fam)
    assert np.isnan(silent).all()
    assert np.isnan(
        split_budget(np.inf, floor, ceil, np.array([False, False, True, True]), nested=fam)[:2]
    ).all()


def test_the_agent_is_a_step_inside_the_jobs_allocation(tmp_path):
    job = parse_squeue(SQUEUE)[0]
    cmd = agent_command(job, "wattflex-node1", tmp_path, 5, 3600, "pfi-aware")
    assert cmd[:6] == [
        "srun",
        "--overlap",
        "--jobid=41",
        "--nodes=1",
        "--ntasks=1",
        "--nodelist=wattflex-node1",
    ]
    assert cmd[cmd.index("--budget-file") + 1] == str(tmp_path / "41.wattflex-node1.budget.json")
    assert cmd[cmd.index("--policy") + 1] == "pfi-aware"


def test_an_agent_follows_the_coordinator_and_restores_when_it_goes_quiet_fake_nvml(
    fake_nvml, tmp_path
):
    """Job 41 on node0 (its agent: wattflex control on the two fake GPUs) and node1 (an agent
    that never answers): a 30 % event on both, node1 charged uncapped."""
    job = SlurmJob("41", "llama-ft", {"node0": (0, 1), "node1": (2, 3)})
    budget = 0.7 * (1300 + 1400)  # 1890 W: node1 counted at 1400 W leaves 490 W
    stop, shares = threading.Event(), []
    hold_until = time.time() + 3600

    def coordinator():
        while not stop.is_set():
            shares.append(
                coordinate_once([job], budget, hold_until, tmp_path, 200.0, 700.0, stale_s=2.0)
            )
            time.sleep(0.2)

    t = threading.Thread(target=coordinator, daemon=True)
    t.start()
    proc = control_process(
        tmp_path,
        "--budget-file",
        str(tmp_path / "41.node0.budget.json"),
        "--load-file",
        str(tmp_path / "41.node0.load.json"),
        "--budget-stale-s",
        "1",
        "--period-s",
        "0.2",
        "--duration-s",
        "60",
        "--state-dir",
        str(tmp_path / "st"),
    )
    try:
        time.sleep(1.0)
        assert np.isnan(shares[-1]["41.node1"]) and shares[-1]["41.node0"] == pytest.approx(490.0)
        assert max(limits_w()) <= 245.0
        load = json.loads((tmp_path / "41.node0.load.json").read_text())
        assert load["unit"] == "41.node0" and load["load_w"] <= 490.0
        # the coordinator goes quiet, its last word: hold to the event's end 2 s from now
        hold_until_now = time.time() + 2.0
        stop.set()
        t.join()
        coordinate_once([job], budget, hold_until_now, tmp_path, 200.0, 700.0, stale_s=2.0)
        time.sleep(1.6)  # stale, but before the end: held
        assert max(limits_w()) <= 245.0
        deadline = time.time() + 10
        while limits_w() != [700.0, 700.0] and time.time() < deadline:
            time.sleep(0.1)
        assert limits_w() == [700.0, 700.0]  # the end passed: restored
    finally:
        stop.set()
        proc.terminate()
        proc.wait(timeout=30)
    assert limits_w() == [700.0, 700.0]


def test_the_coordinator_holds_a_30pct_event_with_a_dead_unit_counted_uncapped_fake_nvml(
    fake_nvml, tmp_path
):
    """run_coordinator with what SLURM would report (job 41 on node0, whose agent runs here on
    the two fake GPUs, and node1, whose agent never answers) and a launcher that starts the
    node0 agent as a local process instead of an srun step (started first and waited for, so
    a busy machine's slow Python start does not move the event): 30 % of the measured load
    (1300 W + node1 at 1400 W uncapped) from t = 3 s to 9 s, deadline 2 s."""
    from wattflex.ops.events import Event, Schedule
    from wattflex.ops.services.coordinator import (
        CoordinatorHooks,
        CoordinatorSettings,
        run_coordinator,
    )
    from wattflex.ops.services.mv import event_mv

    job = SlurmJob("41", "llama-ft", {"node0": (0, 1), "node1": (2, 3)})
    sched = Schedule((Event("ev30", 3.0, 9.0, fraction=0.7, deadline_s=2.0),))
    launched = []
    agent = control_popen(
        tmp_path,
        "--budget-file",
        str(tmp_path / "41.node0.budget.json"),
        "--load-file",
        str(tmp_path / "41.node0.load.json"),
        "--period-s",
        "0.2",
        "--duration-s",
        "60",
        "--state-dir",
        str(tmp_path / "st"),
    )
    try:
        up = time.time() + 60
        while not (tmp_path / "41.node0.load.json").exists() and time.time() < up:
            time.sleep(0.1)
        assert (tmp_path / "41.node0.load.json").exists(), (
            agent.stderr.read() if agent.poll() is not None else ""
        )
        rec = run_coordinator(
            CoordinatorSettings(
                sched, "measured", tmp_path, 11.0, 0.25, min_w=200.0, max_w=700.0, stale_s=1.0
            ),
            CoordinatorHooks(lambda: [job], lambda j, node: launched.append((j.job_id, node))),
        )
        deadline = time.time() + 5
        while (
            limits_w() != [700.0, 700.0] and time.time() < deadline
        ):  # the agent still runs: it is
            time.sleep(0.1)  # told no budget, and uncaps
        assert limits_w() == [700.0, 700.0] and agent.poll() is None
    finally:
        agent.terminate()
        agent.wait(timeout=30)
    t, power, budget = (np.array(x) for x in (rec.t_s, rec.power_w, rec.budget_w))
    assert power[t < 3.0][-1] == 1300 + 1400  # node1 counted at its uncapped power
    r, _ = event_mv(
        t,
        power,
        budget,
        {"event_id": "ev30", "start_s": 3.0, "end_s": 9.0, "deadline_s": 2.0},
        interval_s=1.0,
    )
    assert r["target_w"] == pytest.approx(0.7 * 2700)
    assert r["seconds_above_target_after_deadline"] == 0 and r["deadline_met"]
    assert max(rec.alive) == 1 and launched == [("41", "node0"), ("41", "node1")]
    assert limits_w() == [700.0, 700.0]


def _campaign_runs():
    """A runs table of two 2-GPU groups over caps 200-700 W, drawing 95 % of the cap: 'flex'
    keeps its tokens/s under a cap (T ~ P**0.3), 'rigid' loses them in proportion (T ~ P)."""
    import pandas as pd

    caps = np.arange(200.0, 701.0, 100.0)
    rows = []
    for group, beta in (("flex", 0.3), ("rigid", 1.0)):
        for cap in caps:
            power = 2 * 0.95 * cap
            rows.append(
                {
                    "group": group,
                    "gpus": 2,
                    "cap_w": cap,
                    "power_w": power,
                    "tokens_per_s": 2000.0 * (power / (2 * 0.95 * 700)) ** beta,
                }
            )
    return pd.DataFrame(rows)


@pytest.mark.parametrize("policy", ["pfi-aware", "curve-aware", "oracle"])
def test_a_curve_policy_cuts_the_flexible_job_deeper_and_meets_the_budget(tmp_path, policy):
    """Job 41 'flex' on node0 (answers) and node2 (dead), job 44 'rigid' and job 45 with no
    curve on node1: the dead unit is charged 1400 W, job 45 keeps its equal-weight share, the
    curve jobs share the rest by ``policy`` (flex cut deeper) and the total is the budget."""
    from wattflex.ops.adapters.slurm import ClusterSplit, group_curves, write_load

    curves = group_curves(_campaign_runs())
    assert curves.pfi[curves.index("flex")] > 1.5 > curves.pfi[curves.index("rigid")]
    jobs = [
        SlurmJob("41", "flex", {"node0": (0, 1), "node2": (0, 1)}),
        SlurmJob("44", "rigid", {"node1": (0, 1)}),
        SlurmJob("45", "other", {"node1": (2, 3)}),
    ]
    for u in ("41.node0", "44.node1", "45.node1"):
        write_load(tmp_path / f"{u}.load.json", u, 1300.0, [650.0, 650.0])
    budget = 4800.0
    eq = coordinate_once(jobs, budget, time.time() + 60, tmp_path, 200.0, 700.0, 5.0)
    share = coordinate_once(
        jobs, budget, time.time() + 60, tmp_path, 200.0, 700.0, 5.0, ClusterSplit(policy, curves)
    )
    assert np.isnan(share["41.node2"]) and np.isnan(eq["41.node2"])  # dead: no share, charged
    alive = ["41.node0", "44.node1", "45.node1"]
    assert sum(share[u] for u in alive) == pytest.approx(budget - 1400.0)  # ... at 2 x 700 W
    assert sum(eq[u] for u in alive) == pytest.approx(budget - 1400.0)
    ceiling = 2 * 0.95 * 700
    cut_flex, cut_rigid = ceiling - share["41.node0"], ceiling - share["44.node1"]
    assert cut_flex > cut_rigid + 100.0  # the flexible job gives more
    assert eq["41.node0"] == pytest.approx(eq["44.node1"])  # equal weights: the same
    # no curve: its equal part of the cut, the curve units taken at their measured uncapped power
    equal_cut = (2 * ceiling + 1400.0 - (budget - 1400.0)) / 3
    assert share["45.node1"] == pytest.approx(1400.0 - equal_cut)
    assert cut_flex + cut_rigid == pytest.approx(2 * equal_cut)
    on_disk = json.loads((tmp_path / "41.node0.budget.json").read_text())
    assert on_disk["budget_w"] == pytest.approx(share["41.node0"])


def test_jobs_match_groups_by_name_or_map_and_bad_maps_are_refused():
    from wattflex.ops.adapters.slurm import ClusterSplit, group_curves

    curves = group_curves(_campaign_runs())
    split = ClusterSplit("oracle", curves, {"45": "rigid"})
    assert split.group_of(SlurmJob("41", "flex", {})) == "flex"
    assert split.group_of(SlurmJob("45", "other", {})) == "rigid"
    assert split.group_of(SlurmJob("46", "other", {})) is None
    with pytest.raises(ValueError, match="needs the campaign's curves"):
        ClusterSplit("oracle")
    with pytest.raises(ValueError, match="not in the curves"):
        ClusterSplit("oracle", curves, {"45": "nope"})
    with pytest.raises(ValueError, match="choose from"):
        ClusterSplit("raw-dcgm", curves)


def test_cluster_control_refuses_a_bad_split_before_starting_anything(tmp_path, capsys):
    from wattflex.cli import main
    from wattflex.policies import SPLIT_POLICIES

    # the registry's split policies: those reading no per-job feature but the curves and their PFI
    assert SPLIT_POLICIES == ("equal-weight", "pfi-aware", "curve-aware", "oracle")
    sig = tmp_path / "ev.csv"
    sig.write_text("event_id,start_s,end_s,fraction\nev,10,20,0.7\n")
    base = ["cluster-control", "--signal", str(sig), "--budget-dir", str(tmp_path / "b")]
    _campaign_runs().to_csv(tmp_path / "runs.csv", index=False)
    for extra, said in (
        (["--policy", "oracle"], "give --curves"),
        (["--policy", "oracle", "--curves", str(tmp_path / "none.parquet")], "no such file"),
        (
            ["--policy", "oracle", "--curves", str(tmp_path / "runs.csv"), "--job-map", "41"],
            "expected JOB=GROUP",
        ),
        (
            ["--policy", "oracle", "--curves", str(tmp_path / "runs.csv"), "--job-map", "41=nope"],
            "not in the curves",
        ),
        (["--partition", " , "], "name at least one partition"),
    ):
        assert main(base + extra) == 2
        assert said in capsys.readouterr().err
    assert not (tmp_path / "b").exists()


def test_the_coordinator_says_which_jobs_have_no_curve_and_records_it(tmp_path):
    from wattflex.ops.adapters.slurm import ClusterSplit, group_curves, write_load
    from wattflex.ops.events import Event, Schedule
    from wattflex.ops.services.coordinator import (
        CoordinatorHooks,
        CoordinatorSettings,
        run_coordinator,
    )

    jobs = [SlurmJob("41", "flex", {"node0": (0, 1)}), SlurmJob("45", "other", {"node1": (0, 1)})]
    for u in ("41.node0", "45.node1"):
        write_load(tmp_path / f"{u}.load.json", u, 1300.0, [650.0, 650.0])
    said = []
    rec = run_coordinator(
        CoordinatorSettings(
            Schedule((Event("ev", 0.0, 5.0, fraction=0.7),)),
            "nominal",
            tmp_path,
            0.3,
            0.1,
            min_w=200.0,
            max_w=700.0,
            stale_s=30.0,
            split=ClusterSplit("oracle", group_curves(_campaign_runs())),
        ),
        CoordinatorHooks(lambda: jobs, lambda j, n: None, log=said.append),
    )
    assert rec.unit_group == {"41.node0": "flex", "45.node1": None}
    assert any("45.node1" in s and "equal-weight share" in s for s in said)
    assert any("41.node0" in s and "group flex" in s for s in said)
    # the last word is restore
    assert json.loads((tmp_path / "41.node0.budget.json").read_text())["budget_w"] is None
    # and the M&V record says which curve split each share

    from wattflex.ops.services.coordinator import mv_params

    params = mv_params({"policy": "oracle", "curves": "runs.parquet"}, rec)
    assert params["split_curve_by_unit"] == {
        "41.node0": "flex",
        "45.node1": "none: equal-weight share",
    }


def test_each_agent_holds_its_cap_changes_to_its_share_of_the_ramp_fake_nvml(fake_nvml, tmp_path):
    """An event ramped at 0.4 kW/s over job 41's four GPUs (node0 with the two fake GPUs,
    node1): each unit's budget file carries 0.2 kW/s, and the node0 agent cutting from 1300 W
    to 490 W moves its GPUs' load at most 0.2 kW/s x its 0.2 s period per step."""
    from wattflex.ops.adapters.slurm import BudgetFile

    job = SlurmJob("41", "llama-ft", {"node0": (0, 1), "node1": (2, 3)})
    from wattflex.ops.adapters.slurm import write_load

    (tmp_path / "41.node1.load.json").write_text("{}")  # never answers: charged 1400 W
    write_load(tmp_path / "41.node0.load.json", "41.node0", 1300.0, [700.0, 700.0])
    hold = time.time() + 3600
    coordinate_once([job], 1890.0, hold, tmp_path, 200.0, 700.0, stale_s=60.0, ramp_w_per_s=400.0)
    f = BudgetFile(tmp_path / "41.node0.budget.json", 60.0)
    assert f.budget_at(0.0) == pytest.approx(490.0) and f.ramp_at(0.0) == pytest.approx(200.0)
    assert json.loads((tmp_path / "41.node1.budget.json").read_text())[
        "ramp_w_per_s"
    ] == pytest.approx(200.0)
    # the agent starts before the event (no budget), as cluster-control starts it
    coordinate_once(
        [job], np.inf, -np.inf, tmp_path, 200.0, 700.0, stale_s=60.0, ramp_w_per_s=400.0
    )
    (tmp_path / "41.node0.load.json").unlink()
    proc = control_popen(
        tmp_path,
        "--budget-file",
        str(tmp_path / "41.node0.budget.json"),
        "--load-file",
        str(tmp_path / "41.node0.load.json"),
        "--budget-stale-s",
        "60",
        "--period-s",
        "0.2",
        "--duration-s",
        "20",
        "--state-dir",
        str(tmp_path / "st"),
    )
    try:
        deadline = time.time() + 60
        while not (tmp_path / "41.node0.load.json").exists() and time.time() < deadline:
            time.sleep(0.1)
        coordinate_once(
            [job], 1890.0, hold, tmp_path, 200.0, 700.0, stale_s=60.0, ramp_w_per_s=400.0
        )
        while max(limits_w()) > 245.0 and time.time() < deadline:
            time.sleep(0.2)
        assert max(limits_w()) <= 245.0  # it gets there ...
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    per_gpu: dict[int, list[tuple[float, float]]] = {}
    state = fake_nvml.state()
    for (gpu, mw), t in zip(state["set_calls"], state["set_t"]):
        per_gpu.setdefault(gpu, []).append((t, mw / 1000))
    for sets in per_gpu.values():
        # each step moves at most the ramp x the time since the last (0.2 s, more on a loaded machine)
        allowed = [
            200.0 * max(0.2, t1 - t0 + 0.05) + 5.0 for (t0, _), (t1, _) in zip(sets, sets[1:])
        ]
        cuts = [min(a, 650.0) - b for (_, a), (_, b) in zip(sets, sets[1:])]
        assert all(c <= lim for c, lim in zip(cuts, allowed)) and len(sets) > 8, (
            sets
        )  # ... at the ramp, not at once
    assert limits_w() == [700.0, 700.0]


@pytest.mark.parametrize(
    "bad",
    [
        {"budget_w": "abc"},
        {"budget_w": float("nan")},
        {"budget_w": True},
        {"budget_w": -1},
        {"ramp_w_per_s": "fast"},
        {"t_unix": "now"},
        "[1, 2]",
        "not json",
    ],
)
def test_a_budget_file_that_cannot_be_used_holds_the_last_good_budget_and_is_said_once(
    tmp_path, caplog, bad
):
    from wattflex.ops.adapters.slurm import BudgetFile, write_json_atomic

    path = tmp_path / "41.node0.budget.json"
    good = {
        "budget_w": 490.0,
        "t_unix": time.time(),
        "hold_until_unix": time.time() + 3600,
        "ramp_w_per_s": 50.0,
    }
    write_json_atomic(path, good)
    agent = BudgetFile(path, stale_s=30.0)
    assert agent.budget_at(0.0) == 490.0
    path.write_text(
        json.dumps({**good, "t_unix": time.time(), **bad}) if isinstance(bad, dict) else bad
    )
    assert [agent.budget_at(t) for t in (1.0, 2.0, 3.0)] == [
        490.0
    ] * 3  # held, not followed, not raised
    assert agent.ramp_at(3.0) == 50.0
    said = [r.getMessage() for r in caplog.records if "budget file" in r.getMessage()]
    assert len(said) == 1 and str(path) in said[0] and "holding the last good budget" in said[0]
    write_json_atomic(path, {**good, "budget_w": None, "t_unix": time.time()})
    assert agent.budget_at(4.0) == float("inf")  # a good word again: followed


def test_an_agent_given_a_budget_of_abc_mid_event_holds_its_caps_and_keeps_running_fake_nvml(
    fake_nvml, tmp_path
):
    from wattflex.ops.adapters.slurm import write_json_atomic

    path = tmp_path / "41.node0.budget.json"
    word = {
        "budget_w": 490.0,
        "t_unix": time.time(),
        "hold_until_unix": time.time() + 3600,
        "ramp_w_per_s": None,
    }
    write_json_atomic(path, word)
    proc = control_process(
        tmp_path,
        "--budget-file",
        str(path),
        "--load-file",
        str(tmp_path / "41.node0.load.json"),
        "--period-s",
        "0.2",
        "--duration-s",
        "60",
        "--state-dir",
        str(tmp_path / "st"),
    )
    try:
        for _ in range(10):  # 2 s of a bad word, rewritten each period
            write_json_atomic(path, {**word, "budget_w": "abc", "t_unix": time.time()})
            time.sleep(0.2)
        assert proc.poll() is None and max(limits_w()) <= 245.0  # still running, the event held
        write_json_atomic(path, {**word, "budget_w": None, "t_unix": time.time()})
        deadline = time.time() + 10
        while limits_w() != [700.0, 700.0] and time.time() < deadline:
            time.sleep(0.1)
        assert limits_w() == [700.0, 700.0] and proc.poll() is None  # told no budget: restored
    finally:
        proc.terminate()
        _, err = proc.communicate(timeout=30)
    assert (
        err.count('budget_w "abc": must be null or a finite number >= 0') == 1
        and "Traceback" not in err
    )


def test_the_knob_choice_is_carried_out_at_the_event_start_and_undone_at_its_end(
    tmp_path, monkeypatch
):
    """cluster-control's --knob-choice (wattflex.ops.adapters.slurm_knobs.KnobPlan): at the event's start the
    chosen job is paused (scontrol suspend, here recorded), its unit counted at idle power and given
    no share, the other unit gets the rest; at the end (and however the loop ends) it is resumed."""
    import pandas as pd

    from wattflex.ops.adapters import slurm_knobs
    from wattflex.ops.adapters.slurm import write_load
    from wattflex.ops.events import Event, Schedule
    from wattflex.ops.services.coordinator import (
        CoordinatorHooks,
        CoordinatorSettings,
        run_coordinator,
    )

    calls = []
    monkeypatch.setattr(
        slurm_knobs, "scontrol", lambda action, job, timeout_s=30.0: calls.append((action, job))
    )
    jobs = [
        SlurmJob("41", "paused-one", {"node0": (0, 1)}),
        SlurmJob("45", "capped", {"node1": (0, 1)}),
    ]
    for u in ("41.node0", "45.node1"):
        write_load(tmp_path / f"{u}.load.json", u, 1300.0, [650.0, 650.0])
    plan = slurm_knobs.KnobPlan(
        pd.DataFrame({"job": ["paused-one", "capped"], "knob": ["pause", "cap"]}),
        75.0,
        log=lambda m: None,
    )
    t = iter(np.arange(0.0, 100.0, 0.1))
    launched = []
    # as squeue --states=RUNNING: a SUSPENDED job is not listed
    rec = run_coordinator(
        CoordinatorSettings(
            Schedule((Event("ev", 0.25, 0.55, fraction=0.4),)),
            "nominal",
            tmp_path,
            0.75,
            0.1,
            min_w=200.0,
            max_w=700.0,
            stale_s=30.0,
        ),
        CoordinatorHooks(
            lambda: [j for j in jobs if j.job_id not in plan.done],
            lambda j, n: launched.append(n),
            clock=lambda: next(t),
            sleep=lambda s: None,
            knobs=plan,
        ),
    )
    assert calls == [("pause", "41"), ("resume", "41")]
    assert launched == ["node0", "node1"]  # the paused job's agent is not started again
    during = [k for k, b in enumerate(rec.budget_w) if np.isfinite(b)]
    assert during
    for k in during:  # the paused unit at its 2 GPUs' idle power; the other unit keeps the rest
        assert rec.power_w[k] == pytest.approx(150.0 + 1300.0)
    share = slurm_knobs.KnobPlan(plan.choice, 75.0)
    assert share.charged_w(jobs[0], "node0") is None  # outside an event: as measured
    # in the event the budget 0.4 x 2800 W = 1120 W: 150 W charged to the paused unit, 970 W to the other
    from wattflex.ops.adapters.slurm import coordinate_once

    monkeypatch.setattr(slurm_knobs, "scontrol", lambda *a, **k: None)
    share.start(jobs)
    got = coordinate_once(
        jobs,
        1120.0,
        time.time() + 60,
        tmp_path,
        200.0,
        700.0,
        30.0,
        charged={"41.node0": share.charged_w(jobs[0], "node0")},
    )
    assert np.isnan(got["41.node0"]) and got["45.node1"] == pytest.approx(970.0)


def test_calls_end_even_when_the_coordinator_fails(tmp_path, monkeypatch):
    import pandas as pd

    from wattflex.ops.adapters import slurm_knobs
    from wattflex.ops.events import Event, Schedule
    from wattflex.ops.services.coordinator import (
        CoordinatorHooks,
        CoordinatorSettings,
        run_coordinator,
    )

    calls = []
    monkeypatch.setattr(
        slurm_knobs, "scontrol", lambda action, job, timeout_s=30.0: calls.append((action, job))
    )
    jobs = [SlurmJob("41", "req", {"node0": (0,)})]
    plan = slurm_knobs.KnobPlan(
        pd.DataFrame({"job": ["41"], "knob": ["requeue"]}), 75.0, log=lambda m: None
    )
    n = iter(range(100))

    def discover():
        if next(n) >= 2:
            raise RuntimeError("coordinator broke")
        return jobs

    with pytest.raises(RuntimeError, match="coordinator broke"):
        run_coordinator(
            CoordinatorSettings(
                Schedule((Event("ev", 0.0, 50.0, fraction=0.4),)),
                "nominal",
                tmp_path,
                60.0,
                0.1,
                min_w=200.0,
                max_w=700.0,
                stale_s=30.0,
            ),
            CoordinatorHooks(discover, lambda j, n: None, sleep=lambda s: None, knobs=plan),
        )
    assert calls == [("requeuehold", "41"), ("release", "41")] and plan.requeued == {"41"}


def test_an_agent_locks_the_clock_its_budget_file_names_and_resets_it_after_fake_nvml(
    fake_nvml, tmp_path
):
    """The knob menu's clock through cluster-control's files: while the unit's budget file names
    clock_mhz the agent (wattflex control on two FAKE GPUs) holds both GPUs locked there beside its
    budget; once the file names none, the lock is reset and its state file gone; a SIGTERM mid-lock
    resets it too."""
    job = SlurmJob("41", "clocked", {"node0": (0, 1)})
    locks = lambda: [g["locked_mhz"] for g in fake_nvml.state()["gpus"]]  # noqa: E731
    hold_until = time.time() + 3600

    def write(clocks):
        coordinate_once([job], 1000.0, hold_until, tmp_path, 200.0, 700.0, 30.0, clocks=clocks)

    def wait_for(what, predicate):
        deadline = time.time() + 20
        while not predicate() and time.time() < deadline:
            time.sleep(0.05)
        assert predicate(), what

    write({"41.node0": 1200.0})
    doc = json.loads((tmp_path / "41.node0.budget.json").read_text())
    assert doc["clock_mhz"] == 1200.0
    for last in ("file", "signal"):
        proc = control_popen(
            tmp_path,
            "--budget-file",
            str(tmp_path / "41.node0.budget.json"),
            "--period-s",
            "0.2",
            "--duration-s",
            "60",
            "--state-dir",
            str(tmp_path / "st"),
        )
        try:
            wait_for("locked", lambda: locks() == [1200, 1200])
            assert list((tmp_path / "st").glob("clocks-*.json"))
            if last == "file":
                write({})  # the event's end: no clock named
                wait_for("lock reset", lambda: locks() == [None, None])
                assert not list((tmp_path / "st").glob("clocks-*.json"))
                write({"41.node0": 1200.0})
                wait_for("locked again", lambda: locks() == [1200, 1200])
            proc.terminate()
            proc.wait(timeout=30)
        finally:
            if proc.poll() is None:
                proc.kill()
        assert locks() == [None, None] and limits_w() == [700.0, 700.0]
        assert not list((tmp_path / "st").glob("*.json"))


def test_a_clock_choice_names_its_clock_in_the_units_files_during_the_event_only(
    tmp_path, monkeypatch
):
    import pandas as pd

    from wattflex.ops.adapters import slurm_knobs
    from wattflex.ops.events import Event, Schedule
    from wattflex.ops.services.coordinator import (
        CoordinatorHooks,
        CoordinatorSettings,
        run_coordinator,
    )

    monkeypatch.setattr(slurm_knobs, "scontrol", lambda *a, **k: None)
    jobs = [SlurmJob("41", "clocked", {"node0": (0,)}), SlurmJob("45", "capped", {"node1": (0,)})]
    plan = slurm_knobs.KnobPlan(
        pd.DataFrame(
            {"job": ["clocked", "capped"], "knob": ["clock", "cap"], "clock_mhz": [1200.0, None]}
        ),
        75.0,
        log=lambda m: None,
    )
    t = iter(np.arange(0.0, 100.0, 0.1))
    named = []

    def discover():
        doc = tmp_path / "41.node0.budget.json"
        if doc.exists():
            named.append(json.loads(doc.read_text())["clock_mhz"])
        return jobs

    run_coordinator(
        CoordinatorSettings(
            Schedule((Event("ev", 0.25, 0.55, fraction=0.6),)),
            "nominal",
            tmp_path,
            0.75,
            0.1,
            min_w=200.0,
            max_w=700.0,
            stale_s=30.0,
        ),
        CoordinatorHooks(
            discover, lambda j, n: None, clock=lambda: next(t), sleep=lambda s: None, knobs=plan
        ),
    )
    # each file read at the next period: no clock before the event, its clock in it, none after
    assert named[0] is None and 1200.0 in named and set(named) == {None, 1200.0}
    assert json.loads((tmp_path / "45.node1.budget.json").read_text())["clock_mhz"] is None
    assert json.loads((tmp_path / "41.node0.budget.json").read_text())["clock_mhz"] is None
    assert plan.clocks == {}


def test_a_clock_choice_without_its_clock_is_refused(tmp_path):
    from wattflex.ops.adapters.slurm_knobs import read_choice

    path = tmp_path / "choice.csv"
    path.write_text("job,knob,clock_mhz\n41,clock,\n42,cap,\n")
    with pytest.raises(ValueError, match="job.s. 41 take the clock knob but name no clock_mhz"):
        read_choice(path)
    path.write_text("job,knob,clock_mhz\n41,clock,1200\n42,cap,\n")
    assert read_choice(path)["clock_mhz"].tolist()[0] == 1200.0
