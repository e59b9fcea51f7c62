"""The link contract (``launcher.nodes.elastic.link.Link``), the same tests on every backend: c10d on loopback
sockets, etcd on the in-memory etcd (tests/memory_etcd.py), both on a fake clock (tests/link_harness.py).
A new backend is its harness (a ``link_harness.Harness``) and one more line in ``HARNESSES``.

What every backend promises the event loop: the first round with every node and dense ranks; a member
lost, or silent past heartbeat_timeout, stops the round and the survivors form the next; a joiner below
MAX re-forms the job; a failure spends a restart and restarts the same members; every member done ends
the job with 0; a member that leaves is counted out; too few nodes is one sentence; close() is safe twice
and leaves no thread running."""

import threading

import pytest

from launcher.nodes.elastic import link as el
from launcher.nodes.transport import messages as m
from launcher.plan import elastic_backends
from launcher.nodes.elastic.model import STRAGGLES
from launcher.nodes.transport.messages import SHARE_EVERY, NodeSpeed
from link_harness import INTERVAL, C10d, Etcd

HARNESSES = [  # the contract suite's parameters: one line per backend
    C10d,
    Etcd,
]


def test_every_backend_that_forms_a_link_is_under_the_contract():
    assert sorted(h.row.name for h in HARNESSES) == sorted(r.name for r in elastic_backends.ROWS if r.forms)


@pytest.fixture(params=HARNESSES, ids=lambda harness: harness.row.name)
def backend(request):
    made = []

    def make(*args, **kwargs):
        harness = request.param(*args, **kwargs)
        made.append(harness)
        return harness
    yield make
    for harness in made:
        harness.close()


def formed(backend, count=3, low=2, high=3, **settings):
    harness = backend(low, high, **settings)
    links = harness.form(count)
    errors = [x for x in links if isinstance(x, Exception)]
    assert not errors, errors
    harness.serve()
    return harness, links


def numbers(round_):
    return [(s.node_rank, s.first_rank) for s in el.members(round_)]


def ids(round_):
    return {s.node_id for s in round_.members}


def next_round_after_stop(harness, survivors, number, reason_has=""):
    """Each survivor is told to stop round ``number`` and, once all said so, gets round ``number + 1``."""
    for link in survivors:
        stop = harness.await_item(link, m.StopWorkers, lambda s: s.round == number)
        assert reason_has in stop.reason
    for link in survivors:
        link.stopped(number)
    return [harness.await_item(link, m.RoundStart, lambda r: r.number == number + 1) for link in survivors]


def test_the_first_round_has_every_node_with_dense_ranks(backend):
    harness, links = formed(backend)
    firsts = [x.first for x in links]
    assert {r.number for r in firsts} == {1} and {r.world_size for r in firsts} == {3}
    assert numbers(firsts[0]) == [(0, 0), (1, 1), (2, 2)]
    assert ids(firsts[0]) == {x.node_id for x in links}
    assert sorted(el.place_in(x.first, x.node_id).node_rank for x in links) == [0, 1, 2]


def test_a_member_lost_stops_the_round_and_the_survivors_form_the_next(backend):
    harness, links = formed(backend)
    lost = next(x for x in links if el.place_in(x.first, x.node_id).node_rank == 2)
    survivors = [x for x in links if x is not lost]
    harness.crash(lost)
    rounds = next_round_after_stop(harness, survivors, 1)
    assert all(ids(r) == {x.node_id for x in survivors} for r in rounds)
    assert numbers(rounds[0]) == [(0, 0), (1, 1)] and rounds[0].world_size == 2
    # c10d: its connection closed; the in-memory etcd has no liveness ring: only its lease's expiry tells
    (change,) = rounds[0].changes
    assert change.node_id == lost.node_id and change.kind == harness.crash_seen_as


def test_a_silent_member_is_lost_after_heartbeat_timeout_and_not_before(backend):
    harness, links = formed(backend)
    silent = next(x for x in links if el.place_in(x.first, x.node_id).node_rank == 1)
    survivors = [x for x in links if x is not silent]
    harness.silence(silent)
    began = harness.clock()
    stop = harness.await_item(survivors[0], m.StopWorkers, lambda s: s.round == 1)
    assert harness.clock() - began >= harness.rendezvous.heartbeat_timeout - INTERVAL, stop
    for link in survivors:
        link.stopped(1)
    second = harness.await_item(survivors[0], m.RoundStart, lambda r: r.number == 2)
    assert silent.node_id not in ids(second) and len(second.members) == 2


def test_a_joiner_below_max_re_forms_the_job(backend):
    harness, links = formed(backend, count=2, low=2, high=3)
    assert links[0].first.world_size == 2
    late = []
    thread = threading.Thread(target=lambda: late.append(harness.join_late()), daemon=True)
    thread.start()
    for link in links:
        harness.await_item(link, m.StopWorkers, lambda s: s.round == 1)
    for link in links:
        link.stopped(1)
    thread.join(120)
    assert late and isinstance(late[0], el.LinkBase), late
    second = harness.await_item(links[0], m.RoundStart, lambda r: r.number == 2)
    assert late[0].first.number == 2 and ids(second) == {x.node_id for x in links + late}
    assert numbers(second) == [(0, 0), (1, 1), (2, 2)]


def test_a_failure_spends_a_restart_and_restarts_the_same_members(backend):
    harness, links = formed(backend, max_restarts=1)
    failing = links[1]
    failing.failed(1, 3, "rank 1 exited with code 3")
    rounds = next_round_after_stop(harness, links, 1, "rank 1 exited with code 3")
    assert all(r.restarts == 1 and ids(r) == {x.node_id for x in links} for r in rounds)


