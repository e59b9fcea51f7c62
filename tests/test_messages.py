"""The typed messages between nodes: the bytes on the wire are those the raw dicts of earlier
versions made (same keys, same order), and a value off the wire of a wrong type reads as none."""

import pytest

from launcher.nodes.transport import messages as m
from launcher.nodes.transport.wire import encode
from launcher.plan.policy import Cause

CAUSE = Cause(1, "worker", 3, "rank 2 on node 1 failed", "the summary", "")


@pytest.mark.parametrize("message, earlier", [
    (m.Challenge("a" * 32), {"type": "challenge", "nonce": "a" * 32}),
    (m.Hello({"job_id": "j"}, 1, "b" * 32), {"type": "hello", "identity": {"job_id": "j"}, "node": 1, "nonce": "b" * 32}),
    (m.Hello({"job_id": "j"}, 1, "b" * 32, "c" * 64),
     {"type": "hello", "identity": {"job_id": "j"}, "node": 1, "nonce": "b" * 32, "proof": "c" * 64}),
    (m.Welcome(), {"type": "welcome"}),
    (m.Welcome("d" * 64), {"type": "welcome", "proof": "d" * 64}),
    (m.Refusal("wrong job"), {"type": "refused", "reason": "wrong job"}),
    (m.Refusal("wrong job", "e" * 64), {"type": "refused", "reason": "wrong job", "proof": "e" * 64}),
    (m.Beat(), {"type": "beat"}),
    (m.Failed(0, CAUSE), {"type": "failed", "attempt": 0, "cause": CAUSE.as_dict()}),
    (m.Report(2, None), {"type": "report", "attempt": 2, "cause": None}),
    (m.Report(2, CAUSE), {"type": "report", "attempt": 2, "cause": CAUSE.as_dict()}),
    (m.TrainersDone(1), {"type": "trainers_done", "attempt": 1}),
    (m.Stop(0, CAUSE), {"type": "stop", "attempt": 0, "cause": CAUSE.as_dict()}),
    (m.Finish(0), {"type": "finish", "attempt": 0}),
    (m.Start(1), {"type": "start", "attempt": 1}),
    (m.End(0, 3, CAUSE), {"type": "end", "attempt": 0, "code": 3, "cause": CAUSE.as_dict()}),
    (m.End(0, 0, None), {"type": "end", "attempt": 0, "code": 0, "cause": None}),
    (m.Join(1, 3, "10.0.0.2", "f" * 32), {"type": "join", "rank": 1, "size": 3, "address": "10.0.0.2", "nonce": "f" * 32}),
    (m.Join(1, 3, "10.0.0.2", "f" * 32, "0" * 64),
     {"type": "join", "rank": 1, "size": 3, "address": "10.0.0.2", "nonce": "f" * 32, "proof": "0" * 64}),
    (m.NodeList(["10.0.0.1", "10.0.0.2"]), {"type": "nodes", "nodes": ["10.0.0.1", "10.0.0.2"]}),
])
def test_each_message_has_the_bytes_of_the_earlier_raw_dict_and_reads_back_as_itself(message, earlier):
    assert encode(m.to_wire(message)) == encode(earlier)
    assert m.from_wire(earlier) == message


@pytest.mark.parametrize("wire, message", [
    ({"type": "stop", "attempt": True, "cause": CAUSE.as_dict()}, m.Stop(1, CAUSE)),  # compared as before: True == 1
    ({"type": "stop", "attempt": 1.0, "cause": {"node": "x"}}, m.Stop(1, None)),
    ({"type": "failed", "attempt": 1.5, "cause": []}, m.Failed(None, None)),
    ({"type": "report", "attempt": "0"}, m.Report(None, None)),
    ({"type": "start", "attempt": True}, m.Start(None)),  # a restart order takes an int only
    ({"type": "start", "attempt": 1.0}, m.Start(None)),
    ({"type": "end", "code": 256, "cause": {}}, m.End(None, 1, None)),
    ({"type": "end", "attempt": 0, "code": True}, m.End(0, 1, None)),
    ({"type": "challenge", "nonce": 7}, m.Challenge(None)),
    ({"type": "refused", "reason": ["x"], "proof": 5}, m.Refusal(None, None)),
    ({"type": "welcome", "proof": {"a": 1}}, m.Welcome(None)),
    ({"type": "hello", "identity": "job", "node": "1", "nonce": None, "proof": 5}, m.Hello(None, "1", None, 5)),
    ({"type": "nodes", "nodes": ["10.0.0.1", 2]}, m.NodeList(None)),
    ({"type": "join", "rank": True, "size": 3.0, "address": 7, "proof": ["x"]}, m.Join(None, None, None, None, None)),
    ({"type": "ready", "nodes": []}, m.Unknown("ready")),
])
def test_a_field_of_a_wrong_type_reads_as_none(wire, message):
    assert m.from_wire(wire) == message


