"""The membership of an elastic job as node 0 keeps it (launcher.nodes.elastic.membership), replayed: each test
states what happened, moment by moment (joins, heartbeats, closed connections, reports, time passing),
and asserts on what node 0 ordered (rounds and their ranks, stops, refusals, the end). No process, no
socket, no clock: each test runs in milliseconds."""

import logging
from dataclasses import replace

import pytest

from launcher.nodes.elastic import membership as m
from launcher.nodes.elastic.etcd import keys as ek, state as es
from launcher.nodes.elastic.membership import (Admit, Closed, Drop, EndJob, Heartbeat, JobEnded, JoinAsked, Node, Refuse, RoundDone,
                                       StartRound, StopWorkers, TimePassed, WorkerFailed, WorkersStopped)
from launcher.plan.elastic import ElasticSpec, Rendezvous
from launcher.plan.elastic_backends import ETCD
from launcher.plan.policy import Say

JOIN, LAST_CALL, CLOSE, SILENCE = 60.0, 1.0, 30.0, 3.0


def spec(low=2, high=3, restarts=0, **more) -> ElasticSpec:
    rendezvous = Rendezvous(join_timeout=JOIN, last_call_timeout=LAST_CALL, close_timeout=CLOSE,
                            heartbeat_timeout=SILENCE)
    return ElasticSpec(low, high, "c10d", job_id="job", rendezvous=rendezvous, max_restarts=restarts, **more)


def node(n: int, workers: int = 2, new: str = "") -> Node:
    """Node ``n`` on host 10.0.0.n+1; ``new``: a later launcher on the same host (another id)."""
    return Node(f"n{n}{new}", f"10.0.0.{n + 1}", workers)


N0, N1, N2, N3 = node(0), node(1), node(2), node(3)


class History:
    """Node 0's membership, fed one moment at a time; ``at`` returns what it ordered then (without its words)."""

    def __init__(self, spec_: ElasticSpec = None, keeper: Node = N0) -> None:
        self.state, first = m.begin(spec_ or spec(), keeper, "job", 0.0)
        self.actions = list(first)

    def at(self, now: float, *events) -> list:
        out = []
        for event in events:
            self.state, actions = m.decide(self.state, event, now)
            out += actions
        self.actions += out
        return [a for a in out if not isinstance(a, Say)]

    def words(self) -> list:
        return [a.text for a in self.actions if isinstance(a, Say)]

    def running(self, now: float, *nodes: Node) -> m.Round:
        """``nodes`` join at ``now``; the round starts (at once at MAX, else after the last call)."""
        self.at(now, *(JoinAsked(n, "job") for n in nodes))
        if self.state.phase != m.RUNNING:
            self.at(now + LAST_CALL, TimePassed())
        assert self.state.phase == m.RUNNING
        return self.state.round

    def stopped(self, now: float, *nodes: Node) -> list:
        return self.at(now, *(WorkersStopped(n.node_id, self.state.round.number) for n in nodes))

    def beat(self, now: float, *nodes: Node) -> list:
        return self.at(now, *(Heartbeat(n.node_id) for n in nodes))


def join(n: Node, job: str = "job") -> JoinAsked:
    return JoinAsked(n, job)


def ranks(round_: m.Round) -> list:
    """(node id, node rank, first global rank) of each member, by node rank."""
    return [(x.node.node_id, x.node_rank, x.first_rank) for x in round_.members]


def started(actions) -> list:
    return [a.round for a in actions if isinstance(a, StartRound)]


def stops(actions) -> list:
    return [a for a in actions if isinstance(a, StopWorkers)]


# ---------------------------------------------------------------- the start


def test_the_job_starts_at_once_when_max_nodes_have_joined():
    h = History()
    assert h.at(0.1, join(N1)) == [Admit("n1")]
    assert h.state.phase == m.WAITING
    actions = h.at(0.2, join(N2))
    assert actions[0] == Admit("n2")
    [first] = started(actions)
    assert (first.number, first.why, first.world_size, first.restarts) == (1, "start", 6, 0)
    assert ranks(first) == [("n0", 0, 0), ("n1", 1, 2), ("n2", 2, 4)]
    assert first.joined == (N0, N1, N2)


def test_min_nodes_start_once_the_last_call_has_passed():
    h = History()
    h.at(0.5, join(N1))
    assert m.next_deadline(h.state) == 0.5 + LAST_CALL  # before n1's heartbeat is due
    assert h.at(1.4, Heartbeat("n1"), TimePassed()) == []
    [first] = started(h.at(1.5, TimePassed()))
    assert ranks(first) == [("n0", 0, 0), ("n1", 1, 2)] and first.world_size == 4


