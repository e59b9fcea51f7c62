"""The straggler detector (launcher.plan.stragglers), pure, on a fake clock: a healthy job's noisy timings name nobody
over many windows; a rank slowed to a quarter is named within one window, with its node, host and speed."""

import random

import pytest

from launcher.plan import stragglers as s

NODES, PER_NODE = 4, 4
BASE = 0.2  # seconds of compute per step


def host(node):
    return f"10.0.0.{node + 1}"


def feed(windows, step, now, times):
    """One step of every rank: ``times`` rank -> compute seconds."""
    for rank, compute in times.items():
        windows = s.add(windows, rank, rank // PER_NODE, host(rank // PER_NODE), step, compute, now)
    return windows


def noisy(rng):
    """A busy machine: +-30% jitter, and one step in 25 three times as long."""
    t = BASE * rng.uniform(0.7, 1.3)
    return t * 3 if rng.random() < 0.04 else t


def test_a_healthy_noisy_job_names_no_straggler_over_many_windows():
    for seed in range(5):
        rng = random.Random(seed)
        windows, now, verdict = {}, 0.0, s.Verdict()
        for step in range(50 * s.WINDOW):
            now += BASE
            windows = feed(windows, step, now, {rank: noisy(rng) for rank in range(NODES * PER_NODE)})
            verdict = s.judge(s.summarize(windows, now), verdict.below, now=now)
            assert verdict.stragglers == (), (seed, step, verdict)
        assert verdict.compared == NODES * PER_NODE


def test_a_rank_slowed_to_a_quarter_is_named_within_one_window():
    rng = random.Random(7)
    windows, now, verdict = {}, 0.0, s.Verdict()
    for step in range(5 * s.WINDOW):  # a healthy history first
        now += BASE
        windows = feed(windows, step, now, {rank: noisy(rng) for rank in range(NODES * PER_NODE)})
        verdict = s.judge(s.summarize(windows, now), verdict.below, now=now)
        assert verdict.stragglers == ()
    slow_from, found = 5 * s.WINDOW, None
    for step in range(slow_from, slow_from + s.WINDOW):
        now += BASE * 4
        times = {rank: noisy(rng) for rank in range(NODES * PER_NODE)}
        times[9] = times[9] * 4  # rank 9, on node 2
        windows = feed(windows, step, now, times)
        verdict = s.judge(s.summarize(windows, now), verdict.below, now=now)
        if verdict.stragglers:
            found = step
            break
    assert found is not None and found - slow_from < s.WINDOW
    (straggler,) = verdict.stragglers
    assert (straggler.node, straggler.host, straggler.ranks) == (2, "10.0.0.3", (9,))
    assert straggler.speed < s.THRESHOLD and verdict.nodes[2] == straggler.speed == verdict.ranks[9]
    assert "node 2 (10.0.0.3)" in straggler.reason and "rank 9" in straggler.reason
    assert all(verdict.nodes[n] >= s.THRESHOLD for n in (0, 1, 3))
    new, gone = s.changes(set(), verdict)
    assert new == (straggler,) and gone == ()
    assert s.changes({2, 3}, verdict) == ((), (3,))


def test_a_node_named_is_cleared_only_once_back_at_the_recovered_speed():
    """Hysteresis: named below 0.7, still named at 0.75 (not a straggler by the threshold, not recovered either),
    cleared at 0.8; a node no longer compared at all is cleared too."""
    def verdict_at(speed):
        return s.Verdict(nodes={0: 1.0, 1: speed})

    assert s.changes({1}, verdict_at(0.75)) == ((), ())
    assert s.changes({1}, verdict_at(s.RECOVERED)) == ((), (1,))
    assert s.changes({1}, s.Verdict(nodes={0: 1.0})) == ((), (1,))
    assert s.changes({1}, verdict_at(0.75), s.Settings(recovered=0.7)) == ((), (1,))


def test_speeds_are_the_fastest_over_own_and_a_node_is_its_slowest_rank():
    def at(step):
        return [s.RankTime(0, 0, "a", 1.0, step), s.RankTime(1, 0, "a", 4.0, step), s.RankTime(2, 1, "b", 1.25, step)]

    verdict = s.judge(at(100), now=50.0)
    assert verdict.ranks == {0: 1.0, 1: 0.25, 2: 0.8}
    assert verdict.nodes == {0: 0.25, 1: 0.8}
    assert verdict.stragglers == () and verdict.below == {0: (100, 50.0)}  # below from now on: not yet for long
    verdict = s.judge(at(100 + s.PATIENCE - 1), verdict.below, now=50.0 + s.HOLD)
    assert verdict.stragglers == ()  # long enough, not for enough steps
    verdict = s.judge(at(100 + s.PATIENCE), verdict.below, now=50.0 + s.HOLD)
    assert [(x.node, x.ranks, x.speed) for x in verdict.stragglers] == [(0, (1,), 0.25)]
    healthy = [s.RankTime(0, 0, "a", 1.0, 111), s.RankTime(1, 0, "a", 1.1, 111), s.RankTime(2, 1, "b", 1.25, 111)]
    assert s.judge(healthy, verdict.below, now=70.0).below == {}  # above again: the count starts over


def test_a_slowdown_shorter_than_the_hold_names_nobody_however_many_steps_it_lasts():
    """Steps of 50 ms: a neighbour importing torch on the same cores for a few seconds makes a node three times
    slower for many times the patience's steps; it is not named. The same slowdown past HOLD is."""
    def at(step, slow):
        return [s.RankTime(0, 0, "a", 0.05, step), s.RankTime(1, 1, "b", 0.15 if slow else 0.05, step)]

    short = int((s.HOLD - 0.5) / 0.05)
    assert short > 5 * s.PATIENCE
    verdict = s.Verdict()
    for step in range(short):
        verdict = s.judge(at(step, True), verdict.below, now=step * 0.05)
        assert verdict.stragglers == ()
    verdict = s.judge(at(short, False), verdict.below, now=short * 0.05)
    assert verdict.below == {}
    again = short + 1
    for step in range(again, again + 10 * short):
        verdict = s.judge(at(step, True), verdict.below, now=step * 0.05)
        if verdict.stragglers:
            break
    assert verdict.stragglers[0].node == 1 and (step - again) * 0.05 == pytest.approx(s.HOLD, abs=0.06)
    assert f"for {s.PATIENCE} steps and {s.HOLD:g} s" in verdict.stragglers[0].reason


def test_a_restarted_node_below_the_threshold_counts_from_its_new_steps():
    verdict = s.judge([s.RankTime(0, 0, "a", 1.0, 500), s.RankTime(1, 1, "b", 4.0, 500)], {1: (400, 0.0)}, now=100.0)
    assert verdict.stragglers != ()
    verdict = s.judge([s.RankTime(0, 0, "a", 1.0, 500), s.RankTime(1, 1, "b", 4.0, 30)], verdict.below, now=101.0)
    assert verdict.stragglers == () and verdict.below == {1: (30, 101.0)}  # its steps went back: a new worker


def test_nothing_is_judged_before_a_full_window_or_with_one_rank():
    windows = {}
    for step in range(s.WINDOW - 1):
        windows = s.add(windows, 0, 0, "a", step, 0.1, step)
        windows = s.add(windows, 1, 0, "a", step, 0.4, step)
    assert s.summarize(windows, s.WINDOW) == ()
    windows = s.add(windows, 0, 0, "a", s.WINDOW, 0.1, s.WINDOW)
    windows = s.add(windows, 1, 0, "a", s.WINDOW, 0.4, s.WINDOW)
    assert [t.rank for t in s.summarize(windows, s.WINDOW)] == [0, 1]
    assert s.judge([s.RankTime(0, 0, "a", 1.0)]) == s.Verdict()


def test_a_silent_rank_is_left_out_and_a_restarted_one_starts_afresh():
    windows = {}
    for step in range(s.WINDOW):
        windows = s.add(windows, 0, 0, "a", step, 0.1, 0.0)
        windows = s.add(windows, 1, 0, "a", step, 0.4, float(step))
    assert [t.rank for t in s.summarize(windows, s.STALE + 1)] == [1]  # rank 0 last heard at 0
    again = s.add(windows, 1, 0, "a", 0, 0.1, 100.0)  # its steps went back: a new worker
    assert again[1].times == (0.1,)
    assert s.add(again, 1, 0, "a", 0, 0.5, 101.0) == again  # the same step twice: taken once
    for bad in (float("nan"), -1.0, float("inf"), True, None):
        assert s.add(again, 1, 0, "a", 1, bad, 102.0) == again


def test_settings_change_the_window_and_the_threshold():
    settings = s.Settings(window=3, threshold=0.5, patience=0, hold=0)
    windows = {}
    for step in range(3):
        windows = s.add(windows, 0, 0, "a", step, 1.0, 0.0, settings)
        windows = s.add(windows, 1, 1, "b", step, 1.6, 0.0, settings)
    times = s.summarize(windows, 0.0, settings)
    assert s.judge(times, {}, settings).stragglers == ()  # 0.625: above 0.5
    assert [x.node for x in s.judge(times, {}, s.Settings(window=3, patience=0, hold=0)).stragglers] == [1]  # below 0.7
