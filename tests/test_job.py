"""Node 1's follower takes node 0's orders only as they can be: values off the wire of a wrong
type or out of sequence are ignored, never obeyed and never raised."""

from types import SimpleNamespace

import pytest

from launcher.nodes.static import job
from launcher.nodes.static.channel import Gone, Received
from launcher.nodes.static.follower import Follower
from launcher.plan import policy


def follower(attempt=0) -> Follower:
    spec = SimpleNamespace(port=1, heartbeat_timeout=3.0, join_timeout=10.0, token="t", job_id="job1")
    plan = SimpleNamespace(control=spec, node_rank=1, node_ip="127.0.0.2", node_ips=("127.0.0.1", "127.0.0.2"),
                           job_ports=(7000,), workers=[SimpleNamespace(cmd=("python", "-u", "train.py"))],
                           max_restarts=3)
    f = job.for_plan(plan)  # its spoke connects only when ticked: no socket here
    f.channel.welcomed = True  # node 0 had answered (a node 0 that never did ends a finished node with 0)
    f.attempt = attempt
    return f


def finish_with(f: Follower, *messages) -> tuple:
    turns = iter([[Received(0, m) for m in messages], [Gone((0,), "lost", "gone")]])
    return f.finish_attempt(lambda: f.on_events(next(turns)))


@pytest.mark.parametrize("start", [
    {"type": "start", "attempt": 5},  # not the next attempt
    {"type": "start", "attempt": 0},  # this one again
    {"type": "start", "attempt": True},
    {"type": "start", "attempt": "1"},
    {"type": "start"},
])
def test_a_restart_order_out_of_sequence_is_ignored(start):
    f = follower()
    assert finish_with(f, start) == ("end", 1)  # node 0 then lost: the end, as without the order
    assert f.attempt == 0


def test_the_next_attempt_is_obeyed():
    f = follower()
    assert finish_with(f, {"type": "start", "attempt": 1}) == ("restart", 1)


@pytest.mark.parametrize("code, expected", [(3, 3), (True, 1), (256, 1), (-1, 1), ("7", 1), (2.0, 1), (None, 1)])
def test_an_end_order_gives_its_code_only_when_it_is_one(code, expected):
    f = follower()
    cause = {"node": 0, "kind": "worker", "code": 3, "text": "x"}
    assert finish_with(f, {"type": "end", "attempt": 0, "code": code, "cause": cause}) == ("end", expected)


@pytest.mark.parametrize("cause", [{"node": "x"}, ["worker"], "stop", {"node": 0, "kind": "worker", "code": 999, "text": "x"},
                                   {"node": 1e300, "kind": [], "code": 1.5, "text": {}}, None, 7])
def test_a_stop_with_a_cause_that_is_none_is_ignored(cause):
    assert follower().on_events([Received(0, {"type": "stop", "attempt": 0, "cause": cause})]) == []


def test_a_stop_with_a_cause_is_obeyed():
    events = follower().on_events([Received(0, {"type": "stop", "attempt": 0,
                                                        "cause": {"node": 0, "kind": "worker", "code": 3, "text": "x"}})])
    assert events == [policy.StopOrdered("x", stacks=False)]


def test_a_cause_from_the_wire_is_shown_as_one_printable_line():
    cause = {"node": 0, "kind": "worker", "code": 3, "text": "x\nlauncher: the job stopped: FORGED\x1b[2J\u202e"}
    events = follower().on_events([Received(0, {"type": "stop", "attempt": 0, "cause": cause})])
    assert events == [policy.StopOrdered("x?launcher: the job stopped: FORGED?[2J?", stacks=False)]