def test_a_job_of_one_node_at_most_starts_when_node_0_does():
    state, actions = m.begin(spec(1, 1), N0, "job", 0.0)
    assert ranks(started(actions)[0]) == [("n0", 0, 0)] and state.phase == m.RUNNING


def test_only_min_minus_one_nodes_within_join_timeout_ends_the_job():
    h = History(spec(3, 4))
    h.at(1.0, join(N1))
    for t in range(2, 60, 2):
        h.beat(float(t), N1)
    assert m.next_deadline(h.state) == JOIN
    assert h.at(59.9, TimePassed()) == []
    assert h.at(JOIN, TimePassed()) == [EndJob(1, "only 2 node(s) joined within 60 s (join_timeout), 3 needed "
                                                  "(--nnodes 3:4)", ("n0", "n1"))]
    assert m.next_deadline(h.state) is None


def test_a_node_lost_before_the_start_resets_the_last_call():
    h = History(spec(2, 4))
    h.at(0.1, join(N1))
    h.at(0.5, Closed("n1"))
    assert h.at(1.1, TimePassed()) == [] and h.state.min_reached is None
    h.at(2.0, join(N2))
    assert h.at(2.9, TimePassed()) == []
    [first] = started(h.at(3.0, TimePassed()))
    assert ranks(first) == [("n0", 0, 0), ("n2", 1, 2)]
    assert first.left == ((N1, "its connection closed"),)


# ---------------------------------------------------------------- losses


def test_a_node_lost_above_min_re_forms_the_round_at_once_with_ranks_stable_and_contiguous():
    h = History(spec(2, 4))
    h.running(0.0, N1, N2, N3)
    actions = h.at(10.0, Closed("n1"))
    assert stops(actions) == [StopWorkers(1, ("n0", "n2", "n3"), "node n1 (10.0.0.2) lost: its connection closed")]
    assert h.stopped(10.2, N0, N2) == []  # n3 still stopping
    [second] = started(h.stopped(10.3, N3))
    assert (second.number, second.why, second.world_size, second.restarts) == (2, "lost", 6, 0)
    assert ranks(second) == [("n0", 0, 0), ("n2", 1, 2), ("n3", 2, 4)]
    assert second.left == ((N1, "its connection closed"),) and second.joined == ()
    assert "round 2 (lost): 3 node(s), world size 6; left: node n1 (10.0.0.2) (its connection closed)" in h.words()


def test_a_node_lost_below_min_waits_then_ends_the_job_naming_the_lost():
    h = History(spec(3, 4))
    h.running(0.0, N1, N2)
    actions = h.at(5.0, Closed("n1"))
    assert stops(actions) == [StopWorkers(1, ("n0", "n2"), "node n1 (10.0.0.2) lost: its connection closed")]
    assert h.state.phase == m.WAITING
    assert "2 node(s) left, 3 needed: waiting up to 60 s (join_timeout) for nodes to join" in h.words()
    assert h.stopped(5.5, N0, N2) == []
    h.at(6.0, Closed("n2"))
    assert m.next_deadline(h.state) == 5.0 + JOIN
    assert h.at(64.9, TimePassed()) == []
    assert h.at(65.0, TimePassed()) == [EndJob(
        1, "1 node(s) left after 60 s (join_timeout), 3 needed (--nnodes 3:4); lost: node n1 (10.0.0.2) (its "
           "connection closed), node n2 (10.0.0.3) (its connection closed)", ("n0",))]


def test_below_min_a_node_that_comes_back_in_time_starts_the_next_round():
    h = History(spec(2, 3))
    h.running(0.0, N1)
    h.at(5.0, Closed("n1"))
    h.stopped(5.2, N0)
    n1_again = node(1, new="b")  # its launcher restarted on the same host: a new id
    assert h.at(30.0, join(n1_again)) == [Admit("n1b")]
    assert h.at(30.9, TimePassed()) == []  # the last call
    [second] = started(h.at(31.0, TimePassed()))
    assert ranks(second) == [("n0", 0, 0), ("n1b", 1, 2)]
    assert (second.why, second.joined, second.left) == ("lost", (n1_again,), ((N1, "its connection closed"),))


