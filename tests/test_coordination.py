"""The coordination of one job across nodes and attempts, replayed against a fake channel and a
fake clock: no process, no socket, each test in milliseconds. As in honcho's manager tests, a
test states what happened (the channel's events, turn by turn) and asserts on what was ordered
(the messages each node sent, the decisions, the causes every node shows)."""

import inspect
from types import SimpleNamespace
from typing import Optional

import signal

import pytest

from launcher.nodes.static import coordinator, follower as follower_module
from launcher.nodes.transport import messages
from launcher.nodes.static.channel import HubChannel, Gone, Joined, Received, SpokeChannel
from launcher.nodes.static.coordinator import REPORT_MARGIN, Leader, Solo
from launcher.nodes.static.follower import Follower
from launcher.nodes.static.hub import Hub
from launcher.nodes.static.spoke import Spoke
from launcher.plan import policy
from launcher.plan.policy import Cause

SIGTERM = 15


class FakeClock:
    """Monotonic seconds that move only when the test says so."""

    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


class FakeChannel:
    """What both fakes share: the selector's part does nothing; what was sent is kept, typed."""

    def __init__(self) -> None:
        self.sent: list = []
        self.closed = False

    def registrations(self) -> dict:
        return {}

    def next_deadline(self) -> Optional[float]:
        return None

    def ready(self, fd: int, mask: int, now: float) -> list:
        return []

    def tick(self, now: float) -> list:
        return []

    def node_name(self, node: int) -> str:
        return f"node {node} (10.0.0.{node + 1})"

    def close(self) -> None:
        self.closed = True


class FakeHub(FakeChannel):
    """Node 0's end (a channel.HubChannel): the test says who joined; ``sent`` holds (to, message),
    ``to`` a node or "all"."""

    def __init__(self, joined=()) -> None:
        super().__init__()
        self.peers = set(joined)
        self.ever_joined = set(joined)

    def send(self, node: int, message: dict) -> None:
        if node in self.peers:
            self.sent.append((node, messages.from_wire(message)))

    def broadcast(self, message: dict) -> None:
        self.sent.append(("all", messages.from_wire(message)))

    def joined(self) -> set:
        return set(self.peers)

    def heard_ages(self, now: float) -> dict:
        return {node: 1.5 for node in self.peers}


class FakeSpoke(FakeChannel):
    """Another node's end (a channel.SpokeChannel); ``sent`` holds what went to node 0."""

    def __init__(self, welcomed: bool = True) -> None:
        super().__init__()
        self.welcomed = welcomed

    def send(self, message: dict) -> None:
        if self.welcomed:
            self.sent.append(messages.from_wire(message))


def plan(node_rank: int, nodes: int = 2, max_restarts: int = 0, servers=(), trainers=()) -> SimpleNamespace:
    """``servers``, ``trainers``: parameter-server mode, the node of each server and of each trainer."""
    ips = tuple(f"10.0.0.{n + 1}" for n in range(nodes))
    return SimpleNamespace(node_rank=node_rank, node_ip=ips[node_rank], node_ips=ips, max_restarts=max_restarts,
                           shutdown_timeout=10.0, control=SimpleNamespace(job_id="job1", heartbeat_timeout=3.0),
                           servers=tuple(f"{ips[n]}:6170" for n in servers),
                           trainers=tuple(f"{ips[n]}:{6171 + i}" for i, n in enumerate(trainers)),
                           parameter_server=bool(servers))


def leader(nodes: int = 2, max_restarts: int = 0, joined=None, servers=(), trainers=()) -> Leader:
    joined = range(1, nodes) if joined is None else joined
    return Leader(plan(0, nodes, max_restarts, servers, trainers), FakeHub(joined), FakeClock())


def follower(node: int = 1, nodes: int = 2, max_restarts: int = 0, welcomed: bool = True) -> Follower:
    return Follower(plan(node, nodes, max_restarts), FakeSpoke(welcomed), FakeClock())


def failure(node: int, code: int = 3) -> Cause:
    return Cause(node, "worker", code, f"rank {2 * node} on node {node} (10.0.0.{node + 1}) failed (exit code {code})")


def said(node: int, message) -> Received:
    """``message`` as node ``node`` sent it (node 0, to a follower), off the wire."""
    return Received(node, messages.to_wire(message))


def orders(hub: FakeHub) -> list:
    """What node 0 told every node, as a follower receives it."""
    return [said(0, m) for to, m in hub.sent if to == "all"]


