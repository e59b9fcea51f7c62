"""The control channel's pieces: framing, identity, proofs, and a real hub and spoke on loopback."""

import json
import selectors
import socket
import struct
import time

import pytest

from launcher import control

IDENTITY = control.Identity("job1", ("127.0.0.1", "127.0.0.2"), (7000,), "-u train.py")


def test_framing_round_trip_in_pieces():
    data = control.encode({"type": "beat"}) + control.encode({"type": "stop", "cause": {"x": [1, 2]}})
    framer = control.Framer()
    got = []
    for i in range(len(data)):  # one byte at a time
        got += framer.feed(data[i:i + 1])
    assert got == [{"type": "beat"}, {"type": "stop", "cause": {"x": [1, 2]}}]


@pytest.mark.parametrize("junk, why", [
    (struct.pack("!I", control.MAX_MESSAGE + 1), "bytes (the limit"),
    (struct.pack("!I", 3) + b"\xff\xfe\x00", "not JSON"),
    (struct.pack("!I", 2) + b"[]", "without a type"),
    (struct.pack("!I", 12) + b'{"type": 1 }', "without a type"),
    (b"GET / HTTP/1.1\r\n\r\n", "bytes (the limit"),
])
def test_junk_is_a_protocol_error(junk, why):
    with pytest.raises(control.ProtocolError, match=why.replace("(", r"\(")):
        control.Framer().feed(junk)


def test_a_message_over_the_limit_is_not_sent():
    with pytest.raises(ValueError):
        control.encode({"type": "x", "pad": "a" * control.MAX_MESSAGE})


def test_identity_mismatch_names_the_field():
    assert IDENTITY.mismatch(IDENTITY.as_dict()) is None
    other = {**IDENTITY.as_dict(), "script": "-u other.py"}
    assert "its script is '-u other.py'" in IDENTITY.mismatch(other)
    assert IDENTITY.mismatch("junk") == "no job identity"
    assert "job_id" in IDENTITY.mismatch({})


def test_proof_depends_on_token_nonce_job_and_node():
    p = control.proof("secret", "n1", "job1", 1)
    assert p == control.proof("secret", "n1", "job1", 1)
    assert len({p, control.proof("other", "n1", "job1", 1), control.proof("secret", "n2", "job1", 1),
                control.proof("secret", "n1", "job2", 1), control.proof("secret", "n1", "job1", 2)}) == 5


# ---------------------------------------------------------------- a real hub and spoke


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


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
    hub = control.Hub(IDENTITY, "127.0.0.1", port, heartbeat_timeout=3, join_timeout=10, token=None)
    spoke = control.Spoke(IDENTITY, 1, "127.0.0.1", port, heartbeat_timeout=3, join_timeout=10, token=None)
    try:
        events = pump([hub, spoke], 5, until=lambda ev: sum(isinstance(e, control.Joined) for e in ev) == 2)
        assert {(type(e).__name__, e.node) for e in events} == {("Joined", 1), ("Joined", 0)}
        hub.send(1, {"type": "stop", "attempt": 0})
        spoke.send({"type": "report", "attempt": 0})
        events = pump([hub, spoke], 5, until=lambda ev: len(ev) == 2)
        assert control.Received(0, {"type": "stop", "attempt": 0}) in events
        assert control.Received(1, {"type": "report", "attempt": 0}) in events
    finally:
        hub.close()
        spoke.close()


def test_a_wrong_token_is_refused_and_the_right_one_joins():
    port = free_port()
    hub = control.Hub(IDENTITY, "127.0.0.1", port, heartbeat_timeout=3, join_timeout=10, token="right")
    wrong = control.Spoke(IDENTITY, 1, "127.0.0.1", port, heartbeat_timeout=3, join_timeout=1.5, token="wrong")
    try:
        events = pump([hub, wrong], 3, until=lambda ev: any(isinstance(e, control.NeverJoined) for e in ev))
        assert not any(isinstance(e, control.Joined) for e in events)
        assert any(isinstance(e, control.NeverJoined) and "refused this node: wrong job or job token" in e.reason
                   for e in events)
    finally:
        wrong.close()
    right = control.Spoke(IDENTITY, 1, "127.0.0.1", port, heartbeat_timeout=3, join_timeout=5, token="right")
    try:
        events = pump([hub, right], 4, until=lambda ev: sum(isinstance(e, control.Joined) for e in ev) == 2)
        assert sum(isinstance(e, control.Joined) for e in events) == 2
    finally:
        hub.close()
        right.close()


def test_silence_is_a_lost_node_after_the_heartbeat_timeout():
    port = free_port()
    hub = control.Hub(IDENTITY, "127.0.0.1", port, heartbeat_timeout=1, join_timeout=10, token=None)
    spoke = control.Spoke(IDENTITY, 1, "127.0.0.1", port, heartbeat_timeout=1, join_timeout=10, token=None)
    try:
        pump([hub, spoke], 5, until=lambda ev: sum(isinstance(e, control.Joined) for e in ev) == 2)
        started = time.monotonic()
        events = pump([hub], 4, until=lambda ev: ev)  # the spoke is no longer driven: silent
        assert len(events) == 1 and isinstance(events[0], control.Lost)
        assert "node 1 (127.0.0.2) lost: no heartbeat for" in events[0].reason
        assert 0.9 <= time.monotonic() - started < 2.5
    finally:
        hub.close()
        spoke.close()