def test_a_long_node_list_is_named_by_its_digest_in_the_identity():
    few = m.Identity("j", tuple(f"10.0.{n // 250}.{n % 250}" for n in range(m.LISTED_NODES)), (7000,), "train.py")
    many = m.Identity("j", few.nodes + ("10.9.9.9",), (7000,), "train.py")
    assert few.as_dict()["nodes"] == list(few.nodes)
    assert many.as_dict()["nodes"].startswith("sha256:")
    assert many.mismatch(many.as_dict()) is None
    assert few.mismatch(many.as_dict()).startswith("its nodes is 'sha256:")
    assert few.mismatch("job") == "no job identity"


MEMBERS = [["a1", "127.0.0.1", 2, 0, 0], ["b2", "127.0.0.1", 2, 1, 2]]


@pytest.mark.parametrize("message, wire", [
    (m.Hello({"job_id": "j"}, None, None, node_id="a1", host="10.0.0.2", workers=2),
     {"type": "hello", "identity": {"job_id": "j"}, "node": None, "nonce": None, "node_id": "a1", "host": "10.0.0.2",
      "workers": 2}),
    (m.Admitted(True), {"type": "admitted", "standby": True}),
    (m.RoundStart(2, tuple(m.Seat(*x) for x in MEMBERS), 4, 0, "round 2 (lost)"),
     {"type": "round", "number": 2, "members": MEMBERS, "world_size": 4, "restarts": 0, "text": "round 2 (lost)"}),
    (m.RoundStart(3, (), 2, 0, "round 3", (m.Change("b", "h", "silent", "no heartbeat for 3.1 s"),
                                          m.Change("c", "h", "joined", "")), "lost"),
     {"type": "round", "number": 3, "members": [], "world_size": 2, "restarts": 0, "text": "round 3",
      "changes": [["b", "h", "silent", "no heartbeat for 3.1 s"], ["c", "h", "joined", ""]], "why": "lost"}),
    (m.StopWorkers(3, "lost"), {"type": "stop_workers", "round": 3, "reason": "lost"}),
    (m.Stopped(3), {"type": "stopped", "round": 3}),
    (m.RoundDone(3), {"type": "round_done", "round": 3}),
    (m.RoundFailed(3, 7, "rank 1 failed"), {"type": "round_failed", "round": 3, "code": 7, "reason": "rank 1 failed"}),
    (m.Dropped(1, "no heartbeat"), {"type": "dropped", "code": 1, "reason": "no heartbeat"}),
])
def test_the_elastic_messages_read_back_as_themselves(message, wire):
    assert m.to_wire(message) == wire
    assert m.from_wire(wire) == message


@pytest.mark.parametrize("wire, message", [
    ({"type": "hello", "node_id": 5, "host": ["x"], "workers": 1.0}, m.Hello(None, None, None)),
    ({"type": "hello", "node_id": "a", "workers": True}, m.Hello(None, None, None, node_id="a")),
    ({"type": "admitted", "standby": 1}, m.Admitted(None)),
    ({"type": "round", "number": "2", "members": [["a", "h", 1, 0]], "world_size": 1.0, "restarts": None},
     m.RoundStart(None, None, None, None)),
    ({"type": "round", "number": 1, "members": [["a", "h", True, 0, 0]]}, m.RoundStart(1, None, None, None)),
    ({"type": "round", "number": 1, "members": "a"}, m.RoundStart(1, None, None, None)),
    ({"type": "round", "number": 1, "members": [["a", 7, 1, 0, 0]]}, m.RoundStart(1, None, None, None)),
    ({"type": "stop_workers", "round": False}, m.StopWorkers(None)),
    ({"type": "stopped"}, m.Stopped(None)),
    ({"type": "round", "number": 1, "text": 5}, m.RoundStart(1, None, None, None)),
    ({"type": "round", "number": 1, "changes": [["b", "h", "gone", ""]]}, m.RoundStart(1, None, None, None)),
    ({"type": "round", "number": 1, "changes": [["b", "h", "lost"]]}, m.RoundStart(1, None, None, None)),
    ({"type": "round", "number": 1, "changes": [["b", "h", "lost", 5]]}, m.RoundStart(1, None, None, None)),
    ({"type": "round", "number": 1, "changes": {"b": "lost"}}, m.RoundStart(1, None, None, None)),
    ({"type": "round", "number": 1, "changes": [[[["b"]]], "h", "lost", ""]}, m.RoundStart(1, None, None, None)),
    ({"type": "round_done", "round": 1.0}, m.RoundDone(None)),
    ({"type": "round_failed", "round": "1", "code": 300, "reason": ["x"]}, m.RoundFailed(None, 1, None)),
    ({"type": "dropped", "code": -1, "reason": {}}, m.Dropped(1, None)),
])
def test_an_elastic_field_of_a_wrong_type_reads_as_none(wire, message):
    assert m.from_wire(wire) == message