def finish(node, *turns, clock: Optional[FakeClock] = None, step: float = 0.0) -> tuple:
    """``finish_attempt`` with a history: each turn of the event loop brings the channel events (fed to
    the coordinator) and policy events (such as a StopSignal) of one list; the clock moves ``step``
    seconds a turn. A coordinator that waits past the history fails the test (no endless wait)."""
    history = iter(turns)

    def turn() -> list:
        events = next(history, None)
        if events is None:
            raise AssertionError("the coordinator waited past the end of the history")
        if clock is not None:
            clock.now += step
        wire = [e for e in events if isinstance(e, (Joined, Received, Gone))]
        return [e for e in events if e not in wire] + node.on_events(wire)

    return node.finish_attempt(turn)


# ---------------------------------------------------------------- restarts across nodes


def test_node_0_orders_a_restart_and_the_follower_follows_with_the_next_attempt_number():
    node0, node1 = leader(max_restarts=2), follower(max_restarts=2)
    node1.local_cause(failure(1))
    assert node1.channel.sent == [messages.Failed(0, failure(1))]
    assert node0.on_events([said(1, node1.channel.sent[0])]) == [policy.StopOrdered(failure(1).text)]
    assert node0.channel.sent == [("all", messages.Stop(0, failure(1)))]
    assert node1.on_events(orders(node0.channel)) == [policy.StopOrdered(failure(1).text)]
    # node 1's processes are gone: it reports, and node 0, once every node has, orders attempt 1
    assert finish(node0, [said(1, messages.Report(0, failure(1)))]) == ("restart", 1)
    assert node0.channel.sent[-1] == ("all", messages.Start(1))
    assert finish(node1, orders(node0.channel)[-1:]) == ("restart", 1)
    assert node1.channel.sent[-1] == messages.Report(0, failure(1))
    assert (node0.attempt, node0.cause, node1.attempt, node1.cause, node1.final_cause()) == (1, None, 1, None, None)


def test_attempt_numbers_run_on_to_the_last_restart_then_the_job_ends_with_the_failure():
    node0, node1 = leader(max_restarts=2), follower(max_restarts=2)
    decisions = []
    for attempt in range(3):
        node0.local_cause(failure(0, code=7))
        node1.on_events(orders(node0.channel)[-1:])
        decisions.append((finish(node0, [said(1, messages.Report(attempt, None))]),
                          finish(node1, orders(node0.channel)[-1:])))
    assert decisions == [(("restart", 1), ("restart", 1)), (("restart", 2), ("restart", 2)), (("end", 7), ("end", 7))]
    assert [m for to, m in node0.channel.sent if not isinstance(m, messages.Stop)] == \
        [messages.Start(1), messages.Start(2), messages.End(2, 7, failure(0, code=7))]
    assert node1.final_cause() == failure(0, code=7)


def test_a_message_of_an_earlier_attempt_is_not_taken_for_one_of_this_attempt():
    node0 = leader(max_restarts=1)
    node0.local_cause(failure(0))
    assert finish(node0, [said(1, messages.Report(0, None))]) == ("restart", 1)
    assert node0.on_events([said(1, messages.Failed(0, failure(1))), said(1, messages.Report(0, None))]) == []
    assert node0.cause is None and node0.reports == {}
    node1 = follower(max_restarts=1)
    assert node1.on_events([said(0, messages.Stop(5, failure(0)))]) == []
    assert finish(node1, [said(0, messages.Start(0))], [said(0, messages.Start(1))]) == ("restart", 1)


# ---------------------------------------------------------------- a lost node, two failures at once


def test_a_lost_node_is_named_in_the_cause_that_every_node_shows():
    node0 = leader(nodes=3, max_restarts=3)
    reason = "node 2 (10.0.0.3) lost: no heartbeat for 6.0 s"
    assert node0.on_events([Gone((2,), "lost", reason)]) == [policy.StopOrdered(reason)]
    assert node0.cause == Cause(2, "lost", 1, reason)
    # node 2 is not waited for; node 1 reports; a lost node is no cause to restart
    assert finish(node0, [said(1, messages.Report(0, None))]) == ("end", 1)
    assert node0.channel.sent == [("all", messages.Stop(0, node0.cause)), ("all", messages.End(0, 1, node0.cause))]
    node1 = follower(nodes=3, max_restarts=3)
    assert node1.on_events(orders(node0.channel)[:1]) == [policy.StopOrdered(reason)]
    assert finish(node1, orders(node0.channel)[1:]) == ("end", 1)
    assert "node 2 (10.0.0.3) lost" in node1.final_cause().text


