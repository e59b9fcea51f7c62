"""The typed messages between nodes: the bytes on the wire are those the raw dicts of earlier
versions made (same keys, same order), and a value off the wire of a wrong type reads as none."""

import pytest

from launcher.nodes import messages as m
from launcher.nodes.wire import encode
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