def test_a_failure_with_no_restart_left_ends_the_job_with_its_code(backend):
    harness, links = formed(backend)
    links[2].failed(1, 3, "rank 2 exited with code 3")
    for link in links:
        over = harness.await_item(link, el.JobOver)
        assert over.code == 3 and "rank 2 exited with code 3" in over.reason


def test_every_member_done_ends_the_job_with_0(backend):
    harness, links = formed(backend)
    for link in links:
        link.done(1)
    for link in links:
        assert harness.await_item(link, el.JobOver).code == 0


def test_a_member_that_leaves_is_counted_out_as_left(backend):
    """A launcher that ends on a stop signal says so before its connection closes (c10d) or its lease is revoked
    (etcd: ``departures``): the next round names it as left."""
    harness, links = formed(backend)
    leaving = next(x for x in links if el.place_in(x.first, x.node_id).node_rank == 2)
    survivors = [x for x in links if x is not leaving]
    leaving.leave(130, "node 2 received SIGINT: this node leaves the job")
    harness.quiet.add(id(leaving))
    leaving.close()
    rounds = next_round_after_stop(harness, survivors, 1)
    assert all(leaving.node_id not in ids(r) for r in rounds)
    (change,) = rounds[0].changes
    assert (change.node_id, change.kind) == (leaving.node_id, "left") and "SIGINT" in change.reason


def test_a_member_that_leaves_as_a_straggler_is_counted_as_one(backend):
    """--straggler_policy leave: the node named leaves as a stop signal makes it; the next round says why."""
    harness, links = formed(backend)
    leaving = next(x for x in links if el.place_in(x.first, x.node_id).node_rank == 2)
    survivors = [x for x in links if x is not leaving]
    leaving.leave(0, f"{STRAGGLES} (its speed 0.25 of the fastest rank's, --straggler_policy leave)")
    harness.quiet.add(id(leaving))
    leaving.close()
    rounds = next_round_after_stop(harness, survivors, 1)
    (change,) = rounds[0].changes
    assert (change.node_id, change.kind) == (leaving.node_id, "straggler") and "0.25" in change.reason


def test_every_member_gets_every_member_s_speed_of_the_round_and_none_spoken_for_another(backend):
    """Each link shares its node's speed entry; every link gets the three back (through node 0's launcher, or each
    one's key in etcd); an entry a member gives for another node's seat, or of another round, is never passed on."""
    harness, links = formed(backend)
    seats = {x.node_id: el.place_in(x.first, x.node_id).node_rank for x in links}
    forger = links[0]
    forger.share_speed(NodeSpeed((seats[forger.node_id] + 1) % 3, "forged", 1, 9, (0, 0.001), (0, 0.001)))
    harness.tick(int(SHARE_EVERY / INTERVAL) + 1)
    forger.share_speed(NodeSpeed(seats[forger.node_id], "h", 0, 9, (0, 0.001), (0, 0.001)))  # round 0: not this one
    harness.tick(int(SHARE_EVERY / INTERVAL) + 1)
    for x in links:
        x.share_speed(NodeSpeed(seats[x.node_id], "h", 1, 10, (seats[x.node_id], 0.5), (seats[x.node_id], 0.5)))
    for x in links:
        got = harness.await_item(x, m.Speeds, lambda s: len(s.nodes) == 3)
        assert {(e.node, e.host, e.round) for e in got.nodes} == {(0, "h", 1), (1, "h", 1), (2, "h", 1)}
    assert not any(e.host == "forged" or e.round == 0 for x in links for item in harness.items(x)
                   if isinstance(item, m.Speeds) for e in item.nodes)


def test_too_few_nodes_within_join_timeout_is_one_sentence(backend):
    harness = backend(2, 2, join_timeout=5.0)
    (outcome,) = harness.form(1)
    assert isinstance(outcome, el.StartFailed), outcome
    text = str(outcome)
    assert "\n" not in text and text.endswith(".") and "join_timeout" in text, text


def test_close_is_safe_twice_and_leaves_no_thread(backend):
    harness, links = formed(backend)
    harness.close()  # each link closed while time passes (node 0 waits a while on the clock for the others to go)
    for link in links:
        link.close()
    alive = [t.name for t in threading.enumerate() if t.name.startswith("elastic-") and
             any(t is x.thread for x in links)]
    assert not alive
    for link in links:
        link.stopped(1)  # after close: queued for nobody, never raises
        link.leave(1, "late")


def test_the_keepers_loss_ends_the_job_or_another_launcher_keeps_it(backend):
    harness, links = formed(backend)
    keeper = next(x for x in links if el.place_in(x.first, x.node_id).node_0)
    others = [x for x in links if x is not keeper]
    harness.crash(keeper)
    if harness.keeper_loss_ends_the_job:
        for link in others:
            assert harness.await_item(link, el.JobOver).code == 1
    else:
        rounds = next_round_after_stop(harness, others, 1)
        assert all(keeper.node_id not in ids(r) and len(r.members) == 2 for r in rounds)


def test_heartbeat_ages_are_the_keeper_s_with_c10d_and_each_launcher_s_own_with_etcd(backend):
    harness, links = formed(backend)
    harness.tick(3)  # a few beats
    ages = [link.heartbeat_ages() for link in links]
    if harness.row.any_node_may_be_lost:  # etcd keeps the leases: each launcher tells how long since its own renewal
        assert all(set(a) == {link.node_id} and a[link.node_id] >= 0 for a, link in zip(ages, links))
    else:  # node 0 hears the members' beats: it tells theirs, the others none
        (keeper,) = [a for a in ages if a]
        assert len(keeper) == 2 and all(age >= 0 for age in keeper.values())
