"""bench/goodput.py's pure parts: the seeded schedule, the invariants over hand-made step lines, the arithmetic."""

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
import goodput_check as check  # noqa: E402
import goodput_schedule as plan  # noqa: E402

BATCH = 6


def line(t, step, rank, world=2, wid=1, node=None, pid=None, seq=None, lo=None, hi=None):
    share = (step * BATCH + rank * BATCH // world, step * BATCH + (rank + 1) * BATCH // world)
    return check.Line(t=t, node=node or f"n{rank}", world_id=wid, world=world, rank=rank,
                      pid=pid if pid is not None else 100 * wid + rank, step=step,
                      lo=share[0] if lo is None else lo, hi=share[1] if hi is None else hi,
                      seq=step if seq is None else seq)


def world(wid, steps, world=2, t0=0.0, first_step=0, seq0=0, nodes=None):
    """``steps`` committed steps of a world of ``world`` ranks, one a second from ``t0``."""
    return [line(t0 + i, first_step + i, r, world, wid, node=(nodes or {}).get(r), seq=seq0 + i)
            for i in range(steps) for r in range(world)]


def kinds(lines, **kw):
    return sorted({v.kind for v in check.violations(lines, BATCH, 2, **kw)})


# ---------------------------------------------------------------- the schedule


def test_the_same_seed_gives_the_same_schedule_and_another_seed_another():
    assert plan.schedule(7, 120) == plan.schedule(7, 120)
    assert plan.schedule(7, 120) != plan.schedule(8, 120)


@pytest.mark.parametrize("seed", range(20))
def test_every_schedule_has_each_kind_once_apart_and_spares_node_0(seed):
    faults = plan.schedule(seed, 120)
    assert sorted(f.kind for f in faults) == sorted(plan.KINDS)
    for a, b in zip(faults, faults[1:]):
        assert a.end <= b.start  # never two at once
    assert all(f.node != 0 for f in faults)
    assert next(f for f in faults if f.kind == "join").node == plan.NODES
    assert all(0.15 * 120 <= f.start <= f.end <= 0.85 * 120 for f in faults)


@pytest.mark.parametrize("seed", range(10))
def test_the_spare_scenario_has_its_standby_waiting_from_the_start_then_members_powered_off_apart(seed):
    faults = plan.spare_schedule(seed, 120)
    assert faults[0] == plan.Fault("join", plan.NODES, 0.0, 0.0)  # the spare waits as a standby from the start
    assert [f.kind for f in faults[1:]] == list(plan.SPARE_LOSSES)
    assert all(0 < f.node < plan.NODES for f in faults[1:])  # members only, never node 0
    assert all(a.end <= b.start for a, b in zip(faults[1:], faults[2:]))
    assert plan.spare_schedule(seed, 120) == faults


def test_a_fault_holds_its_node_only_while_it_lasts():
    fault = plan.Fault("freeze", 1, 10.0, 15.0)
    assert fault.holds(1, 12) and not fault.holds(2, 12) and not fault.holds(1, 15) and not fault.holds(1, 9)


# ---------------------------------------------------------------- goodput's arithmetic


def test_committed_steps_count_once_and_a_step_without_all_ranks_not_at_all():
    lines = world(1, 3) + [line(9, 3, 0)]  # step 3: rank 1's line missing
    assert check.trained(lines, 0, 100) == (3 * BATCH, 0)


def test_steps_redone_after_a_restart_count_once_and_are_told_apart():
    lines = world(1, 5) + world(2, 4, t0=10, first_step=3)  # back to step 3: steps 3 and 4 redone
    assert check.trained(lines, 0, 100) == (7 * BATCH, 2 * BATCH)


def test_only_steps_committed_in_the_window_count():
    assert check.trained(world(1, 10), 2, 5) == (4 * BATCH, 0)  # committed at 2, 3, 4, 5


def test_goodput_is_the_ratio_to_the_fault_free_samples():
    assert check.goodput(85, 100) == 0.85
    assert check.goodput(5, 0) is None


def test_parse_keeps_step_lines_only_and_drops_a_line_cut_short():
    good = json.dumps({"gp": 1, "t": 1.5, "node": "n1", "world_id": 3, "world": 2, "rank": 1, "pid": 9, "step": 4,
                       "lo": 27, "hi": 30, "seq": 0})
    text = "\n".join(["launcher: something", good, good[:30], "[rank 0] hello"])
    assert check.parse(text) == [check.Line(1.5, "n1", 3, 2, 1, 9, 4, 27, 30, 0)]


# ---------------------------------------------------------------- the invariants, one kind at a time


def test_a_clean_run_breaks_nothing():
    lines = world(1, 5) + world(2, 5, world=3, t0=6, first_step=5)
    assert kinds(lines) == []


def test_two_worlds_training_at_once_are_caught():
    lines = world(1, 5) + world(2, 5, t0=3, nodes={0: "n2", 1: "n3"})
    assert kinds(lines) == ["two worlds"]


def test_a_world_below_the_minimum_is_caught():
    lines = world(1, 3) + world(2, 3, world=1, t0=5, nodes={0: "n1"})
    assert "below min" in kinds(lines)


def test_a_partitioned_node_training_alone_is_caught_and_a_step_in_flight_at_the_cut_is_not():
    before = world(1, 3)  # the last step at t=2
    assert kinds(before, partitions=[("n1", 2.5, 20.0)]) == []
    alone = world(2, 3, world=2, t0=10, nodes={0: "n1", 1: "n1"})
    assert "alone" in kinds(before + alone, partitions=[("n1", 2.5, 20.0)])


def test_a_rank_held_by_two_processes_is_caught():
    lines = world(1, 3) + [line(2.5, 2, 1, pid=999, seq=0)]
    assert "duplicate rank" in kinds(lines)


def test_a_sample_trained_by_two_ranks_is_caught():
    lines = world(1, 2) + [line(3, 2, 0, seq=2, lo=12, hi=16), line(3, 2, 1, seq=2, lo=14, hi=18)]
    assert kinds(lines) == ["sample twice"]


def test_a_share_outside_its_steps_batch_is_caught():
    lines = [line(0, 0, 0), line(0, 0, 1, lo=3, hi=7)]
    assert kinds(lines) == ["sample twice"]


def test_a_line_missing_from_a_processs_numbering_is_caught():
    lines = [l for l in world(1, 5) if not (l.rank == 1 and l.seq == 2)]
    assert "line lost" in kinds(lines)


def test_a_line_the_launcher_did_not_keep_is_caught_unless_its_node_was_powered_off_then():
    lines = world(1, 3)
    kept = {f"n{r}": {(l.pid, l.seq) for l in lines if l.rank == r} for r in range(2)}
    assert kinds(lines, captured=kept) == []
    kept["n1"].discard((101, 2))
    assert kinds(lines, captured=kept) == ["log line lost"]
    assert kinds(lines, captured=kept, exempt=[("n1", 1.5, 3.0)]) == []


def test_a_process_left_after_the_run_is_caught():
    assert kinds(world(1, 2), leftovers=["4242 python train.py"]) == ["process left"]


# ---------------------------------------------------------------- the straggler's figures


def test_a_straggler_named_within_30_s_and_the_time_back_at_90_percent():
    events = [{"event": "straggler", "time": 112.0, "host": "10.213.0.3"}, {"event": "round", "time": 105.0}]
    assert check.named_after(events, "10.213.0.3", 100.0) == 12.0
    assert check.named_after(events, "10.213.0.2", 100.0) is None
    assert check.named_after(events, "10.213.0.3", 50.0) is None  # 62 s later: not within 30 s
    slow_then_fast = [(100 + i * 0.5, 1) for i in range(10)] + [(105 + i * 0.1, 1) for i in range(100)]
    assert check.back_after(slow_then_fast, 100.0, rate=10.0) == pytest.approx(5.0, abs=0.6)
    assert check.back_after(slow_then_fast[:10], 100.0, rate=10.0) is None
