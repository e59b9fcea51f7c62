"""The straggler's search across nodes and what is done about one, without a process: each node's speed entry
(``messages.NodeSpeed``) on the wire and back (hostile input included), node 0 gathering them (a node speaks for
itself only) and sharing them back, an etcd pace key and its proof, how a member that left is counted, and an
elastic node named a straggler under ``--straggler_policy leave`` (it leaves, or says why it stays)."""

import json
import math

import pytest

from launcher.nodes.elastic import model
from launcher.nodes.elastic.etcd import paces, keys as ek
from launcher.nodes.elastic.job import ElasticJob
from launcher.nodes.transport.messages import Speeds
from launcher.nodes.transport import elastic_messages, messages, wire
from launcher.nodes.transport.messages import NodeSpeed
from launcher.plan import policy, stragglers
from launcher.plan.stragglers import RankTime
from launcher.run.straggler_watch import StragglerWatch
from test_coordination import follower, leader, said

SLOW = NodeSpeed(1, "10.0.0.2", 0, 40, (1, 0.8), (1, 0.8))
FAST = NodeSpeed(0, "10.0.0.1", 0, 40, (0, 0.2), (0, 0.2))


def entry_off_the_wire(entry: list):
    return messages.read_speeds([entry])


def test_an_entry_goes_over_the_wire_and_back_the_same():
    body = wire.encode(messages.to_wire(messages.Speeds((SLOW, FAST))))[wire.LENGTH.size:]
    back = messages.from_wire(json.loads(body))
    assert back == messages.Speeds((SLOW, FAST))
    assert SLOW.rank_times() == (RankTime(1, 1, "10.0.0.2", 0.8, 40),)


@pytest.mark.parametrize("bad", [
    "not a list", [1, "h", 0, 1, 0, 0.1, 0], [[1]] * 3, [1, "h", 0, 1, 0, 0.1, 0, 0.2, 9],
    [1, "h", 0, 1, 0, float("nan"), 0, 0.2], [1, "h", 0, 1, 0, float("inf"), 0, 0.2], [1, "h", 0, 1, 0, -1.0, 0, 0.2],
    [True, "h", 0, 1, 0, 0.1, 0, 0.2], [1, "h", 0, 1, 0, True, 0, 0.2], [1, "h" * 256, 0, 1, 0, 0.1, 0, 0.2],
    [-1, "h", 0, 1, 0, 0.1, 0, 0.2], [1 << 40, "h", 0, 1, 0, 0.1, 0, 0.2], [1, ["h"], 0, 1, 0, 0.1, 0, 0.2],
    [1, "h", 0, 1, 0, "0.1", 0, 0.2], [1, "h", 0, 1.5, 0, 0.1, 0, 0.2], [{"a": 1}, "h", 0, 1, 0, 0.1, 0, 0.2],
])
def test_whatever_is_not_an_entry_is_left_out_and_nothing_raises(bad):
    assert entry_off_the_wire(bad) == ()
    assert messages.from_wire({"type": "speeds", "nodes": [bad, SLOW.as_list()]}) == messages.Speeds((SLOW,))
    assert messages.from_wire({"type": "speeds", "nodes": bad}).nodes in ((), (NodeSpeed(1, "h", 0, 1, (0, 0.1), (0, 0.2)),))


def test_a_message_of_too_many_entries_is_read_up_to_the_bound():
    many = [[n, "h", 0, 1, n, 0.1, n, 0.2] for n in range(messages.SHARED_NODES + 500)]
    assert len(messages.read_speeds(many)) == messages.SHARED_NODES


def test_shared_keeps_the_fastest_and_the_slowest_nodes_when_there_are_too_many():
    entries = [NodeSpeed(n, "h", 0, 1, (n, 1.0 + n), (n, 1.0 + n)) for n in range(messages.SHARED_NODES + 10)]
    kept = messages.shared(entries)
    assert 500 < len(kept) <= messages.SHARED_NODES
    assert kept[0].node == 0  # the fastest: what every node is compared with
    last = messages.SHARED_NODES + 10
    assert {e.node for e in kept[1:]} == set(range(last - len(kept) + 1, last))  # the slowest


