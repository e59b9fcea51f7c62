"""The control channel's pieces: framing, identity, proofs, and a real hub and spoke on loopback."""

import json
import selectors
import socket
import struct
import threading
import time

import pytest

from launcher.nodes.transport.auth import Session, fresh_nonce, proof, step_proof
from launcher.nodes.static.channel import Gone, Joined, Received
from launcher.nodes.transport.connection import tune
from launcher.nodes.transport.connection import HELLO_TIMEOUT
from launcher.nodes.transport.listener import MAX_PENDING
from launcher.nodes.static.hub import Hub
from launcher.nodes.transport.messages import Identity
from launcher.nodes.static.spoke import Spoke
from launcher.nodes.transport.wire import encode, Framer, MAX_FRAME, MAX_MESSAGE, ProtocolError, sized_for
from tests.conftest import free_port, pose_as_node_0

IDENTITY = Identity("job1", ("127.0.0.1", "127.0.0.2"), (7000,), "-u train.py")


def test_framing_round_trip_in_pieces():
    data = encode({"type": "beat"}) + encode({"type": "stop", "cause": {"x": [1, 2]}})
    framer = Framer()
    got = []
    for i in range(len(data)):  # one byte at a time
        got += framer.feed(data[i:i + 1])
    assert got == [{"type": "beat"}, {"type": "stop", "cause": {"x": [1, 2]}}]


@pytest.mark.parametrize("junk, why", [
    (struct.pack("!I", MAX_MESSAGE + 1), "bytes (the limit"),
    (struct.pack("!I", 3) + b"\xff\xfe\x00", "not JSON"),
    (struct.pack("!I", 2) + b"[]", "without a type"),
    (struct.pack("!I", 12) + b'{"type": 1 }', "without a type"),
    (b"GET / HTTP/1.1\r\n\r\n", "bytes (the limit"),
])
def test_junk_is_a_protocol_error(junk, why):
    with pytest.raises(ProtocolError, match=why.replace("(", r"\(")):
        Framer().feed(junk)


def test_a_peer_not_yet_proven_is_limited_and_a_message_of_the_job_is_not():
    big = encode({"type": "nodes", "nodes": [f"10.{i // 65536}.{i // 256 % 256}.{i % 256}" for i in range(80000)]})
    assert len(big) > 16 * MAX_MESSAGE  # 80,000 ranks' hosts: 10,000 nodes x 8
    with pytest.raises(ProtocolError, match="bytes"):
        Framer().feed(big)
    assert len(Framer(sized_for(80000)).feed(big)[0]["nodes"]) == 80000
    assert len(Framer(MAX_FRAME).feed(big)[0]["nodes"]) == 80000


def test_identity_mismatch_names_the_field():
    assert IDENTITY.mismatch(IDENTITY.as_dict()) is None
    other = {**IDENTITY.as_dict(), "script": "-u other.py"}
    assert "its script is '-u other.py'" in IDENTITY.mismatch(other)
    assert IDENTITY.mismatch("junk") == "no job identity"
    assert "job_id" in IDENTITY.mismatch({})


def test_the_hello_of_a_job_of_10000_nodes_fits_one_message():
    nodes = tuple(f"10.{i // 65536}.{i // 256 % 256}.{i % 256}" for i in range(10000))
    mine = Identity("job1", nodes, tuple(range(6070, 6078)), "-u train.py")
    hello = {"type": "hello", "identity": mine.as_dict(), "node": 1, "nonce": "a" * 32, "proof": "b" * 64}
    assert Framer().feed(encode(hello)) == [hello]
    assert mine.mismatch(hello["identity"]) is None
    other = Identity("job1", nodes[:-1] + ("10.9.9.9",), mine.ports, mine.script)
    assert "its nodes is 'sha256:" in mine.mismatch(other.as_dict())


def test_proof_depends_on_token_nonce_job_and_node():
    p = proof("secret", "n1", "job1", 1)
    assert p == proof("secret", "n1", "job1", 1)
    assert len({p, proof("other", "n1", "job1", 1), proof("secret", "n2", "job1", 1),
                proof("secret", "n1", "job2", 1), proof("secret", "n1", "job1", 2)}) == 5


# ---------------------------------------------------------------- a real hub and spoke


