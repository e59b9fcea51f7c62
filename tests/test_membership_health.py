"""The membership's rules for a node's health checks (launcher.nodes.elastic.membership), replayed on a fake clock:
a joiner that fails them is kept out and admitted once it passes; a member whose checks fail after its worker
failure leaves as unhealthy, spending no restart, a standby that passed taking its place; a standby that fails them
is set aside, never promoted, until it passes."""

from launcher.nodes.elastic import membership as m
from launcher.nodes.elastic.membership import (Admit, Checked, JoinAsked, KeepOut, StartRound, StopWorkers,
                                               WorkerFailed, WorkersStopped)
from launcher.nodes.elastic.model import change_kind, round_start
from test_membership import N0, N1, N2, N3, History, spec

SICK = "node n1 (10.0.0.2) failed the health check shm: /dev/shm is full; mend the node, or skip the check with ..."


def kept_out(actions):
    return [a for a in actions if isinstance(a, KeepOut)]


def test_a_joiner_that_fails_its_checks_is_kept_out_and_admitted_once_it_passes():
    h = History(spec(2, 2))
    assert h.at(0.0, JoinAsked(N1, "job", SICK)) == [KeepOut("n1", SICK)]
    assert h.state.known("n1") is None and h.state.phase == m.WAITING  # not admitted, nothing started
    assert any("kept out" in w for w in h.words())
    actions = h.at(30.0, JoinAsked(N1, "job"))  # asked again, passing
    assert actions[0] == Admit("n1") and isinstance(actions[-1], StartRound)


def test_a_refusal_of_another_kind_comes_first():
    h = History(spec(2, 2))
    assert h.at(0.0, JoinAsked(N1, "other job", SICK))[0].reason.startswith("its job id is")


def start_with_standby(restarts=1):
    h = History(spec(2, 2, restarts=restarts))
    h.running(0.0, N1)
    h.at(1.0, JoinAsked(N2, "job"))  # at MAX: a standby
    return h


def test_a_member_whose_checks_fail_after_its_failure_leaves_unhealthy_and_a_standby_takes_its_place():
    h = start_with_standby()
    actions = h.at(2.0, WorkerFailed("n1", 1, 1, "rank 2 failed", SICK))
    assert actions[0] == KeepOut("n1", SICK, admitted=True)
    stop = next(a for a in actions if isinstance(a, StopWorkers))
    assert stop.nodes == ("n0",)  # the sick one is not waited for: its own failure stopped its workers
    actions = h.at(3.0, WorkersStopped("n0", 1))
    started = next(a for a in actions if isinstance(a, StartRound)).round
    assert [x.node.node_id for x in started.members] == ["n0", "n2"]
    assert started.restarts == 0 and h.state.restarts == 0  # no restart spent
    changes = {c.node_id: c for c in round_start(started).changes}
    assert (changes["n1"].kind, changes["n2"].kind) == ("unhealthy", "joined")
    assert changes["n1"].reason == f"{SICK}; it leaves the job unhealthy"
    assert change_kind(changes["n1"].reason) == "unhealthy"
    assert "n1" in h.state.aside and N1 in h.state.standbys  # it stays, aside, checking again


def test_a_failure_that_passes_its_checks_spends_a_restart_as_before():
    h = start_with_standby()
    h.at(2.0, WorkerFailed("n1", 1, 1, "rank 2 failed"))
    h.at(3.0, WorkersStopped("n0", 1), WorkersStopped("n1", 1))
    assert h.state.round.number == 2 and h.state.restarts == 1
    assert [x.node.node_id for x in h.state.round.members] == ["n0", "n1"]


def test_node_0_cannot_leave_its_failure_is_judged_as_any():
    h = start_with_standby()
    h.at(2.0, WorkerFailed("n0", 1, 1, "rank 0 failed", SICK))
    assert h.state.restarts == 1 and "n0" not in h.state.aside


def test_a_sick_standby_is_set_aside_and_never_promoted_until_it_passes():
    h = History(spec(1, 2))
    h.running(0.0, N1)
    h.at(1.0, JoinAsked(N2, "job"))
    assert kept_out(h.at(2.0, Checked("n2", SICK))) == [KeepOut("n2", SICK, True)]
    assert h.at(3.0, Checked("n2", SICK)) == []  # said once
    h.at(4.0, m.Closed("n1"))  # a member lost: no standby fit to take its place
    h.at(5.0, WorkersStopped("n0", 1))
    assert [x.node.node_id for x in h.state.round.members] == ["n0"]
    actions = h.at(6.0, Checked("n2"))  # it passes: below MAX, it joins
    assert any(isinstance(a, StopWorkers) for a in actions)
    h.at(7.0, WorkersStopped("n0", 2))
    assert [x.node.node_id for x in h.state.round.members] == ["n0", "n2"] and not h.state.aside


def test_a_fit_standby_is_promoted_before_a_sick_one_that_came_first():
    h = History(spec(2, 2))
    h.running(0.0, N1)
    h.at(1.0, JoinAsked(N2, "job"), JoinAsked(N3, "job"))
    h.at(2.0, Checked("n2", SICK))
    h.at(3.0, m.Closed("n1"))
    h.at(4.0, WorkersStopped("n0", 1))
    assert [x.node.node_id for x in h.state.round.members] == ["n0", "n3"]


def test_a_check_of_a_node_not_standing_by_changes_nothing():
    h = History(spec(2, 2))
    h.running(0.0, N1)
    assert h.at(1.0, Checked("n1", SICK), Checked("nobody", SICK)) == []


def test_a_member_whose_workers_all_finished_is_not_waited_for_when_another_s_failure_re_forms_the_round():
    h = start_with_standby()
    h.at(1.5, m.RoundDone("n0", 1))  # node 0's workers all finished: nothing of the round left to stop there
    h.at(2.0, WorkerFailed("n1", 1, 1, "rank 2 failed", SICK))
    assert h.state.unstopped == frozenset() or "n0" not in h.state.unstopped
    assert h.state.round.number == 2 and [x.node.node_id for x in h.state.round.members] == ["n0", "n2"]