def test_a_node_s_entry_is_its_fastest_and_its_slowest_rank():
    own = (RankTime(4, 2, "h", 0.3, 10), RankTime(5, 2, "h", 0.9, 12), RankTime(6, 2, "h", 0.5, 11))
    assert messages.node_speed(own, 3) == NodeSpeed(2, "h", 3, 12, (4, 0.3), (5, 0.9))
    assert messages.node_speed(()) is None


def test_others_are_the_other_nodes_of_this_round_only():
    old_round = NodeSpeed(2, "h", 1, 5, (2, 0.1), (2, 0.1))
    times = messages.others((SLOW, FAST, old_round), own_node=0, round_=0)
    assert [t.rank for t in times] == [1]


def test_node_0_takes_a_node_s_entry_only_for_that_node_and_shares_them_all_back():
    lead = leader(nodes=3)
    forged = NodeSpeed(2, "10.0.0.3", 0, 40, (2, 0.01), (2, 0.01))  # node 1 speaking for node 2
    lead.on_events([said(1, messages.Speeds((forged, SLOW)))])
    lead.on_events([said(2, messages.Speeds((NodeSpeed(1, "x", 0, 1, (1, 9.0), (1, 9.0)),)))])  # and 2 for 1
    lead.share_speed(FAST.rank_times(), lead.clock())
    lead.tick(lead.clock())
    (to, shared), = lead.channel.sent
    assert to == "all" and shared == messages.Speeds((FAST, SLOW))
    assert lead.peer_times(lead.clock()) == SLOW.rank_times()
    lead.tick(lead.clock() + 1)  # within SHARE_EVERY: nothing more sent
    assert len(lead.channel.sent) == 1
    lead.tick(lead.clock() + messages.SHARE_EVERY)
    assert len(lead.channel.sent) == 2


def test_node_0_with_no_entry_sends_none():
    lead = leader(nodes=2)
    lead.share_speed((), lead.clock())
    lead.tick(lead.clock())
    assert lead.channel.sent == []


def test_node_0_shares_no_entry_older_than_stale():
    lead = leader(nodes=2)
    lead.on_events([said(1, messages.Speeds((SLOW,)))])
    lead.clock.now += stragglers.STALE + 1
    lead.tick(lead.clock())
    assert lead.channel.sent == [("all", messages.Speeds(()))] and lead.peer_times(lead.clock()) == ()


def test_a_node_sends_its_own_entry_and_reads_node_0_s_table():
    node = follower(node=1)
    node.share_speed(SLOW.rank_times(), 100.0)
    node.share_speed((), 100.5)  # no rank with a full window: nothing
    assert node.channel.sent == [messages.Speeds((SLOW,))]
    node.on_events([said(0, messages.Speeds((FAST, SLOW)))])
    assert node.peer_times(100.0) == FAST.rank_times()


def test_a_fixed_job_says_why_its_straggler_stays():
    assert "fixed set of nodes" in leader().straggler_stays() and leader().leave_as_straggler(None) == []


def test_only_the_slowest_straggler_leaves_and_only_with_leave():
    slowest, slow = stragglers.Straggler(2, "h", (2,), 0.2, "slowest"), stragglers.Straggler(1, "h", (1,), 0.5, "slow")
    verdict = stragglers.Verdict(stragglers=(slowest, slow))
    assert stragglers.leaving("leave", verdict, 2) == slowest
    assert stragglers.leaving("leave", verdict, 1) is None  # judged again once node 2 is gone
    assert stragglers.leaving("warn", verdict, 2) is None and stragglers.leaving("leave", stragglers.Verdict(), 2) is None