def test_strangers_are_dropped_and_the_hub_goes_on():
    port = free_port()
    hub = control.Hub(IDENTITY, "127.0.0.1", port, heartbeat_timeout=3, join_timeout=10, token=None)
    strangers = []
    try:
        junk = socket.create_connection(("127.0.0.1", port))
        junk.sendall(b"\x00\x00\x00\x05hello")
        wrong_job = socket.create_connection(("127.0.0.1", port))
        hello = {"type": "hello", "identity": {**IDENTITY.as_dict(), "job_id": "other"}, "node": 1}
        wrong_job.sendall(control.encode(hello))
        bad_node = socket.create_connection(("127.0.0.1", port))
        bad_node.sendall(control.encode({**hello, "identity": IDENTITY.as_dict(), "node": 7}))
        strangers = [junk, wrong_job, bad_node] + [socket.create_connection(("127.0.0.1", port)) for _ in range(100)]
        events = pump([hub], 1.0)
        assert events == []
        assert hub.joined() == set()
        assert len([c for c in hub.connections.values() if c.node is None]) <= control.MAX_PENDING
        for s in strangers[:3]:  # dropped: the hub closed them
            s.settimeout(2)
            data = s.recv(65536)
            while data:
                data = s.recv(65536)
        spoke = control.Spoke(IDENTITY, 1, "127.0.0.1", port, heartbeat_timeout=3, join_timeout=10, token=None)
        try:
            events = pump([hub, spoke], 5, until=lambda ev: sum(isinstance(e, control.Joined) for e in ev) == 2)
            assert sum(isinstance(e, control.Joined) for e in events) == 2
        finally:
            spoke.close()
    finally:
        for s in strangers:
            s.close()
        hub.close()


def test_messages_carry_json_only():
    assert json.loads(control.encode({"type": "beat"})[4:]) == {"type": "beat"}


def test_a_node_of_another_job_is_told_why_and_gives_up_at_once():
    port = free_port()
    hub = control.Hub(IDENTITY, "127.0.0.1", port, heartbeat_timeout=3, join_timeout=10, token=None)
    other = control.Identity("job1", IDENTITY.nodes, IDENTITY.ports, "-u other.py")
    spoke = control.Spoke(other, 1, "127.0.0.1", port, heartbeat_timeout=3, join_timeout=30, token=None)
    try:
        started = time.monotonic()
        events = pump([hub, spoke], 5, until=lambda ev: ev)
        assert time.monotonic() - started < 3
        assert len(events) == 1 and isinstance(events[0], control.NeverJoined)
        assert "refused this node: its script is '-u other.py', this job's is '-u train.py'" in events[0].reason
    finally:
        hub.close()
        spoke.close()


def test_with_a_token_the_refusal_says_nothing_of_the_job():
    port = free_port()
    hub = control.Hub(IDENTITY, "127.0.0.1", port, heartbeat_timeout=3, join_timeout=10, token="right")
    spoke = control.Spoke(IDENTITY, 1, "127.0.0.1", port, heartbeat_timeout=3, join_timeout=30, token="wrong")
    try:
        events = pump([hub, spoke], 5, until=lambda ev: ev)
        assert [e.reason.split(": ", 1)[1] for e in events] == ["wrong job or job token"]
    finally:
        hub.close()
        spoke.close()


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
    with pytest.raises(control.ProtocolError, match=why):
        control.Framer().feed(frame(body))


def test_a_frame_length_of_2_32_minus_1_is_refused_before_any_body():
    with pytest.raises(control.ProtocolError, match="4294967295 bytes"):
        control.Framer().feed(b"\xff\xff\xff\xff")


def test_unicode_junk_and_wrong_types_decode_without_harm():
    message = {"type": "stop", "cause": {"node": "x", "code": [1], "text": "\u202e\x00\uffff"}, "attempt": 1.5}
    assert control.Framer().feed(control.encode(message)) == [message]


@pytest.mark.parametrize("timeout", [0.5, 1, 2.5, 127, 128, 1000, 86400])
def test_every_accepted_heartbeat_timeout_tunes_a_socket(timeout):
    with socket.socket() as s:
        control._tune(s, timeout)
        cnt = s.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPCNT)
        idle = s.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPIDLE)
        every = s.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPINTVL)
        assert 1 <= cnt <= 127 and 1 <= idle <= 32767 and 1 <= every <= 32767
        assert idle + cnt * every <= max(2, timeout)  # TCP gives up within the promised bound (2 s at the least)
        assert s.getsockopt(socket.IPPROTO_TCP, socket.TCP_USER_TIMEOUT) == int(timeout * 1000)