def test_below_min_the_round_waits_for_the_survivors_stop_even_when_nodes_are_back():
    h = History(spec(2, 3))
    h.running(0.0, N1)
    h.at(5.0, Closed("n1"))
    h.at(6.0, join(N2))
    assert h.at(8.0, Heartbeat("n2"), TimePassed()) == []  # node 0 has not stopped its workers yet
    # the last call ran from n2's join: the round starts with node 0's stop
    assert ranks(started(h.stopped(8.5, N0))[0]) == [("n0", 0, 0), ("n2", 1, 2)]


def test_two_losses_at_once_make_one_round_not_two():
    h = History(spec(1, 4))
    h.running(0.0, N1, N2, N3)
    actions = h.at(10.0, Closed("n1"), Closed("n2"))
    assert stops(actions) == [StopWorkers(1, ("n0", "n2", "n3"), "node n1 (10.0.0.2) lost: its connection closed")]
    rounds = started(h.stopped(10.5, N0, N3))
    assert [r.number for r in rounds] == [2] and ranks(rounds[0]) == [("n0", 0, 0), ("n3", 1, 2)]
    assert [n.node_id for n, _ in rounds[0].left] == ["n1", "n2"]


def test_two_nodes_silent_together_are_lost_in_one_turn_and_one_round():
    h = History(spec(1, 4))
    h.running(0.0, N1, N2, N3)
    h.beat(2.0, N1, N2, N3)
    h.beat(4.0, N3)
    actions = h.at(5.0, TimePassed())
    reason = "no heartbeat for 3.0 s (heartbeat_timeout 3 s)"
    assert [a for a in actions if isinstance(a, Drop)] == [Drop("n1", 1, reason), Drop("n2", 1, reason)]
    assert len(stops(actions)) == 1
    assert [r.number for r in started(h.stopped(5.5, N0, N3))] == [2]


def test_a_loss_while_the_next_round_is_forming_goes_into_that_round():
    h = History(spec(1, 4))
    h.running(0.0, N1, N2, N3)
    h.at(10.0, Closed("n1"))
    h.stopped(10.1, N0)
    assert h.at(10.2, Closed("n2")) == []  # n2 had not reported its stop: no longer waited for
    rounds = started(h.stopped(10.3, N3))
    assert [(r.number, ranks(r)) for r in rounds] == [(2, [("n0", 0, 0), ("n3", 1, 2)])]


def test_a_loss_just_after_a_round_started_re_forms_it_again():
    h = History(spec(1, 4))
    h.running(0.0, N1, N2, N3)
    h.at(10.0, Closed("n1"))
    h.stopped(10.1, N0, N2, N3)
    assert h.state.round.number == 2  # started; its workers are still starting
    actions = h.at(10.2, Closed("n3"))
    assert stops(actions) == [StopWorkers(2, ("n0", "n2"), "node n3 (10.0.0.4) lost: its connection closed")]
    assert h.stopped(10.3, N0, N2) and h.state.round.number == 3
    assert ranks(h.state.round) == [("n0", 0, 0), ("n2", 1, 2)]
    assert h.state.round.left == ((N3, "its connection closed"),)


def test_a_closed_connection_is_a_loss_at_once_and_silence_one_after_heartbeat_timeout():
    h = History(spec(1, 3))
    h.running(0.0, N1, N2)
    assert [type(a) for a in h.at(0.5, Closed("n1"))] == [StopWorkers]  # no Drop: its connection is gone already
    h.stopped(0.6, N0, N2)
    h.beat(2.9, N2)
    assert h.at(3.0, TimePassed()) == []
    assert m.next_deadline(h.state) == 2.9 + SILENCE
    actions = h.at(5.9, TimePassed())
    assert actions[0] == Drop("n2", 1, "no heartbeat for 3.0 s (heartbeat_timeout 3 s)")
    assert stops(actions)[0].nodes == ("n0",)


def test_node_0_is_never_lost_here():
    h = History(spec(1, 2))
    h.running(0.0, N1)
    assert h.at(1.0, Closed("n0"), Heartbeat("n0"), TimePassed()) == []
    assert h.at(100.0, Heartbeat("n1"), TimePassed()) == []  # n1 beat in time; n0 is never timed
    assert "n0" not in h.state.heard


def test_a_member_that_does_not_stop_within_close_timeout_is_lost():
    h = History(spec(1, 3))
    h.running(0.0, N1, N2)
    h.at(1.0, Closed("n1"))
    h.stopped(1.5, N0)
    for t in range(3, 31, 2):
        h.beat(float(t), N2)  # alive, but its workers do not stop
    assert m.next_deadline(h.state) == 1.0 + CLOSE
    actions = h.at(31.0, TimePassed())
    reason = "its workers did not stop within 30 s (close_timeout)"
    assert actions[0] == Drop("n2", 1, reason)
    assert ranks(started(actions)[0]) == [("n0", 0, 0)]