def pump(channels, seconds, until=None):
    """Drive the channels' sockets and timers like the launcher's loop does; their events."""
    events = []
    deadline = time.monotonic() + seconds
    with selectors.DefaultSelector() as sel:
        while time.monotonic() < deadline and not (until and until(events)):
            for key in list(sel.get_map().values()):
                sel.unregister(key.fd)
            for ch in channels:
                for fd, mask in ch.registrations().items():
                    sel.register(fd, mask, ch)
            for key, mask in sel.select(0.02):
                events += key.data.ready(key.fd, mask, time.monotonic())
            for ch in channels:
                events += ch.tick(time.monotonic())
    return events


def test_a_spoke_joins_the_hub_and_both_hear_each_other():
    port = free_port()
    hub = Hub(IDENTITY, "127.0.0.1", port, heartbeat_timeout=3, join_timeout=10, token=None)
    spoke = Spoke(IDENTITY, 1, "127.0.0.1", port, heartbeat_timeout=3, join_timeout=10, token=None)
    try:
        events = pump([hub, spoke], 5, until=lambda ev: sum(isinstance(e, Joined) for e in ev) == 2)
        assert {(type(e).__name__, e.node) for e in events} == {("Joined", 1), ("Joined", 0)}
        hub.send(1, {"type": "stop", "attempt": 0})
        spoke.send({"type": "report", "attempt": 0})
        events = pump([hub, spoke], 5, until=lambda ev: len(ev) == 2)
        assert Received(0, {"type": "stop", "attempt": 0}) in events
        assert Received(1, {"type": "report", "attempt": 0}) in events
    finally:
        hub.close()
        spoke.close()


def test_a_wrong_token_is_refused_and_the_right_one_joins():
    port = free_port()
    hub = Hub(IDENTITY, "127.0.0.1", port, heartbeat_timeout=3, join_timeout=10, token="right")
    wrong = Spoke(IDENTITY, 1, "127.0.0.1", port, heartbeat_timeout=3, join_timeout=1.5, token="wrong")
    try:
        events = pump([hub, wrong], 3, until=lambda ev: any(isinstance(e, Gone) and e.kind == "join" for e in ev))
        assert not any(isinstance(e, Joined) for e in events)
        # node 0's refusal cannot prove a token the node does not share: it tries again until the join timeout
        assert any(isinstance(e, Gone) and e.kind == "join" and "never answered" in e.reason
                   and "refused this node (wrong job or job token) without proving the job token" in e.reason
                   for e in events)
    finally:
        wrong.close()
    right = Spoke(IDENTITY, 1, "127.0.0.1", port, heartbeat_timeout=3, join_timeout=5, token="right")
    try:
        events = pump([hub, right], 4, until=lambda ev: sum(isinstance(e, Joined) for e in ev) == 2)
        assert sum(isinstance(e, Joined) for e in events) == 2
    finally:
        hub.close()
        right.close()


def test_the_hub_tells_how_long_ago_each_node_was_heard():
    port = free_port()
    hub = Hub(IDENTITY, "127.0.0.1", port, heartbeat_timeout=30, join_timeout=10, token=None)
    spoke = Spoke(IDENTITY, 1, "127.0.0.1", port, heartbeat_timeout=30, join_timeout=10, token=None)
    try:
        assert hub.heard_ages(time.monotonic()) == {}
        pump([hub, spoke], 5, until=lambda ev: sum(isinstance(e, Joined) for e in ev) == 2)
        heard = hub.connections[hub.peers[1]].heard + hub.away  # the hub's clock, at its last word from node 1
        assert hub.heard_ages(heard + 2.5) == {1: 2.5}
    finally:
        hub.close()
        spoke.close()