def test_of_two_failures_at_once_the_first_reported_is_the_root_cause_on_every_node():
    node0 = leader(nodes=3)
    events = node0.on_events([said(2, messages.Failed(0, failure(2))), said(1, messages.Failed(0, failure(1)))])
    assert events == [policy.StopOrdered(failure(2).text)]
    node0.local_cause(failure(0))  # its own workers fail a moment later: not the root cause
    assert node0.channel.sent == [("all", messages.Stop(0, failure(2)))]
    assert finish(node0) == ("end", 3)
    assert node0.channel.sent[-1] == ("all", messages.End(0, 3, failure(2)))
    node1 = follower(nodes=3)
    node1.local_cause(failure(1))
    node1.on_events(orders(node0.channel)[:1])
    assert finish(node1, orders(node0.channel)[1:]) == ("end", 3)
    assert node1.final_cause() == failure(2)  # node 0's word, not its own failure


def test_a_failure_reported_only_in_a_report_still_stops_every_node():
    node0 = leader(nodes=3)
    assert node0.on_events([said(1, messages.Report(0, failure(1)))]) == [policy.StopOrdered(failure(1).text)]
    assert node0.reports == {1: failure(1)}


# ---------------------------------------------------------------- strangers and odd messages


@pytest.mark.parametrize("message", [
    {"type": "hello", "identity": {}, "node": 1, "nonce": "a" * 32},
    {"type": "order66", "attempt": 0},
    {"type": "failed", "attempt": 0, "cause": {"node": "x"}},
    {"type": "failed", "attempt": "0", "cause": failure(1).as_dict()},
    {"type": "report"},
    {"type": "stop", "attempt": 0, "cause": failure(0).as_dict()},  # an order, from a node that is not node 0
])
def test_a_message_no_node_sends_node_0_is_ignored_and_the_job_runs_on(message):
    node0 = leader()
    assert node0.on_events([Received(1, message)]) == []
    assert node0.cause is None and node0.channel.sent == []


@pytest.mark.parametrize("message", [
    {"type": "failed", "attempt": 0, "cause": failure(0).as_dict()},
    {"type": "stop", "attempt": 0},
    {"type": "finish", "attempt": 1},
    {"type": "beat!", "x": [1, 2]},
])
def test_a_message_node_0_never_sends_is_ignored_by_a_follower(message):
    node1 = follower()
    assert node1.on_events([Received(0, message)]) == []
    assert node1.root is None and node1.order is None


# ---------------------------------------------------------------- joining late, or never


def test_a_node_that_joins_after_the_stop_is_told_at_once():
    node0 = leader(nodes=3, joined=[1])
    node0.local_cause(failure(0))
    node0.channel.peers.add(2)
    node0.channel.ever_joined.add(2)
    assert node0.on_events([Joined(2)]) == []
    assert node0.channel.sent[-1] == (2, messages.Stop(0, failure(0)))


def test_a_follower_that_joins_late_says_again_what_it_said_before_node_0_answered():
    node1 = follower(welcomed=False)
    node1.local_cause(failure(1))  # node 0 has not answered: the message went nowhere
    assert node1.channel.sent == []
    node1.channel.welcomed = True
    node1.on_events([Joined(0)])
    assert node1.channel.sent == [messages.Failed(0, failure(1))]
    node2 = follower(welcomed=False)
    node2.trainers_done()
    node2.channel.welcomed = True
    node2.on_events([Joined(0)])
    assert node2.channel.sent == [messages.TrainersDone(0)]


def test_a_follower_that_joins_while_its_report_is_due_reports_on_joining():
    node1 = follower(welcomed=False)
    node1.local_cause(failure(1))  # node 0 has not answered yet: neither this nor the report reaches it

    def welcomed() -> list:
        node1.channel.welcomed = True
        return [Joined(0)]
    history = [welcomed, lambda: [said(0, messages.End(0, 3, failure(1)))]]
    assert node1.finish_attempt(lambda: node1.on_events(history.pop(0)())) == ("end", 3)
    assert node1.channel.sent == [messages.Report(0, failure(1))]


def test_a_node_that_never_joined_is_named_and_not_waited_for_when_the_work_is_done():
    node0 = leader(nodes=3, joined=[1])
    assert finish(node0, [said(1, messages.Report(0, None))]) == ("end", 0)
    assert node0.channel.sent == [("all", messages.End(0, 0, None))]