# ---------------------------------------------------------------- etcd's pace keys


def test_a_pace_key_proves_its_writer_and_its_lease():
    value = paces.pace_value("n1", 7, SLOW, "token", "job")
    assert paces.read_pace(value, 7, 7, "token", "job") == ("n1", SLOW)
    assert paces.read_pace(value, 7, 7, "other token", "job") is None  # not proven
    assert paces.read_pace(value, 7, 8, "token", "job") is None  # not under the node's lease
    forged = json.loads(value)
    forged["entry"][5] = 0.001
    assert paces.read_pace(json.dumps(forged), 7, 7, "token", "job") is None
    for junk in ("", "[]", "{", json.dumps({"id": "n1", "entry": "x"}), "[" * 100_000):
        assert paces.read_pace(junk, 7, 7, None, "job") is None
    assert paces.node_id_of(paces.pace_key("/launcher/job/", "host-1/x"), "/launcher/job/") == "host-1/x"
    start, end = ek.orders_span("/launcher/job/")
    assert start <= paces.pace_key("/launcher/job/", "n1") < end  # every launcher watches the paces


# ---------------------------------------------------------------- a member that left, named a straggler


def test_a_member_that_left_as_a_straggler_is_counted_as_one():
    assert model.change_kind(f"{model.STRAGGLES} (its speed 0.25); {model.LEAVES}") == "straggler"
    assert model.change_kind(f"node 2 received SIGTERM; {model.LEAVES}") == "left"
    assert elastic_messages.as_changes([["n", "h", "straggler", "why"]]) == (messages.Change("n", "h", "straggler",
                                                                                            "why"),)


class Link:
    def __init__(self, ends_job=False):
        self.left, self.shared, self.ends_job = [], [], ends_job

    def leave(self, code, reason):
        self.left.append((code, reason))

    def share_speed(self, entry):
        self.shared.append(entry)

    def leaving_ends_job(self):
        return self.ends_job


def elastic_job(nodes=3, min_nodes=2, ends_job=False, me=1):
    from types import SimpleNamespace

    seats = tuple(messages.Seat(f"n{i}", "h", 1, i, i) for i in range(nodes))
    link = Link(ends_job)
    link.inbox, link.first = None, messages.RoundStart(4, seats, nodes, 0, "round 4")
    plan = SimpleNamespace(node_rank=me, node_ip="h")
    return ElasticJob(plan, link, lambda r: plan, 0.0, min_nodes), link


def test_an_elastic_node_above_the_minimum_leaves_and_ends_with_0():
    job, link = elastic_job()
    assert job.straggler_stays() is None
    events = job.leave_as_straggler(stragglers.Straggler(1, "h", (1,), 0.25, "node 1 (h) is a straggler: slow"))
    assert [type(e) for e in events] == [policy.StopOrdered]
    (code, reason), = link.left
    assert code == 0 and model.change_kind(f"{reason}; {model.LEAVES}") == "straggler"
    assert job.finish_attempt(lambda: []) == ("end", 0) and job.final_cause().kind == "leave"
    assert job.leave_as_straggler(stragglers.Straggler(1, "h", (1,), 0.25, "again")) == []  # once


def test_an_elastic_node_at_the_minimum_or_keeping_the_membership_stays():
    assert "minimum of 3 node(s)" in elastic_job(min_nodes=3)[0].straggler_stays()
    assert "node 0 of a c10d job" in elastic_job(ends_job=True, me=0)[0].straggler_stays()


def test_an_elastic_node_shares_its_entry_of_this_round_and_reads_the_members():
    job, link = elastic_job()
    own = (RankTime(1, 1, "h", 0.8, 40),)
    job.share_speed(own, 100.0)
    job.share_speed((), 101.0)  # no rank with a full window: nothing
    assert link.shared == [NodeSpeed(1, "h", 4, 40, (1, 0.8), (1, 0.8))]
    job.on_events([Speeds((NodeSpeed(0, "h", 4, 40, (0, 0.2), (0, 0.2)), NodeSpeed(2, "h", 3, 1, (2, 9.0),
                                                                                                (2, 9.0))))])
    assert [t.rank for t in job.peer_times(100.0)] == [0]  # round 3's entry is not this round's
    assert not math.isnan(job.peer_times(100.0)[0].compute)