def test_silence_is_a_lost_node_after_the_heartbeat_timeout():
    port = free_port()
    hub = Hub(IDENTITY, "127.0.0.1", port, heartbeat_timeout=1, join_timeout=10, token=None)
    spoke = Spoke(IDENTITY, 1, "127.0.0.1", port, heartbeat_timeout=1, join_timeout=10, token=None)
    try:
        pump([hub, spoke], 5, until=lambda ev: sum(isinstance(e, Joined) for e in ev) == 2)
        events = pump([hub], 120, until=lambda ev: ev)  # the spoke is no longer driven: silent (120 s: a hang guard)
        assert len(events) == 1 and isinstance(events[0], Gone)
        assert "node 1 (127.0.0.2) lost: no heartbeat for" in events[0].reason
        # not before the timeout: the silence it names is on the hub's own clock, which a busy machine's lag
        # does not count (how soon after the timeout a silent node is found: bench/scale.py, performance.md)
        silence = float(events[0].reason.split("no heartbeat for ")[1].split(" s")[0])
        assert silence >= 1.0, events[0].reason
    finally:
        hub.close()
        spoke.close()


def closed_by_peer(sock, timeout=2.0) -> bool:
    sock.settimeout(timeout)
    try:
        while sock.recv(65536):
            pass
    except ConnectionResetError:
        pass
    return True


def test_strangers_are_dropped_and_the_hub_goes_on():
    port = free_port()
    hub = Hub(IDENTITY, "127.0.0.1", port, heartbeat_timeout=3, join_timeout=10, token=None)
    strangers = []
    try:
        junk = socket.create_connection(("127.0.0.1", port))
        junk.sendall(b"\x00\x00\x00\x05hello")
        wrong_job = socket.create_connection(("127.0.0.1", port))
        hello = {"type": "hello", "identity": {**IDENTITY.as_dict(), "job_id": "other"}, "node": 1}
        wrong_job.sendall(encode(hello))
        bad_node = socket.create_connection(("127.0.0.1", port))
        bad_node.sendall(encode({**hello, "identity": IDENTITY.as_dict(), "node": 7}))
        strangers = [junk, wrong_job, bad_node] + [socket.create_connection(("127.0.0.1", port)) for _ in range(100)]
        events = pump([hub], 1.0)
        assert events == []
        assert hub.joined() == set()
        assert len([c for c in hub.connections.values() if c.node is None]) <= MAX_PENDING
        for s in strangers[:3]:  # dropped: the hub closed them (crowded out, unread: reset)
            assert closed_by_peer(s)
        spoke = Spoke(IDENTITY, 1, "127.0.0.1", port, heartbeat_timeout=3, join_timeout=10, token=None)
        try:  # the 64 silent strangers still waiting for their hello do not keep the node out
            pushed_out = hub.dropped
            events = pump([hub, spoke], 120, until=lambda ev: sum(isinstance(e, Joined) for e in ev) == 2)
            assert sum(isinstance(e, Joined) for e in events) == 2
            # the node's connection pushed the oldest stranger out: it came in while they still waited
            # for their hello, not once their HELLO_TIMEOUT had passed
            assert hub.dropped > pushed_out
        finally:
            spoke.close()
    finally:
        for s in strangers:
            s.close()
        hub.close()


def test_messages_carry_json_only():
    assert json.loads(encode({"type": "beat"})[4:]) == {"type": "beat"}


def test_a_node_of_another_job_is_told_why_and_gives_up_at_once():
    port = free_port()
    hub = Hub(IDENTITY, "127.0.0.1", port, heartbeat_timeout=3, join_timeout=10, token=None)
    other = Identity("job1", IDENTITY.nodes, IDENTITY.ports, "-u other.py")
    spoke = Spoke(other, 1, "127.0.0.1", port, heartbeat_timeout=3, join_timeout=30, token=None)
    try:
        events = pump([hub, spoke], 120, until=lambda ev: ev)  # 120 s: a hang guard
        assert len(events) == 1 and isinstance(events[0], Gone) and events[0].kind == "join"
        # at once: on the refusal, not at the join timeout (30 s) after trying again
        assert spoke.gave_up and "never answered" not in events[0].reason
        assert "refused this node: its script is '-u other.py', this job's is '-u train.py'" in events[0].reason
    finally:
        hub.close()
        spoke.close()