def test_a_node_that_never_joined_stops_the_job_when_the_join_timeout_passes():
    node0 = leader(nodes=3, joined=[1], max_restarts=3)
    reason = "node 2 (10.0.0.3) never joined within 60 s (node 0 listens on port 7000)"
    assert node0.on_events([Gone((2,), "join", reason)]) == [policy.StopOrdered(reason)]
    assert finish(node0, [said(1, messages.Report(0, None))]) == ("end", 1)
    assert node0.channel.sent[-1] == ("all", messages.End(0, 1, Cause(2, "join", 1, reason)))


def test_a_follower_that_node_0_never_answered_ends_with_0_once_its_workers_are_done(caplog):
    node1 = follower(welcomed=False)
    assert finish(node1, [], [], clock=node1.clock, step=2.0) == ("end", 0)  # the heartbeat timeout (3 s) passed
    assert node1.clock.now == 104.0 and node1.channel.sent == []
    assert "node 0 (10.0.0.1) never answered within 3 s; this node's workers all finished" in caplog.text


def test_a_follower_whose_workers_ended_before_node_0_answered_still_reports_when_it_does():
    """A parameter-server node whose trainer finished in 0.5 s, while node 0 (busy starting) had not yet
    answered: had it ended at once, node 0 would have taken its trainer for one that never ran."""
    node1 = follower(welcomed=False)
    node1.trainers_done()  # went nowhere

    def welcomed() -> list:
        node1.channel.welcomed = True
        return [Joined(0)]
    history = [lambda: [], welcomed, lambda: [said(0, messages.End(0, 0, None))]]
    assert node1.finish_attempt(lambda: node1.on_events(history.pop(0)())) == ("end", 0)
    # on joining, in the order it happened: its trainers are done, and its part is over (reported once)
    assert node1.channel.sent == [messages.TrainersDone(0), messages.Report(0, None)]


def test_node_0_stops_its_servers_when_a_node_that_joined_after_its_trainers_ended_reports():
    """Node 1's trainer ended before node 0 answered; node 0's servers run until it hears that the
    trainer is done: without it, both launchers waited for ever (seen in CI)."""
    node0 = leader(servers=(0,), trainers=(0, 1))
    assert node0.trainers_done() == []  # node 1's trainer is not known to be done
    node1 = follower(welcomed=False)
    node1.trainers_done()

    def welcomed() -> list:
        node1.channel.welcomed = True
        return [Joined(0)]
    history = [welcomed, lambda: [said(0, messages.End(0, 0, None))]]
    assert node1.finish_attempt(lambda: node1.on_events(history.pop(0)())) == ("end", 0)
    assert node0.on_events([said(1, m) for m in node1.channel.sent]) == [TRAINERS_DONE]


def test_a_signal_while_a_follower_waits_for_node_0_to_answer_ends_it_with_the_signals_code():
    node1 = follower(welcomed=False)
    assert finish(node1, [policy.StopSignal(signal.SIGTERM)]) == ("end", 128 + signal.SIGTERM)


# ---------------------------------------------------------------- node 0 lost


def test_when_node_0_is_lost_a_follower_stops_and_ends_with_code_1():
    node1 = follower()
    reason = "node 0 (10.0.0.1) lost: connection lost (connection closed)"
    assert node1.on_events([Gone((0,), "lost", reason)]) == [policy.StopOrdered(reason)]
    assert finish(node1) == ("end", 1)
    assert node1.final_cause() == Cause(0, "lost", 1, reason)


def test_node_0_lost_while_a_follower_waits_for_its_order():
    node1 = follower()
    assert finish(node1, [], [], [Gone((0,), "lost", "node 0 (10.0.0.1) lost: no heartbeat for 6.0 s")]) == ("end", 1)
    assert node1.channel.sent == [messages.Report(0, None)]


# ---------------------------------------------------------------- the end


@pytest.mark.parametrize("cause, code", [(None, 0), (failure(1, code=5), 5)])
def test_every_node_ends_with_node_0s_code(cause, code):
    node0, node1, node2 = leader(nodes=3), follower(1, nodes=3), follower(2, nodes=3)
    if cause is not None:
        node1.local_cause(cause)
        node0.on_events([said(1, node1.channel.sent[-1])])
    assert finish(node0, [said(1, messages.Report(0, cause))], [said(2, messages.Report(0, None))]) == ("end", code)
    for node in (node1, node2):
        assert finish(node, *[[order] for order in orders(node0.channel)]) == ("end", code)
        assert node.final_cause() == cause


