"""The knob menu: the MILP's mix is the brute-force optimum on small random
instances (non-concave curves, clock curves, every knob), caps alone stop at the floors while
the mix goes deeper, and the notice and pause limit change what a knob costs."""

import itertools

import numpy as np
import pytest

from wattflex.allocation import knobs as kn

from .test_oracle import random_curves


def random_jobs(rng, n, clock=False, K=5, concave=False):
    """``n`` jobs with cap curves of ``K`` points (clock curves of ``K - 1``), every knob."""
    P, T = random_curves(rng, (n,), K=K, concave=concave)
    Pc, Tc = random_curves(rng, (n,), K=K - 1, concave=concave) if clock else (None, None)
    jobs = []
    for i in range(n):
        ck = None
        if clock:  # a clock curve on the same uncapped point, its own floor and shape
            scale = P[i, -1] / Pc[i, -1]
            pc = Pc[i] * scale
            tc = T[i, -1] - (Tc[i, -1] - Tc[i]) * rng.uniform(0.3, 1.5)
            ck = (pc, tc)
        jobs.append(
            kn.Job(
                f"j{i}",
                (P[i], T[i]),
                idle_w=rng.uniform(20, 150),
                restart_s=rng.uniform(0, 600),
                checkpoint_write_s=rng.uniform(5, 120),
                since_checkpoint_s=rng.uniform(0, 1800),
                clock=ck,
                requeue_residual_w=rng.choice([0.0, 30.0]),
            )
        )
    return jobs


def best_curves(curves, budget):
    """Max throughput of curve jobs under ``budget`` by vertex enumeration: an optimum has every
    job but one on a vertex, the free one takes what is left (clipped to its range)."""
    if not curves:
        return 0.0 if budget >= -1e-9 else None
    best = None
    for free in range(len(curves)):
        others = [c for k, c in enumerate(curves) if k != free]
        for verts in itertools.product(*[range(len(c[0])) for c in others]):
            p_others = sum(c[0][v] for c, v in zip(others, verts))
            t_others = sum(c[1][v] for c, v in zip(others, verts))
            Pf, Tf = curves[free]
            p = min(budget - p_others, Pf[-1])
            if p < Pf[0] - 1e-9:
                continue
            val = t_others + np.interp(p, Pf, Tf)
            best = val if best is None or val > best else best
    return best


def brute_force(jobs, event, knobs):
    """Least tokens lost over every assignment of a knob to each job."""
    budget = sum(j.ceiling_w for j in jobs) - event.depth_w
    menus = [{o.knob: o for o in kn.candidates(j, event, knobs)} for j in jobs]
    best = None
    for pick in itertools.product(*[list(m) for m in menus]):
        fixed_w = fixed_lost = 0.0
        curves = []
        for job, m, k in zip(jobs, menus, pick):
            o = m[k]
            if k in kn.CURVE_KNOBS:  # tokens lost = duration * (T_max - T): maximise T
                curves.append((o.power_w, -o.tokens_lost))
            else:
                fixed_w += o.power_w[0]
                fixed_lost += o.tokens_lost[0]
        t = best_curves(curves, budget - fixed_w)
        if t is None:
            continue
        lost = fixed_lost - t
        best = lost if best is None or lost < best else best
    return best


@pytest.mark.parametrize("seed", range(12))
def test_the_mix_is_the_brute_force_optimum(seed):
    rng = np.random.default_rng(seed)
    jobs = random_jobs(rng, 3, clock=seed % 2 == 1)
    site = sum(j.ceiling_w for j in jobs)
    event = kn.Event(
        depth_w=rng.uniform(0.2, 0.95) * site,
        duration_s=rng.uniform(600, 7200),
        notice_s=rng.choice([0.0, 300.0]),
    )
    for knobs in (kn.KNOBS, ("cap",), ("pause",), ("requeue", "pause"), ("cap", "pause")):
        want = brute_force(jobs, event, knobs)
        got = kn.choose(jobs, event, knobs)
        if want is None:
            assert not got.feasible and "infeasible" in got.reason
            continue
        assert got.feasible, got.reason
        assert got.tokens_lost == pytest.approx(want, rel=1e-7, abs=1e-3)
        assert got.power_w <= got.budget_w * (1 + 1e-9)
        assert set(got.table["knob"]) <= set(knobs) | {"none"}


def test_caps_stop_at_the_floors_and_the_mix_goes_deeper():
    rng = np.random.default_rng(7)
    jobs = random_jobs(rng, 6)
    site = sum(j.ceiling_w for j in jobs)
    floors = sum(j.cap[0][0] for j in jobs)
    deep = kn.Event(depth_w=site - 0.8 * floors, duration_s=3600)
    caps = kn.choose(jobs, deep, ("cap",))
    assert not caps.feasible and "deepest cut" in caps.reason
    mix = kn.choose(jobs, deep)
    assert mix.feasible and mix.power_w <= site - deep.depth_w + 1e-6
    assert set(mix.table["knob"]) & {"pause", "requeue"}
    pause_only = kn.choose(jobs, deep, ("pause",))
    assert pause_only.feasible and mix.tokens_lost <= pause_only.tokens_lost + 1e-6
    # pause only pauses the jobs needed: the others run uncapped (and lose nothing)
    assert "none" in set(pause_only.table["knob"]) and set(pause_only.table["knob"]) <= {
        "pause",
        "none",
    }
    # every row says why: the taken knob marked among the priced options
    assert all("*" in why for why, k in zip(mix.table["why"], mix.table["knob"]) if k != "none")


def test_notice_lets_a_requeue_write_a_fresh_checkpoint():
    job = kn.Job(
        "a",
        (np.array([200.0, 700.0]), np.array([50.0, 100.0])),
        idle_w=75,
        restart_s=100,
        checkpoint_write_s=30,
        since_checkpoint_s=900,
    )
    cost = lambda notice: kn.options(job, kn.Event(500, 600, notice))[3].tokens_lost[0]  # noqa: E731
    assert cost(0) == pytest.approx(100 * (900 + 100 + 600))
    assert cost(60) == pytest.approx(100 * (30 + 100 + 600))


def test_a_pause_longer_than_the_job_allows_is_off_the_menu():
    job = kn.Job(
        "a",
        (np.array([200.0, 700.0]), np.array([50.0, 100.0])),
        idle_w=75,
        restart_s=100,
        checkpoint_write_s=30,
        since_checkpoint_s=0,
        max_pause_s=600,
    )
    short, long = kn.Event(600, 300), kn.Event(600, 1200)
    assert kn.choose([job], short).table["knob"].tolist() == ["pause"]  # cheaper than restart
    c = kn.choose([job], long)
    assert c.table["knob"].tolist() == ["requeue"] and "pause unavailable" in c.table["why"][0]
    assert not kn.choose([job], long, ("cap", "pause")).feasible