def test_with_a_token_a_node_that_proves_it_is_told_why_and_gives_up_at_once():
    port = free_port()
    hub = Hub(IDENTITY, "127.0.0.1", port, heartbeat_timeout=3, join_timeout=10, token="right")
    other = Identity("job1", IDENTITY.nodes, IDENTITY.ports, "-u other.py")
    spoke = Spoke(other, 1, "127.0.0.1", port, heartbeat_timeout=3, join_timeout=30, token="right")
    try:  # the right token and another script: node 0 proves its refusal, the node gives up at once
        events = pump([hub, spoke], 5, until=lambda ev: ev)
        assert [e.reason.split(": ", 1)[1] for e in events] == ["its script is '-u other.py', this job's is '-u train.py'"]
    finally:
        hub.close()
        spoke.close()


def test_with_a_token_a_node_that_does_not_prove_it_is_told_nothing_of_the_job():
    port = free_port()
    hub = Hub(IDENTITY, "127.0.0.1", port, heartbeat_timeout=3, join_timeout=10, token="right")
    try:
        s, _ = handshake(hub, port, "wrong", identity=Identity("other", IDENTITY.nodes, IDENTITY.ports, "x.py"))
        with s:
            assert pump([hub], 1) == []
            refusal = recv_message(s)
            assert refusal["reason"] == "wrong job or job token"
            # proven on the node's nonce (a node with the token would give up), over nothing of the job
            assert refusal["proof"] == step_proof("right", "refused", "job1", 1, "c" * 32, "wrong job or job token")
    finally:
        hub.close()


# ---------------------------------------------------------------- what an adversary sends


def frame(body: bytes) -> bytes:
    return struct.pack("!I", len(body)) + body


@pytest.mark.parametrize("body, why", [
    (b"[" * 32000 + b"]" * 32000, "nested deeper than"),  # RecursionError in json's decoder
    (b'{"type": "x", "a": ' + b"[" * 100 + b"]" * 100 + b"}", "nested deeper than"),
    (b'{"type": "x", "rank": 1e400}', "not JSON"),  # float("inf")
    (b'{"type": "x", "rank": Infinity}', "not JSON"),
    (b'{"type": "x", "rank": NaN}', "not JSON"),
    (b'{"type": "x", "rank": ' + b"9" * 5000 + b"}", "not JSON"),  # over int's digit limit
    (b'{"type": "x", "rank": ' + b"9" * 30 + b"}", "not JSON"),  # a huge int: no field takes one
    (b'{"type": "\xed\xa0\x80"}', "not JSON"),  # a lone surrogate in UTF-8
    (b'{"type": "x", "text": "\\ud800"}', "not JSON"),  # the same, escaped
    (b'{"type": ["beat"]}', "without a type"),
    (b'"beat"', "without a type"),
    (b"", "not JSON"),
], ids=lambda v: v[:24].decode("latin-1") if isinstance(v, bytes) else None)
def test_no_input_raises_anything_but_a_protocol_error(body, why):
    with pytest.raises(ProtocolError, match=why):
        Framer().feed(frame(body))


def test_a_frame_length_of_2_32_minus_1_is_refused_before_any_body():
    with pytest.raises(ProtocolError, match="4294967295 bytes"):
        Framer().feed(b"\xff\xff\xff\xff")


def test_unicode_junk_and_wrong_types_decode_without_harm():
    message = {"type": "stop", "cause": {"node": "x", "code": [1], "text": "\u202e\x00\uffff"}, "attempt": 1.5}
    assert Framer().feed(encode(message)) == [message]


@pytest.mark.parametrize("timeout", [0.5, 1, 2.5, 127, 128, 1000, 86400])
def test_every_accepted_heartbeat_timeout_tunes_a_socket(timeout):
    with socket.socket() as s:
        tune(s, timeout)
        cnt = s.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPCNT)
        idle = s.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPIDLE)
        every = s.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPINTVL)
        assert 1 <= cnt <= 127 and 1 <= idle <= 32767 and 1 <= every <= 32767
        assert idle + cnt * every <= max(2, timeout)  # TCP gives up within the promised bound (2 s at the least)
        assert s.getsockopt(socket.IPPROTO_TCP, socket.TCP_USER_TIMEOUT) == int(timeout * 1000)


# ---------------------------------------------------------------- a stranger posing as node 0, or in the stream


def recv_exactly(sock, n: int) -> bytes:
    data = b""
    while len(data) < n:
        chunk = sock.recv(n - len(data))
        if not chunk:
            raise ConnectionError("closed")
        data += chunk
    return data


