"""The knob menu under the site's nested limits: the MILP's mix against brute force on small
random laminar instances (every knob, cap and clock curves concave and not), no level over its
limit, and a rack the site-only mix overloads.

Brute force: every assignment of a knob to each job; the discrete knobs' powers held out of
every level above them, then the curve jobs' best split under the budget and every level by
the nested oracle's brute force (each choice of curve segment per job an LP)."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from wattflex.allocation import knobs as kn
from wattflex.allocation.nested import Laminar, random_laminar

from .test_knobs import random_jobs
from .test_nested import brute_force as best_split


def padded(curves):
    """Curves of unequal lengths as (n, K) arrays, the shorter ones' floors repeated (a
    zero-width segment)."""
    K = max(len(P) for P, _ in curves)
    P = np.array([np.concatenate([np.full(K - len(p), p[0]), p]) for p, _ in curves])
    T = np.array([np.concatenate([np.full(K - len(t), t[0]), t]) for _, t in curves])
    return P, T


def brute_force(jobs, event, knobs, levels):
    """Least tokens lost over every assignment of a knob to each job, every level held."""
    budget = sum(j.ceiling_w for j in jobs) - event.depth_w
    menus = [{o.knob: o for o in kn.candidates(j, event, knobs)} for j in jobs]
    best = None
    for pick in itertools.product(*[list(m) for m in menus]):
        opts = [m[k] for m, k in zip(menus, pick)]
        curve = np.array([k in kn.CURVE_KNOBS for k in pick])
        fixed_w = np.array([0.0 if c else o.power_w[0] for o, c in zip(opts, curve)])
        fixed_lost = sum(o.tokens_lost[0] for o, c in zip(opts, curve) if not c)
        left = levels.subset(curve, fixed_w)  # every limit less its discrete jobs' power
        if not curve.any():
            if fixed_w.sum() > budget or np.any(np.asarray(left.limit_w) < 0):
                continue
            lost = fixed_lost
        else:  # tokens lost = duration * (T_max - T): maximise T
            P, T = padded([(o.power_w, -o.tokens_lost) for o, c in zip(opts, curve) if c])
            t = best_split(P, T, budget - fixed_w.sum(), left)
            if not np.isfinite(t):
                continue
            lost = fixed_lost - t
        best = lost if best is None or lost < best else best
    return best


def test_the_nested_mix_is_the_brute_force_optimum_and_holds_every_level():
    rng = np.random.default_rng(11)
    checked = infeasible = 0
    for trial in range(24):
        n = int(rng.integers(2, 5))
        concave, clock = trial % 2 == 0, trial % 3 != 0
        # 4 jobs: cap curves of 3 points and no clock curves, to keep the enumeration small (4 with
        # clocks: 5^4 knob assignments, ~2 s each; 3 with clocks prove the same)
        n = min(n, 3) if clock else n
        jobs = random_jobs(rng, n, clock=clock, K=3 if n == 4 else 4, concave=concave)
        ceiling = np.array([j.ceiling_w for j in jobs])
        tree = [int(rng.integers(1, 3)), int(rng.integers(1, 4))]
        if trial % 4 == 1:
            tree.append(int(rng.integers(1, 4)))  # 3 levels
        # limits between a tenth of the cap floors and the ceilings: below the floors at times
        levels = random_laminar(
            rng, n, tree, ceiling_w=ceiling, floor_w=0.1 * np.array([j.cap[0][0] for j in jobs])
        )
        event = kn.Event(
            depth_w=rng.uniform(0.1, 0.9) * ceiling.sum(),
            duration_s=rng.uniform(600, 7200),
            notice_s=rng.choice([0.0, 300.0]),
        )
        for knobs in (kn.KNOBS, ("cap",), ("cap", "pause")):
            want = brute_force(jobs, event, knobs, levels)
            got = kn.choose(jobs, event, knobs, levels=levels)
            if want is None:
                assert not got.feasible and "infeasible" in got.reason, (trial, knobs)
                infeasible += 1
                continue
            assert got.feasible, (trial, knobs, got.reason)
            scale = max(abs(want), 1.0)
            assert abs(got.tokens_lost - want) <= 1e-9 * scale, (
                trial,
                knobs,
                got.tokens_lost,
                want,
            )
            power = got.table["power_w"].to_numpy()
            assert not levels.violations(power) and power.sum() <= got.budget_w * (1 + 1e-12)
            for g, level in enumerate(got.levels.values()):  # the loads reported are the mix's
                assert level["load_w"] == pytest.approx(levels.loads(power)[g], rel=1e-12)
                assert level["load_w"] <= level["limit_w"] * (1 + 1e-9)
            checked += 1
    assert checked >= 40 and infeasible > 0, (checked, infeasible)


def rack_instance():
    """Rack a: two jobs making 100 tokens/s at 700 W, 40 at their 200 W floor. Rack b: two
    jobs making 10 tokens/s. Rack a holds 1000 W, below its jobs' 1400 W uncapped; rack b
    1400 W, its jobs' uncapped power."""
    high = (np.array([200.0, 700.0]), np.array([40.0, 100.0]))
    low = (np.array([200.0, 700.0]), np.array([4.0, 10.0]))
    jobs = [
        kn.Job(name, curve, idle_w=70.0, restart_s=600, checkpoint_write_s=60, since_checkpoint_s=0)
        for name, curve in (("a1", high), ("a2", high), ("b1", low), ("b2", low))
    ]
    racks = Laminar(
        np.array([-1, -1]), np.array([1000.0, 1400.0]), np.array([0, 0, 1, 1]), ("rack:a", "rack:b")
    )
    return jobs, racks


def test_the_site_only_mix_overloads_a_rack_that_the_nested_mix_holds():
    jobs, racks = rack_instance()
    event = kn.Event(depth_w=1260.0, duration_s=3600)  # 2800 W uncapped, 1540 W allowed
    flat = kn.choose(jobs, event)  # pauses b1 and b2 (cheapest): a runs uncapped, 1400 W
    assert flat.feasible and racks.violations(flat.table["power_w"].to_numpy())
    nested = kn.choose(jobs, event, levels=racks)
    assert nested.feasible, nested.reason
    power = nested.table["power_w"].to_numpy()
    assert not racks.violations(power) and power[:2].sum() == pytest.approx(1000.0)
    assert nested.tokens_lost == pytest.approx(brute_force(jobs, event, kn.KNOBS, racks), rel=1e-9)
    assert nested.tokens_lost > flat.tokens_lost  # the rack's limit costs tokens
    assert nested.levels["rack:a"] == {"kind": "", "limit_w": 1000.0, "load_w": pytest.approx(1000)}


def test_an_infeasible_level_is_named_in_one_line():
    jobs, racks = rack_instance()
    tight = Laminar(racks.parent, np.array([300.0, np.inf]), racks.leaf, racks.names)
    c = kn.choose(jobs, kn.Event(depth_w=100.0, duration_s=3600), ("cap",), levels=tight)
    assert not c.feasible
    assert c.reason == (
        "infeasible with cap: the lowest power the jobs under rack:a reach is 0.400 kW, over "
        "its limit 0.300 kW"
    )
    # pause reaches 2 x 70 W: the same rack then fits
    assert kn.choose(jobs, kn.Event(depth_w=100.0, duration_s=3600), levels=tight).feasible
    with pytest.raises(ValueError, match="levels hold 3 item"):
        kn.choose(
            jobs,
            kn.Event(100.0, 60.0),
            levels=Laminar(np.array([-1]), np.ones(1), np.zeros(3, int)),
        )