def test_node_0_goes_on_without_a_node_that_never_reports_after_the_stop():
    clock = FakeClock()
    node0 = Leader(plan(0, 3, max_restarts=1), FakeHub([1, 2]), clock)
    node0.local_cause(failure(0))
    turns = [[said(1, messages.Report(0, None))]] + [[]] * 30
    assert finish(node0, *turns, clock=clock, step=1.0) == ("restart", 1)  # node 2 never reported
    assert clock.now - 100.0 == pytest.approx(node0.plan.shutdown_timeout + REPORT_MARGIN)


def test_a_stop_signal_while_node_0_waits_becomes_the_root_cause():
    node0 = leader()
    decision = finish(node0, [policy.StopSignal(SIGTERM)], [said(1, messages.Report(0, None))])
    assert decision == ("end", 128 + SIGTERM)
    assert node0.channel.sent[0] == ("all", messages.Stop(0, Cause(0, "signal", 143, "node 0 (10.0.0.1) received SIGTERM")))


def test_a_stop_signal_while_a_follower_waits_ends_it_with_the_signal_code():
    node1 = follower()
    assert finish(node1, [policy.StopSignal(SIGTERM)]) == ("end", 143)
    assert node1.channel.sent[-1] == messages.Failed(0, Cause(1, "signal", 143, "node 1 (10.0.0.2) received SIGTERM"))


def test_parameter_servers_stop_once_every_nodes_trainers_are_done():
    node0, node1 = leader(servers=[0], trainers=[0, 1]), follower()
    assert node0.trainers_done() == []
    assert node1.trainers_done() == []
    assert node0.on_events([said(1, node1.channel.sent[-1])]) == [policy.TrainersDone("every trainer of the job finished")]
    assert node1.on_events(orders(node0.channel)) == [policy.TrainersDone("every trainer of the job finished")]


# ---------------------------------------------------------------- parameter servers, a node that never joined

TRAINERS_DONE = policy.TrainersDone("every trainer of the job finished")


def test_a_node_holding_a_trainer_that_never_joined_stops_the_job_once_the_other_trainers_are_done():
    node0 = leader(nodes=3, joined=[1], servers=[0, 0], trainers=[0, 1, 2, 2], max_restarts=3)
    assert node0.trainers_done() == []  # node 1's trainers still run
    text = ("node 2 (10.0.0.3) never joined, so trainers 2, 3 never ran; "
            "the trainers of every other node finished")
    assert node0.on_events([said(1, messages.TrainersDone(0))]) == [policy.StopOrdered(text)]
    assert node0.cause == Cause(2, "join", 1, text)
    assert node0.channel.sent == [("all", messages.Stop(0, node0.cause))]  # not Finish: the job failed
    assert finish(node0) == ("end", 1)  # no restart, and node 1 is not waited for: a cause that ends the job
    assert node0.channel.sent[-1] == ("all", messages.End(0, 1, node0.cause))
    node1 = follower(nodes=3)
    node1.trainers_done()
    assert node1.on_events(orders(node0.channel)[:1]) == [policy.StopOrdered(text)]
    assert finish(node1, orders(node0.channel)[1:]) == ("end", 1)
    assert node1.final_cause() == node0.cause


def test_nodes_that_never_joined_are_named_with_their_trainers():
    node0 = leader(nodes=3, joined=[], servers=[0], trainers=[0] + [1] * 5 + [2] * 5)
    [stop] = node0.trainers_done()
    assert stop.reason == ("node 1 (10.0.0.2), node 2 (10.0.0.3) never joined, so trainers 1, 2, 3, 4, 5, 6, 7, 8, "
                           "... (10 in all) never ran; the trainers of every other node finished")


def test_a_node_holding_only_servers_that_never_joined_is_named_and_the_job_ends_with_0(caplog):
    node0 = leader(nodes=3, joined=[1], servers=[0, 2], trainers=[0, 1])
    assert node0.trainers_done() == []
    assert node0.on_events([said(1, messages.TrainersDone(0))]) == [TRAINERS_DONE]
    assert node0.channel.sent == [("all", messages.Finish(0))]
    assert finish(node0, [said(1, messages.Report(0, None))]) == ("end", 0)
    assert node0.channel.sent[-1] == ("all", messages.End(0, 0, None))
    assert ("node 2 (10.0.0.3) never joined, so server 1 never ran; every trainer of the job finished, so the job "
            "ends here with exit code 0") in caplog.text