def recv_message(sock) -> dict:
    return json.loads(recv_exactly(sock, struct.unpack("!I", recv_exactly(sock, 4))[0]))


class FakeNodeZero:
    """Holds node 0's control port without the token (in a thread, while the test drives the spoke):
    answers ``connections`` hellos in turn with ``answer`` and a forged stop."""

    def __init__(self, port, answer, connections=3):
        stop = {"type": "stop", "attempt": 0, "cause": {"node": 0, "kind": "worker", "code": 42, "text": "FORGED"}}
        self.said = []
        self.thread = threading.Thread(
            target=lambda: self.said.extend(pose_as_node_0(port, encode(answer) + encode(stop),
                                                         connections, 10)),
            daemon=True)
        self.thread.start()

    @property
    def hellos(self):
        return [json.loads(said[4:]) for said in self.said]

    def close(self):
        self.thread.join(15)


@pytest.mark.parametrize("answer", [
    {"type": "welcome"},
    {"type": "welcome", "proof": "0" * 64},
    {"type": "welcome", "proof": "\u00e9" * 64},  # not ASCII: hmac.compare_digest raises TypeError on str
    {"type": "refused", "reason": "FORGED", "proof": "0" * 64},
], ids=["welcome", "wrong proof", "unicode proof", "forged refusal"])
def test_a_stranger_on_node_0s_port_is_not_obeyed_and_the_real_node_0_is_joined_after(answer, caplog):
    port = free_port()
    fake = FakeNodeZero(port, answer)
    spoke = Spoke(IDENTITY, 1, "127.0.0.1", port, heartbeat_timeout=3, join_timeout=15, token="right")
    try:
        events = pump([spoke], 6, until=lambda ev: ev or len(fake.said) == 3)
        assert events == [], events  # no Joined, no stop, no giving up
        assert fake.hellos and all(fresh_nonce(h["nonce"]) for h in fake.hellos)
        assert len({h["nonce"] for h in fake.hellos}) == len(fake.hellos)  # a fresh nonce every time
        warnings = [r.getMessage() for r in caplog.records if "whoever answers on" in r.getMessage()]
        assert len(warnings) == 1 and "without proving the job token" in warnings[0]
        fake.close()
        hub = Hub(IDENTITY, "127.0.0.1", port, heartbeat_timeout=3, join_timeout=10, token="right")
        try:
            events = pump([hub, spoke], 5, until=lambda ev: sum(isinstance(e, Joined) for e in ev) == 2)
            assert sorted(e.node for e in events if isinstance(e, Joined)) == [0, 1]
            hub.send(1, {"type": "stop", "attempt": 0})
            events = pump([hub, spoke], 3, until=lambda ev: ev)
            assert events == [Received(0, {"type": "stop", "attempt": 0})]
        finally:
            hub.close()
    finally:
        fake.close()
        spoke.close()


def test_a_session_opens_each_sealed_message_once_in_order_and_in_its_direction():
    hub = Session.of("t", "a" * 32, "b" * 32, "job1", 1, at_server=True)
    node = Session.of("t", "a" * 32, "b" * 32, "job1", 1, at_server=False)
    first, second = hub.seal(b'{"type":"stop"}'), hub.seal(b'{"type":"end"}')
    with pytest.raises(ProtocolError):
        node.open(second)  # reordered
    assert node.open(first) == b'{"type":"stop"}'
    for bad in (first,  # replayed
                node.seal(b'{"type":"end"}'),  # reflected: the node's own, back to it
                second[:-1] + b"!",  # altered
                b'{"type":"end"}',  # not sealed
                b""):
        with pytest.raises(ProtocolError, match="wrong authentication"):
            node.open(bad)
    assert node.open(second) == b'{"type":"end"}'
    other = Session.of("t", "a" * 32, "c" * 32, "job1", 1, at_server=True)  # another connection's
    with pytest.raises(ProtocolError):
        Session.of("t", "a" * 32, "b" * 32, "job1", 1, at_server=False).open(other.seal(b"{}"))
    another = Session.of("t", "a" * 32, "b" * 32, "job1", 2, at_server=True)  # another node's, the same nonces
    with pytest.raises(ProtocolError):
        Session.of("t", "a" * 32, "b" * 32, "job1", 1, at_server=False).open(another.seal(b"{}"))