def test_node_0s_own_stop_overdue_ends_the_job():
    h = History(spec(1, 2, restarts=1))
    h.running(0.0, N1)
    h.at(1.0, WorkerFailed("n1", 1, 3, "rank 2 failed (exit code 3)"))
    h.stopped(2.0, N1)
    for t in range(3, 31, 2):
        h.beat(float(t), N1)
    assert h.at(31.0, TimePassed()) == [EndJob(1, "node 0's workers did not stop within 30 s (close_timeout)",
                                               ("n0", "n1"))]


# ---------------------------------------------------------------- joins and standbys


def test_a_join_while_running_below_max_re_forms_at_once_with_the_newcomer_last():
    h = History(spec(2, 3))
    h.running(0.0, N1)
    actions = h.at(20.0, join(N2))
    assert actions == [Admit("n2"), StopWorkers(1, ("n0", "n1"), "node n2 (10.0.0.3) joined")]
    [second] = started(h.stopped(20.5, N0, N1))
    assert (second.why, second.joined, ranks(second)) == ("joined", (N2,), [("n0", 0, 0), ("n1", 1, 2), ("n2", 2, 4)])
    assert "round 2 (joined): 3 node(s), world size 6; joined: node n2 (10.0.0.3)" in h.words()


def test_joins_while_the_round_is_forming_go_into_it():
    h = History(spec(1, 4))
    h.running(0.0, N1)
    h.at(5.0, Closed("n1"))
    assert h.at(5.1, join(N2), join(N3)) == [Admit("n2"), Admit("n3")]  # no stop of their own
    [second] = started(h.stopped(5.2, N0))
    assert ranks(second) == [("n0", 0, 0), ("n2", 1, 2), ("n3", 2, 4)]


def test_a_join_at_max_waits_as_a_standby_then_takes_a_lost_nodes_rank():
    h = History(spec(2, 3))
    h.running(0.0, N1, N2)
    assert h.at(5.0, join(N3)) == [Admit("n3", standby=True)]
    assert h.state.phase == m.RUNNING and h.state.standbys == (N3,)
    h.beat(6.0, N2, N3)
    actions = h.at(6.0, TimePassed())  # n1 silent since it joined at 0.0
    assert actions[0] == Drop("n1", 1, "no heartbeat for 6.0 s (heartbeat_timeout 3 s)")
    assert stops(actions) == [StopWorkers(1, ("n0", "n2"), "node n1 (10.0.0.2) lost: no heartbeat for 6.0 s "
                                                           "(heartbeat_timeout 3 s); standby node n3 (10.0.0.4) takes "
                                                           "its place")]
    [second] = started(h.stopped(6.5, N0, N2))
    assert ranks(second) == [("n0", 0, 0), ("n3", 1, 2), ("n2", 2, 4)]  # n2 keeps its node rank
    assert second.joined == (N3,) and h.state.standbys == ()


def test_any_number_of_arrivals_past_max_wait_as_standbys_and_each_loss_promotes_the_first_in_line():
    """No count of arrivals refuses a launcher or ends the job (NVRx's "Maximum number of nodes exceeded"): with MAX
    2, ten more launchers all wait, in the order they came; each member lost is replaced by the first of them."""
    h = History(spec(1, 2))
    h.running(0.0, N1)
    spares = [node(i) for i in range(2, 12)]
    assert h.at(1.0, *map(join, spares)) == [Admit(n.node_id, standby=True) for n in spares]
    assert h.state.standbys == tuple(spares) and h.state.phase == m.RUNNING
    for i, lost in enumerate([N1, spares[0], spares[1]]):
        h.at(2.0 + i, Closed(lost.node_id))
        [next_] = started(h.stopped(2.5 + i, N0))
        assert ranks(next_) == [("n0", 0, 0), (spares[i].node_id, 1, 2)]  # the lost one's node rank, full size
        assert h.state.standbys == tuple(spares[i + 1:])
    assert not [a for a in h.actions if isinstance(a, (Refuse, EndJob, Drop))]


def test_a_node_rejoining_from_the_same_host_before_its_loss_is_seen_is_a_standby_that_replaces_it():
    h = History(spec(2, 3))
    h.running(0.0, N1, N2)
    n1_again = node(1, new="b")
    assert h.at(2.0, join(n1_again)) == [Admit("n1b", standby=True)]  # the old n1 still counts, for now
    h.beat(2.5, N2, n1_again)
    h.at(3.0, TimePassed())
    [second] = started(h.stopped(3.5, N0, N2))
    assert ranks(second) == [("n0", 0, 0), ("n1b", 1, 2), ("n2", 2, 4)]