def test_node_0_with_servers_only_waits_while_no_node_that_joined_holds_a_trainer():
    node0 = leader(nodes=2, joined=[], servers=[0], trainers=[1])
    assert node0.trainers_done() == []  # at once: no trainer here; node 1's have not even started
    assert node0.cause is None and node0.channel.sent == []
    node0.channel.peers.add(1)
    node0.channel.ever_joined.add(1)
    assert node0.on_events([Joined(1)]) == []
    assert node0.on_events([said(1, messages.TrainersDone(0))]) == [TRAINERS_DONE]


def test_a_node_that_joins_once_the_servers_are_stopped_stops_its_own():
    node0 = leader(nodes=3, joined=[1], servers=[0, 2], trainers=[0, 1])
    node0.trainers_done()
    node0.on_events([said(1, messages.TrainersDone(0))])
    node0.channel.peers.add(2)
    node0.channel.ever_joined.add(2)
    assert node0.on_events([Joined(2)]) == []
    assert node0.channel.sent[-1] == (2, messages.Finish(0))
    assert finish(node0, [said(1, messages.Report(0, None))], [said(2, messages.Report(0, None))]) == ("end", 0)


def test_a_node_that_joins_while_trainers_run_is_waited_for():
    node0 = leader(nodes=3, joined=[1], servers=[0], trainers=[0, 1, 2])
    node0.trainers_done()
    node0.channel.peers.add(2)
    node0.channel.ever_joined.add(2)
    assert node0.on_events([Joined(2), said(1, messages.TrainersDone(0))]) == []  # node 2's trainer runs
    assert node0.on_events([said(2, messages.TrainersDone(0))]) == [TRAINERS_DONE]
    assert node0.cause is None


def test_the_trainers_of_a_restarted_attempt_stop_the_servers_again():
    node0 = leader(nodes=2, servers=[0], trainers=[0, 1], max_restarts=1)
    node0.local_cause(failure(1))
    assert finish(node0, [said(1, messages.Report(0, failure(1)))]) == ("restart", 1)
    assert node0.trainers_done() == []
    assert node0.on_events([said(1, messages.TrainersDone(1))]) == [TRAINERS_DONE]
    assert node0.channel.sent[-1] == ("all", messages.Finish(1))


def test_a_trainers_done_message_in_a_collective_job_changes_nothing():
    node0 = leader()
    assert node0.on_events([said(1, messages.TrainersDone(0))]) == []
    assert node0.channel.sent == [] and node0.cause is None


def test_one_node_decides_alone():
    solo = Solo(plan(0, 1, max_restarts=1))
    solo.local_cause(failure(0))
    assert solo.finish_attempt(lambda: []) == ("restart", 1)
    assert solo.signal_cause(SIGTERM) == Cause(0, "signal", 143, "the launcher received SIGTERM")


def test_the_coordinator_reads_no_clock_and_opens_no_socket_of_its_own():
    for module in (coordinator, follower_module):
        assert not {"time", "socket", "selectors"} & set(vars(module))


def protocol_members(protocol) -> tuple:
    """(methods, data attributes) that a typing.Protocol names, its bases' included."""
    methods, data = set(), set()
    for cls in protocol.__mro__:
        if cls.__module__ == "typing" or cls is object:
            continue
        methods |= {name for name, value in vars(cls).items() if callable(value) and not name.startswith("_")}
        data |= set(vars(cls).get("__annotations__", {}))
    return methods, data


@pytest.mark.parametrize("protocol, real, fake", [(HubChannel, Hub, FakeHub), (SpokeChannel, Spoke, FakeSpoke)])
def test_the_real_channel_ends_and_the_fakes_offer_what_the_protocols_name(protocol, real, fake):
    methods, data = protocol_members(protocol)
    assert {"registrations", "next_deadline", "ready", "tick", "node_name", "close", "send"} <= methods
    assert all(callable(getattr(real, name, None)) and callable(getattr(fake, name, None)) for name in methods)
    assert all(hasattr(fake(), name) for name in data)
    if real is Spoke:  # opens no socket until ticked
        spoke = Spoke(messages.Identity("j", ("10.0.0.1", "10.0.0.2"), (7000,), "train.py"), 1, "10.0.0.1", 6999,
                      6.0, 60.0, "token")
        assert all(hasattr(spoke, name) for name in data)
    else:
        assert "self.ever_joined" in inspect.getsource(Hub.__init__)


def test_node_0_tells_each_joined_node_s_heartbeat_age_by_its_index():
    node0 = Leader(plan(0, 3), FakeHub([1, 2]), FakeClock())
    assert node0.heartbeat_ages() == {"1": 1.5, "2": 1.5}