def test_a_node_shares_its_ranks_at_most_every_share_every_seconds():
    watch = StragglerWatch()
    assert watch.to_share(99.0) == ()  # no full window yet: nothing, and the next share is not held back
    for step in range(stragglers.WINDOW):
        watch.note(3, 1, "h", {"step": step, "compute": 0.5}, 100.0)
    own = watch.own(100.0)
    assert own and watch.to_share(100.0) == own
    assert watch.to_share(100.0 + messages.SHARE_EVERY / 2) == ()
    assert watch.to_share(100.0 + messages.SHARE_EVERY) == own


def test_ranks_within_the_gap_of_the_fastest_count_as_fast_as_it():
    """Steps of 1-2 ms on a busy machine: relative speeds of 0.5 from jitter alone, and no straggler."""
    times = [RankTime(0, 0, "a", 0.001), RankTime(1, 1, "b", 0.002), RankTime(2, 2, "c", 0.012)]
    verdict = stragglers.judge(times)
    assert verdict.ranks == {0: 1.0, 1: 1.0, 2: pytest.approx(0.001 / 0.012)}  # 11 ms apart: slow
    below = {2: 0}
    for step in range(stragglers.PATIENCE + 1):
        verdict = stragglers.judge([RankTime(0, 0, "a", 0.001, step), RankTime(1, 1, "b", 0.002, step)], below)
        assert not verdict.stragglers and verdict.nodes == {0: 1.0, 1: 1.0}


def test_a_message_of_speeds_stays_within_a_control_message_whatever_the_hosts():
    """1,024 nodes whose hosts have 255 characters: the fastest and as many of the slowest as fit."""
    entries = [NodeSpeed(n, "h" * 255, 0, 1, (n, 1.0 + n), (n, 1.0 + n)) for n in range(1024)]
    kept = messages.shared(entries)
    assert kept[0].node == 0 and kept[-1].node == 1023  # the fastest, and the slowest
    assert len(wire.encode(messages.to_wire(messages.Speeds(kept)))) <= wire.MAX_MESSAGE // 2 + 1024
    assert messages.shared(()) == ()


class Puts:
    """An etcd client that keeps what is put."""

    def __init__(self) -> None:
        self.puts: list = []

    def put(self, key, value, lease) -> None:
        self.puts.append(key)


def members(count: int):
    return model.Round(number=3, members=tuple(model.Member(model.Node(f"n{i}", "h", 1), i, i) for i in range(count)),
                       world_size=count, why="start")


def test_a_pace_that_comes_a_moment_early_is_written_in_a_small_job():
    """The event loop spaces its entries SHARE_EVERY apart already: a second limit of the same period would drop every
    other one that reached the link thread a moment early (its pace then 4 s old, not 2)."""
    written = paces.Paces("/launcher/job/", "n1", None, "job", "etcd")
    client = Puts()
    for now in (100.0, 101.99, 103.98):
        written.write(client, 7, SLOW, members(3), now)
    assert len(client.puts) == 3


def test_a_large_job_spreads_its_paces():
    written = paces.Paces("/launcher/job/", "n1", None, "job", "etcd")
    client = Puts()
    big = members(4 * paces.NODES_PER_PERIOD)  # every 4 periods, within a tenth of it
    for now in (100.0, 102.0, 104.0, 106.0, 107.3, 109.0, 114.6):
        written.write(client, 7, SLOW, big, now)
    assert len(client.puts) == 3  # at 100, 107.3 (7.2 s on) and 114.6