def test_a_node_rejoining_from_the_same_host_after_its_loss_goes_last():
    h = History(spec(2, 3))
    h.running(0.0, N1, N2)
    h.at(1.0, Closed("n1"))
    h.at(1.1, join(node(1, new="b")))
    [second] = started(h.stopped(1.2, N0, N2))
    assert ranks(second) == [("n0", 0, 0), ("n2", 1, 2), ("n1b", 2, 4)]


def test_a_lost_standby_is_only_forgotten():
    h = History(spec(2, 3))
    h.running(0.0, N1, N2)
    h.at(1.0, join(N3))
    assert h.at(1.5, Closed("n3")) == [] and h.state.standbys == ()
    assert "standby node n3 (10.0.0.4) left: its connection closed" in h.words()


def test_nodes_of_different_sizes_are_admitted_each_first_rank_the_sum_of_the_workers_before_it():
    """As torchrun's agents assign them: node ranks in order of arrival, global ranks a running sum."""
    h = History(spec(2, 3), keeper=node(0, workers=4))
    assert h.at(0.1, join(node(1, workers=1))) == [Admit("n1")]
    first = h.running(0.2, node(2, workers=3))
    assert ranks(first) == [("n0", 0, 0), ("n1", 1, 4), ("n2", 2, 5)] and first.world_size == 8
    assert "round 1 (start): 3 node(s), world size 8" in m.describe(first)
    h.at(1.0, Closed("n1"))
    [second] = started(h.stopped(1.1, node(0, workers=4), node(2, workers=3)))
    assert ranks(second) == [("n0", 0, 0), ("n2", 1, 4)] and second.world_size == 7


@pytest.mark.parametrize("workers", [0, -1, True, "2", 2.0, None])
def test_a_node_with_no_whole_number_of_workers_is_refused(workers):
    h = History(spec(2, 3))
    [refusal] = h.at(0.1, join(Node("n1", "10.0.0.2", workers)))
    assert refusal == Refuse("n1", f"it has {workers!r} workers; a node needs one at least")


def full_with_standbys(*standbys: Node) -> History:
    """A 2:2 job of n0 (2 workers) and n1 (2 workers) running, ``standbys`` waiting in that order."""
    h = History(spec(2, 2))
    h.running(0.0, N1)
    for standby in standbys:
        assert h.at(1.0, join(standby)) == [Admit(standby.node_id, standby=True)]
    return h


def test_a_lost_members_place_goes_to_the_first_standby_of_its_size_and_every_rank_stays():
    small, big = node(2, workers=1), node(3, workers=2)
    h = full_with_standbys(small, big)
    before = h.state.round
    h.at(2.0, Closed("n1"))
    [second] = started(h.stopped(2.1, N0))
    assert ranks(second) == [("n0", 0, 0), ("n3", 1, 2)] and second.world_size == before.world_size == 4
    assert h.state.standbys == (small,)  # the one of another size waits on, first in line
    assert "standby node n3 (10.0.0.4) takes its place" in h.words()[-2]


def test_with_no_standby_of_its_size_the_first_standby_joins_last_and_the_ranks_after_move():
    h = History(spec(3, 3))
    h.running(0.0, N1, N2)
    small, smaller = node(3, workers=1), node(4, workers=3)
    h.at(1.0, join(small), join(smaller))
    h.at(2.0, Closed("n1"))
    [second] = started(h.stopped(2.1, N0, N2))
    assert ranks(second) == [("n0", 0, 0), ("n2", 1, 2), ("n3", 2, 4)] and second.world_size == 5
    assert h.state.standbys == (smaller,)
    assert ("node n1 (10.0.0.2) lost: its connection closed; standby node n3 (10.0.0.4) joins last (1 worker(s), "
            "not 2: the ranks after move)") in h.words()


def test_a_fixed_world_size_keeps_with_spares_of_the_nodes_size():
    """N:N with every launcher's --nproc_per_node the same: any loss is replaced in place, the world size stays."""
    h = full_with_standbys(node(2), node(3))
    for now, lost in ((2.0, "n1"), (4.0, "n2")):
        h.at(now, Closed(lost))
        [round_] = started(h.stopped(now + 0.1, *(n for n in h.state.members if n.node_id != lost)))
        assert round_.world_size == 4 and [x.first_rank for x in round_.members] == [0, 2]