def hello_of(token, hub_nonce, node_nonce="c" * 32, identity=IDENTITY, node=1, **change) -> dict:
    """A node's hello as a launcher says it, proving ``token`` on node 0's nonce; ``change``: fields replaced."""
    hello = {"type": "hello", "identity": identity.as_dict(), "node": node, "nonce": node_nonce, **change}
    return {"proof": step_proof(token, "hello", "job1", hello["node"], hub_nonce, node_nonce), **hello}


def handshake(hub, port, token, node_nonce="c" * 32, identity=IDENTITY):
    """A raw client that knows the token says hello; the socket and node 0's nonce."""
    s = socket.create_connection(("127.0.0.1", port), timeout=5)
    pump([hub], 0.2)
    challenge = recv_message(s)
    s.sendall(encode(hello_of(token, challenge["nonce"], node_nonce, identity)))
    return s, challenge["nonce"]


def test_node_0_proves_the_token_and_a_message_outside_the_session_loses_the_node():
    port = free_port()
    hub = Hub(IDENTITY, "127.0.0.1", port, heartbeat_timeout=3, join_timeout=10, token="right")
    s = None
    try:
        s, hub_nonce = handshake(hub, port, "right")
        events = pump([hub], 1, until=lambda ev: ev)
        assert events == [Joined(1)]
        welcome = recv_message(s)
        assert welcome["proof"] == step_proof("right", "welcome", "job1", 1, "c" * 32, hub_nonce)
        mine = Session.of("right", hub_nonce, "c" * 32, "job1", 1, at_server=False)
        s.sendall(encode({"type": "report", "attempt": 0}, mine))
        assert pump([hub], 1, until=lambda ev: ev) == [Received(1, {"type": "report", "attempt": 0})]
        s.sendall(encode({"type": "failed", "attempt": 0, "cause": {"text": "INJECTED"}}))  # not sealed
        events = pump([hub], 1, until=lambda ev: ev)
        assert len(events) == 1 and isinstance(events[0], Gone), events
        assert "wrong authentication" in events[0].reason
    finally:
        if s:
            s.close()
        hub.close()


def test_a_hello_replayed_on_a_new_connection_is_refused():
    """Its proof is on the first connection's challenge: a new connection has a new one."""
    port = free_port()
    hub = Hub(IDENTITY, "127.0.0.1", port, heartbeat_timeout=3, join_timeout=10, token="right")
    try:
        first, hub_nonce = handshake(hub, port, "right")
        with first:
            assert pump([hub], 1, until=lambda ev: ev) == [Joined(1)]
        assert isinstance(pump([hub], 1, until=lambda ev: ev)[0], Gone)  # its place is free again
        with socket.create_connection(("127.0.0.1", port), timeout=5) as again:
            pump([hub], 0.2)
            assert recv_message(again)["nonce"] != hub_nonce  # a new challenge
            again.sendall(encode(hello_of("right", hub_nonce)))  # the hello of the first connection, replayed
            assert pump([hub], 1) == []
            assert recv_message(again)["reason"] == "wrong job or job token"
    finally:
        hub.close()


@pytest.mark.parametrize("change, why", [
    ({"node": True}, "node index True is not one of 1 to 1"),
    ({"node": 1.0}, "node index 1.0 is not one of 1 to 1"),
    ({"nonce": None}, "it gives no nonce to prove the job token on"),
    ({"nonce": "x" * 32}, "it gives no nonce to prove the job token on"),
    ({"proof": "\u00e9" * 64}, "its proof of the job token (LAUNCHER_JOB_TOKEN) is wrong"),
    ({"proof": ["x"]}, "it gives no proof of the job token"),
    ({"identity": ["job1"]}, "no job identity"),
])
def test_a_hello_with_wrong_types_is_dropped_with_its_reason(change, why, caplog):
    port = free_port()
    hub = Hub(IDENTITY, "127.0.0.1", port, heartbeat_timeout=3, join_timeout=10, token="right")
    s = socket.create_connection(("127.0.0.1", port), timeout=5)
    try:
        nonce = None
        pump([hub], 0.2)
        nonce = recv_message(s)["nonce"]
        s.sendall(encode({**hello_of("right", nonce, node=change.get("node", 1)), **change}))
        assert pump([hub], 1) == []
        assert any(why in r.getMessage() for r in caplog.records), [r.getMessage() for r in caplog.records]
        assert recv_message(s)["type"] == "refused"
    finally:
        s.close()
        hub.close()