def test_the_job_ends_with_0_once_every_member_of_the_round_is_done():
    h = History(spec(2, 3))
    first = h.running(0.0, N1, N2)
    assert h.at(1.0, RoundDone("n1", first.number)) == []
    assert h.at(1.1, RoundDone("n1", first.number + 5)) == []  # another round's: ignored
    assert h.at(1.2, RoundDone("n0", first.number)) == []
    [end] = h.at(1.3, RoundDone("n2", first.number))
    assert end == EndJob(0, "every worker of round 1 finished", ("n0", "n1", "n2"))


def test_a_member_done_while_a_re_form_stops_the_round_counts_as_stopped():
    h = History(spec(2, 3))
    first = h.running(0.0, N1, N2)
    h.at(1.0, Closed("n2"))
    h.at(1.1, WorkersStopped("n0", first.number))
    [second] = started(h.at(1.2, RoundDone("n1", first.number)))
    assert [m.node.node_id for m in second.members] == ["n0", "n1"]


# ---------------------------------------------------------------- refusals


def test_refusals_name_the_reason():
    h = History(spec(1, 1, node_hosts=("10.0.0.1", "10.0.0.2")))
    assert h.at(0.1, join(N1, job="other")) == [Refuse("n1", "its job id is 'other', this job's is 'job'")]
    assert h.at(0.2, join(Node("n0", "10.0.0.2", 1))) == [Refuse(
        "n0", "the node id 'n0' is taken by a launcher already in the job (on 10.0.0.1); each launcher makes an id "
              "of its own")]
    assert h.at(0.3, join(node(1, workers=0))) == [Refuse("n1", "it has 0 workers; a node needs one at least")]
    assert h.at(0.4, join(N2)) == [Refuse("n2", "its host 10.0.0.3 is not one of the job's nodes "
                                                "(10.0.0.1,10.0.0.2)")]
    assert h.at(0.5, join(N1)) == [Admit("n1", standby=True)]  # MAX is 1: it waits for a place
    assert h.state.standbys == (N1,) and ranks(h.state.round) == [("n0", 0, 0)]


def test_an_identity_of_the_wrong_kinds_off_the_wire_is_refused():
    h = History(spec(1, 3))
    for bad in (Node("n5", "10.0.0.6", True), Node("n5", "10.0.0.6", "2"), Node("n5", "10.0.0.6", -1)):
        assert h.at(0.1, join(bad)) == [Refuse("n5", f"it has {bad.workers!r} workers; a node needs one at least")]
    assert h.at(0.2, join(Node("", "10.0.0.6", 1))) == [Refuse("", "its node id '' or host '10.0.0.6' is not a name")]
    assert h.at(0.3, join(Node("n5", None, 1))) == [Refuse("n5", "its node id 'n5' or host None is not a name")]
    assert h.state.members == (N0,) and h.state.heard == {}


def test_a_duplicate_of_a_member_is_refused_and_changes_nothing():
    h = History(spec(2, 3))
    first = h.running(0.0, N1)
    assert h.at(1.0, join(Node("n1", "10.0.0.9", 2))) == [Refuse(
        "n1", "the node id 'n1' is taken by a launcher already in the job (on 10.0.0.2); each launcher makes an id "
              "of its own")]
    assert h.state.round == first and h.state.phase == m.RUNNING


# ---------------------------------------------------------------- restarts and the end


def test_a_worker_failure_spends_a_restart_and_a_membership_change_does_not():
    h = History(spec(1, 3, restarts=1))
    h.running(0.0, N1, N2)
    h.at(1.0, Closed("n2"))
    # the stop's own exits are no failure, and a report of an earlier round is stale
    assert h.at(1.1, WorkerFailed("n1", 1, 143, "rank 2 was killed by SIGTERM")) == []
    h.stopped(1.2, N0, N1)
    assert h.at(1.3, WorkerFailed("n1", 1, 3, "old")) == []
    assert (h.state.round.number, h.state.round.restarts, h.state.restarts) == (2, 0, 0)
    actions = h.at(2.0, WorkerFailed("n1", 2, 3, "rank 2 failed (exit code 3)"))
    assert stops(actions) == [StopWorkers(2, ("n0", "n1"), "rank 2 failed (exit code 3): restarting the job "
                                                           "(1 of 1 restarts)")]
    [third] = started(h.stopped(2.5, N0, N1))
    assert (third.number, third.why, third.restarts, ranks(third)) == (3, "restart", 1,
                                                                       [("n0", 0, 0), ("n1", 1, 2)])
    h.at(3.0, join(N2))  # a join: a new round, no restart spent
    assert started(h.stopped(3.1, N0, N1))[0].restarts == 1
    assert h.at(4.0, WorkerFailed("n0", 4, 7, "rank 0 failed (exit code 7)")) == [
        EndJob(7, "rank 0 failed (exit code 7) (restarts spent: 1 of 1)", ("n0", "n1", "n2"))]


def test_without_restarts_a_worker_failure_ends_the_job_with_its_code():
    h = History(spec(2, 3))
    h.running(0.0, N1)
    assert h.at(1.0, WorkerFailed("n1", 1, 9, "rank 3 failed (exit code 9)"), WorkerFailed("n0", 1, 1, "later")) == [
        EndJob(9, "rank 3 failed (exit code 9) (restarts spent: 0 of 0)", ("n0", "n1"))]


def test_elastic_level_0_a_failing_node_leaves_and_the_others_go_on_without_a_restart():
    h = History(spec(1, 3, restarts=2, failed_node_leaves=True))
    h.running(0.0, N1, N2)
    actions = h.at(1.0, WorkerFailed("n1", 1, 3, "rank 2 failed (exit code 3)"))
    assert actions[0] == Drop("n1", 3, "rank 2 failed (exit code 3)")
    assert stops(actions)[0].nodes == ("n0", "n2")
    [second] = started(h.stopped(1.5, N0, N2))
    assert (second.restarts, ranks(second)) == (0, [("n0", 0, 0), ("n2", 1, 2)])
    assert second.left == ((N1, "rank 2 failed (exit code 3); it leaves the job (--elastic_level 0)"),)
    assert h.at(2.0, WorkerFailed("n0", 2, 5, "rank 0 failed (exit code 5)")) == [
        EndJob(5, "rank 0 failed (exit code 5) (restarts spent: 0 of 2)", ("n0", "n2"))]  # node 0 cannot leave


def test_the_jobs_end_reaches_every_member_and_standby_and_then_nothing_changes():
    h = History(spec(1, 2))
    h.running(0.0, N1)
    h.at(1.0, join(N2))
    assert h.at(2.0, JobEnded(0, "every worker finished")) == [EndJob(0, "every worker finished", ("n0", "n1", "n2"))]
    assert h.state.end == (0, "every worker finished") and m.next_deadline(h.state) is None
    assert h.at(3.0, join(N3)) == [Refuse("n3", "the job has ended")]
    assert h.at(4.0, Closed("n1"), WorkerFailed("n1", 1, 3, "x"), TimePassed(), JobEnded(1, "again")) == []


def test_stray_reports_change_nothing():
    h = History(spec(1, 3))
    first = h.running(0.0, N1)
    assert h.at(0.5, WorkersStopped("n1", 1), WorkersStopped("n9", 1), Heartbeat("n9"), Closed("n9"),
                WorkerFailed("n9", 1, 3, "x")) == []
    assert h.state.round == first and h.state.phase == m.RUNNING


def test_describe_a_round():
    round_ = m.Round(3, (m.Member(N0, 0, 0), m.Member(N3, 1, 2)), 4, "lost", joined=(N3,),
                     left=((N1, "its connection closed"),), restarts=1)
    assert m.describe(round_) == ("round 3 (lost): 2 node(s), world size 4; left: node n1 (10.0.0.2) (its connection "
                                  "closed); joined: node n3 (10.0.0.4)")
    assert round_.member("n3") == m.Member(N3, 1, 2) and round_.member("n1") is None


def test_words_for_the_console_are_at_the_right_level():
    h = History(spec(2, 3))
    h.running(0.0, N1)
    h.at(1.0, Closed("n1"))
    levels = {a.text: a.level for a in h.actions if isinstance(a, Say)}
    assert levels["node n1 (10.0.0.2) lost: its connection closed"] == logging.WARNING
    assert levels["round 1 (start): 2 node(s), world size 4"] == logging.INFO


# ---------------------------------------------------------------- found by tests/test_membership_properties.py


def test_a_last_call_over_while_a_stop_is_awaited_sets_no_deadline_in_the_past():
    """The last call ended while node 0's own stop was still awaited: ``next_deadline`` was the last call's, in the
    past, and node 0's keeper turned without waiting (a busy loop, up to close_timeout)."""
    h = History(spec(2, 3))
    h.running(0.0, N1)
    h.at(5.0, Closed("n1"))
    h.at(6.0, join(N2))
    assert h.at(8.0, Heartbeat("n2"), TimePassed()) == []  # the last call is over; node 0's stop holds the round
    assert m.next_deadline(h.state) == 8.0 + SILENCE  # n2's silence, not the last call (7.0)
    assert ranks(started(h.stopped(8.5, N0))[0]) == [("n0", 0, 0), ("n2", 1, 2)]