def test_half_a_frame_then_silence_is_dropped_and_keeps_no_node_out(caplog):
    port = free_port()
    hub = Hub(IDENTITY, "127.0.0.1", port, heartbeat_timeout=3, join_timeout=10, token=None)
    half = socket.create_connection(("127.0.0.1", port))
    spoke = Spoke(IDENTITY, 1, "127.0.0.1", port, heartbeat_timeout=3, join_timeout=10, token=None)
    try:
        half.sendall(struct.pack("!I", MAX_MESSAGE) + b"{" * 1000)  # the rest never comes
        events = pump([hub, spoke], 3, until=lambda ev: len(ev) == 2)
        assert sorted(e.node for e in events if isinstance(e, Joined)) == [0, 1]
        pump([hub, spoke], HELLO_TIMEOUT + 1, until=lambda ev: not any(c.node is None for c in hub.connections.values()))
        assert [c.node for c in hub.connections.values()] == [1]
        assert any("said nothing valid for 5 s" in r.getMessage() for r in caplog.records)
    finally:
        half.close()
        spoke.close()
        hub.close()


def test_a_refusal_is_shown_as_one_printable_line():
    port = free_port()
    fake = FakeNodeZero(port, {"type": "refused", "reason": "x\nlauncher: the job stopped: FORGED\x1b[2J"}, connections=1)
    spoke = Spoke(IDENTITY, 1, "127.0.0.1", port, heartbeat_timeout=3, join_timeout=10, token=None)
    try:  # without a token, a refusal is taken as it comes: as one line
        events = pump([spoke], 5, until=lambda ev: ev)
        assert [e.reason for e in events] == ["node 0 (127.0.0.1) refused this node: x?launcher: the job stopped: FORGED?[2J"]
    finally:
        spoke.close()
        fake.close()


@pytest.mark.parametrize("token, warnings", [(None, 1), ("right", 0)])
def test_without_a_token_each_end_warns_once_what_a_stranger_can_do(token, warnings, caplog):
    port = free_port()
    hub = Hub(IDENTITY, "127.0.0.1", port, heartbeat_timeout=3, join_timeout=10, token=token)
    spoke = Spoke(IDENTITY, 1, "127.0.0.1", port, heartbeat_timeout=3, join_timeout=10, token=token)
    try:
        pump([hub, spoke], 5, until=lambda ev: len(ev) == 2)
        said = [r.getMessage() for r in caplog.records if "no LAUNCHER_JOB_TOKEN is set" in r.getMessage()]
        assert len(said) == 2 * warnings
        assert all("pose as node 0" in line and "set the same secret" in line for line in said)
    finally:
        hub.close()
        spoke.close()


def test_node_0_beats_every_node_at_once_and_each_answers_it():
    """So that node 0 reads the answers in a burst: its loop turns a few times per beat, not once per node."""
    port = free_port()
    identity = Identity("job-1", tuple(f"127.0.0.{i}" for i in range(1, 5)), (6170,), "train.py")
    hub = Hub(identity, "127.0.0.1", port, heartbeat_timeout=1.5, join_timeout=10, token=None)
    spokes = [Spoke(identity, n, "127.0.0.1", port, heartbeat_timeout=1.5, join_timeout=10, token=None) for n in (1, 2, 3)]
    try:
        events = pump([hub, *spokes], 5, until=lambda ev: sum(isinstance(e, Joined) for e in ev) == 6)
        assert sum(isinstance(e, Joined) for e in events) == 6
        assert not [e for e in pump([hub, *spokes], 2.2) if isinstance(e, Gone)]
        (beat,) = {c.said for c in hub.connections.values()}  # one beat, every node
        for spoke in spokes:  # each said its last word right after that beat: its answer
            assert 0 <= spoke.hub.said - beat < 0.5
    finally:
        hub.close()
        for spoke in spokes:
            spoke.close()