def test_silent_nodes_found_together_before_a_round_make_one_round_not_one_started_and_stopped():
    """The first silence found started the round with the next silent node in it, which stopped it at once."""
    h = History(spec(1, 5))
    h.at(0.0, join(N1), join(N2), join(N3))
    h.beat(2.0, N3)
    actions = h.at(3.5, TimePassed())  # the last call is long over; n1 and n2 silent since 0.0
    assert [type(a) for a in actions] == [Drop, Drop, StartRound]
    assert ranks(started(actions)[0]) == [("n0", 0, 0), ("n3", 1, 2)]


def test_elastic_level_0_with_etcd_node_0s_worker_failure_ends_the_job_as_with_c10d():
    """With etcd the verdict on a failure waits for a loss (failure_grace); node 0's own, with --elastic_level 0,
    then spent a restart, where c10d ends the job: node 0 cannot leave it."""
    h = History(replace(spec(1, 3, restarts=2, failed_node_leaves=True), backend="etcd"))
    h.running(0.0, N1)
    assert stops(h.at(1.0, WorkerFailed("n0", 1, 5, "rank 0 failed (exit code 5)")))  # a loss may yet explain it
    h.stopped(1.5, N0, N1)
    h.beat(2.5, N1)
    assert h.at(1.0 + SILENCE, TimePassed()) == []  # etcd may yet delete a lost node's key (ETCD.expiry_lag)
    assert h.at(1.0 + SILENCE + ETCD.expiry_lag, TimePassed()) == [
        EndJob(5, "rank 0 failed (exit code 5) (restarts spent: 0 of 2)", ("n0", "n1"))]


def test_a_keeper_that_took_over_is_never_dropped_for_its_own_silence():
    """A record read back from etcd hears every node, the new keeper too: its silence was judged, and it was
    dropped (its own orders: leave) while it kept the membership."""
    spec_ = replace(spec(1, 2), backend="etcd")
    h = History(spec_)
    h.running(0.0, N1)
    theirs = es.decode(es.encode(es.Record(h.state), None, "job"), spec_, "job", None, 1.0)
    alive = {"n1": ek.Joiner(N1, 1, 2, True)}
    record, _ = es.take_over(theirs, spec_, N1, "job", alive, 1.0)
    h.state, _, _ = es.reconcile(record, alive, [], set(), 1.0)
    h.state = h.state.state
    assert h.state.keeper == "n1" and "n1" not in h.state.heard
    [second] = started(h.stopped(1.5, N1))
    assert ranks(second) == [("n1", 0, 0)]
    assert h.at(100.0, TimePassed()) == [] and m.next_deadline(h.state) is None


@pytest.mark.parametrize("reason, kind", [
    ("its connection closed", "lost"),
    ("its key in etcd is gone (its lease expired, or it left)", "lost"),
    ("no heartbeat for 3.2 s (heartbeat_timeout 3 s)", "silent"),
    ("rank 2 failed (exit code 3); it leaves the job (--elastic_level 0)", "left"),
    ("its workers did not stop within 30 s (close_timeout)", "lost"),
])
def test_each_way_a_member_goes_has_its_kind_in_the_round_s_changes(reason, kind):
    from launcher.nodes.elastic.model import Round, round_start
    from launcher.nodes.transport.messages import Change

    round_ = Round(3, (), 2, "lost", joined=(N1,), left=((N2, reason),))
    assert round_start(round_).changes == (Change(N2.node_id, N2.host, kind, reason), Change(N1.node_id, N1.host, "joined", ""))


def test_a_fixed_count_formed_by_arrival_waits_for_n_and_names_the_count_as_given():
    """torchrun's recipe (--nnodes 2, no node rank) is 2:2: it starts with 2 at once, and without them gives up."""
    h = History(spec(2, 2))
    [admit, start] = h.at(0.5, join(N1))
    assert admit == Admit("n1") and ranks(start.round) == [("n0", 0, 0), ("n1", 1, 2)]  # MAX: no last call
    alone = History(spec(2, 2))
    [end] = alone.at(JOIN, TimePassed())
    assert end.reason == "only 1 node(s) joined within 60 s (join_timeout), 2 needed (--nnodes 2)"
