"""The c10d elastic channel sealed with the job token after its handshake (``handshake``), over real
loopback sockets: what a replay, a reordering, a forged report or another member's message does (loses that
one connection, with a warning, never a traceback), and that the job still forms and re-forms. Node 0's
keeper runs in the test's own thread (``Node0.pump``) where the test plays the other launchers itself, so
that what it sees does not depend on timing; every wait is bounded, none asserts a duration."""

import logging
import select
import socket
import threading
import time

import pytest

from conftest import free_ports
from launcher.nodes.elastic import link as el
from launcher.nodes.elastic import membership as mb
from launcher.nodes.elastic.c10d import member as member_module
from launcher.nodes.elastic.c10d import start as es
from launcher.nodes.elastic.c10d.keeper import Keeper
from launcher.nodes.elastic.c10d.member import MemberLink
from launcher.nodes.transport import auth, wire
from launcher.nodes.transport import messages as m
from launcher.nodes.transport.handshake import Client, Server
from launcher.plan.elastic import ElasticSpec, Rendezvous

HOST = "127.0.0.1"
JOB = "job"
TOKEN = "s3cret"
BOUND = 30.0  # seconds any one wait may take before the test fails (a hang, not a slow machine)
CALM = dict(keep_alive_interval=1.0, heartbeat_timeout=120.0, last_call_timeout=120.0, close_timeout=120.0,
            read_timeout=60.0, join_timeout=120.0)  # no silence or timer decides anything within a test


def spec_of(port, low, high, max_restarts=0, **settings):
    return ElasticSpec(low, high, "c10d", host=HOST, port=port, rendezvous=Rendezvous(**{**CALM, **settings}),
                       max_restarts=max_restarts)


class Node0:
    """Node 0's keeper, served by the test's own thread (``pump``)."""

    def __init__(self, low=3, high=3, **settings) -> None:
        self.port = free_ports(1)
        self.spec = spec_of(self.port, low, high, **settings)
        listener = es.listen(HOST, self.port)
        assert listener is not None
        self.keeper = Keeper(listener, self.spec, JOB, mb.Node("zero", HOST, 1), TOKEN, time.monotonic)

    def pump(self, done, what: str) -> None:
        deadline = time.monotonic() + BOUND
        while not done():
            assert time.monotonic() < deadline, f"not within {BOUND:g} s: {what}"
            self.keeper.serve_once()

    def joined(self, node_id: str) -> bool:
        return node_id in self.keeper.fds and self.keeper.state.known(node_id) is not None

    def close(self) -> None:
        self.keeper.close()


class Puppet:
    """Another launcher played by the test: it knows the job token, so it can seal (or forge) as it likes."""

    def __init__(self, node0: Node0, node_id: str) -> None:
        self.node0, self.node_id = node0, node_id
        self.client = Client(TOKEN, JOB, node_id)
        self.nonce = self.client.nonce
        self.sock = socket.create_connection((HOST, node0.port), timeout=10)
        self.sock.setblocking(False)
        self.framer = wire.Framer(wire.MAX_FRAME)
        self.session = None
        self.got: list = []  # node 0's messages, opened (its challenge and welcome taken by the handshake)
        self.closed = False
        self.hello = b""
        node0.pump(lambda: self.poll() or self.hello, f"{node_id} challenged")
        self.write(self.hello)
        node0.pump(lambda: self.poll() or self.got, f"{node_id} admitted")
        assert self.session is not None and isinstance(self.got[0], m.Admitted), self.got

    def poll(self) -> bool:
        """Read what node 0 sent so far; whether its connection is closed."""
        while not self.closed:
            try:
                data = self.sock.recv(65536)
            except BlockingIOError:
                break
            except ConnectionError:
                data = b""
            if not data:
                self.closed = True
            for body in self.framer.bodies(data):
                message = m.from_wire(wire.decode(self.session.open(body) if self.session else body))
                if isinstance(message, m.Challenge):
                    self.hello = hello_of(self.node_id, *self.client.answer(message))
                elif isinstance(message, m.Welcome) and self.client.welcomed(message):
                    self.session = self.client.session
                else:
                    self.got.append(message)
        return self.closed

    def seal(self, message) -> bytes:
        """Its next frame, sealed in its own session."""
        return wire.encode(m.to_wire(message), self.session)

    def write(self, frames: bytes) -> None:
        self.sock.setblocking(True)
        self.sock.sendall(frames)
        self.sock.setblocking(False)

    def dropped(self) -> m.Dropped:
        """Node 0's last word before it closed this connection (pumped until then)."""
        self.node0.pump(self.poll, f"{self.node_id}'s connection closed by node 0")
        assert isinstance(self.got[-1], m.Dropped), self.got
        return self.got[-1]


def hello_of(node_id: str, nonce: str, proof: str) -> bytes:
    return wire.encode(m.to_wire(m.Hello({"job_id": JOB}, None, nonce, proof, node_id=node_id, host=HOST, workers=1)))


def answer_to(port, data: bytes) -> list:
    """A new connection sends ``data``; node 0's messages until it closes (bounded)."""
    with socket.create_connection((HOST, port), timeout=BOUND) as s:
        s.sendall(data)
        got = b""
        while True:
            try:
                chunk = s.recv(65536)
            except ConnectionError:
                chunk = b""
            if not chunk:
                return [m.from_wire(x) for x in wire.Framer().feed(got)]
            got += chunk


def strangers(node0: Node0, data: bytes) -> list:
    """``answer_to`` in a thread while node 0 is pumped."""
    out: list = []
    thread = threading.Thread(target=lambda: out.append(answer_to(node0.port, data)), daemon=True)
    thread.start()
    node0.pump(lambda: not thread.is_alive(), "the stranger's connection closed")
    return out[0]


def warnings_of(caplog) -> list:
    return [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING and "session does not open" in
            r.getMessage()]


@pytest.fixture
def node0():
    n = Node0()
    yield n
    n.close()


def test_what_node_0_says_after_the_admission_is_sealed_for_that_member(node0):
    a = Puppet(node0, "a")
    assert a.got[0] == m.Admitted(False)  # it opened in a's session (a plain one would not)
    beats = node0.keeper.next_beat
    node0.pump(lambda: node0.keeper.next_beat > beats and (a.poll() or len(a.got) > 1), "node 0's beat")
    assert a.got[1:2] == [m.Beat()]  # it opened in a's session (a plain one would not)
    a.write(a.seal(m.Beat()))
    node0.pump(lambda: "a" in node0.keeper.heard, "a's sealed beat heard")
    a.sock.close()


def test_a_replayed_message_loses_the_connection_it_is_replayed_on(node0, caplog):
    a, b = Puppet(node0, "a"), Puppet(node0, "b")
    beat = a.seal(m.Beat())
    a.write(beat)
    node0.pump(lambda: "a" in node0.keeper.heard, "a's beat heard")
    a.write(beat)  # the same bytes again
    assert "authentication" in a.dropped().reason
    assert not node0.joined("a") and node0.joined("b")
    assert len(warnings_of(caplog)) == 1 and "message 1 of its session with a wrong authentication" in \
        warnings_of(caplog)[0]
    b.sock.close()


def test_a_real_members_bytes_replayed_do_nothing(monkeypatch, caplog):
    """A real launcher's link (``MemberLink``), its bytes recorded as it sends them: its hello and its sealed
    failure report, replayed by a stranger on a new connection, are refused; replayed on its own connection,
    they lose that connection. Neither spends a restart again."""
    node0 = Node0(low=2, high=2, max_restarts=5)
    recorded: list = []

    class Recording:  # the member's socket, what it sends recorded
        def __init__(self, sock) -> None:
            self.sock = sock

        def sendall(self, data) -> None:
            recorded.append(bytes(data))
            self.sock.sendall(data)

        def send(self, data) -> int:
            recorded.append(bytes(data))  # before it goes: node 0 may read it before this thread goes on
            return self.sock.send(data)  # a small message: the kernel's buffer takes it whole

        def __getattr__(self, name):
            return getattr(self.sock, name)

    real_dial = member_module.dial
    monkeypatch.setattr(member_module, "dial", lambda *args: Recording(real_dial(*args)))
    links: list = []
    thread = threading.Thread(target=lambda: links.append(MemberLink(node0.spec, JOB, 1, TOKEN, time.monotonic).join()),
                              daemon=True)
    thread.start()
    node0.pump(lambda: not thread.is_alive(), "the member's first round")
    link = links[0]
    try:
        link.serve()
        link.failed(1, 7, "a worker failed")  # sealed: node 0 spends a restart and re-forms the job
        node0.pump(lambda: node0.keeper.state.restarts == 1, "the member's failure heard")
        hello, failure = recorded[0], next(x for x in recorded if b"round_failed" in x)
        assert isinstance(m.from_wire(wire.decode(hello[4:])), m.Hello)
        assert b"round_failed" in failure[4 + auth.TAG:]  # sealed: its tag, then the message
        with pytest.raises(wire.ProtocolError):
            wire.decode(failure[4:])
        answer = strangers(node0, b"".join(recorded))  # its whole stream, from its hello, on a new connection
        assert [type(x) for x in answer] == [m.Challenge, m.Refusal]  # a new challenge: the hello's proof fails
        assert answer[1].reason == "wrong job or job token"
        assert [type(x) for x in strangers(node0, failure)] == [m.Challenge]  # without the hello: closed
        assert node0.joined(link.node_id) and node0.keeper.state.restarts == 1 and warnings_of(caplog) == []
        link.conn.sock.sock.sendall(failure)  # on its own connection (as if injected into it)
        node0.pump(lambda: not node0.joined(link.node_id), "the member's connection lost")
        assert node0.keeper.state.restarts == 1 and len(warnings_of(caplog)) == 1
        over = [x for x in inbox_until(link.inbox, el.JobOver) if isinstance(x, el.JobOver)]
        assert "failed the job token's authentication" in over[0].reason
    finally:
        link.close()
        node0.close()


def test_two_sealed_messages_swapped_lose_the_connection(node0, caplog):
    a, b = Puppet(node0, "a"), Puppet(node0, "b")
    first, second = a.seal(m.Beat()), a.seal(m.Stopped(1))
    a.write(second + first)
    assert "authentication" in a.dropped().reason
    assert not node0.joined("a") and node0.joined("b") and len(warnings_of(caplog)) == 1
    assert "message 0 of its session" in warnings_of(caplog)[0]
    b.sock.close()


def test_a_forged_report_has_no_effect_on_the_membership(caplog):
    """A stranger that read the hello and the admission (both nonces) but has not the token: on a new
    connection it is refused; injected into the member's connection, it loses that connection only."""
    node0 = Node0(low=2, high=3)
    a, b = Puppet(node0, "a"), Puppet(node0, "b")
    try:
        node0.pump(lambda: node0.keeper.first is not None, "round 1")
        assert node0.keeper.first.number == 1 and len(node0.keeper.first.members) == 3
        b.sock.close()  # lost: a and node 0 are told to stop their workers
        node0.pump(lambda: node0.keeper.state.unstopped == {"zero", "a"}, "a re-form begun")
        answer = strangers(node0, a.hello + wire.encode(m.to_wire(m.Stopped(1))))
        assert isinstance(answer[1], m.Refusal) and node0.keeper.state.unstopped == {"zero", "a"}
        assert [type(x) for x in strangers(node0, wire.encode(m.to_wire(m.Stopped(1))))] == [m.Challenge]  # closed
        assert node0.keeper.state.unstopped == {"zero", "a"}
        wrong = auth.Session.of("guessed", a.client.server_nonce, a.nonce, JOB, "a", at_server=False)
        wrong.sent = a.session.sent  # the right number, the wrong key
        a.write(wire.encode(m.to_wire(m.RoundFailed(1, 7, "forged")), wrong) +
                wire.encode(m.to_wire(m.RoundFailed(1, 7, "forged"))))
        a.dropped()
        state = node0.keeper.state
        assert state.end is None and state.failure is None and state.restarts == 0 and state.known("a") is None
        assert len(warnings_of(caplog)) == 1 and warnings_of(caplog)[0].startswith("elastic job: a's connection")
    finally:
        a.sock.close()
        node0.close()


def test_a_members_sealed_message_on_another_members_connection_is_refused(node0, caplog):
    a, b = Puppet(node0, "a"), Puppet(node0, "b")
    assert a.session.sent == b.session.sent == 0  # the same number: only the key tells them apart
    frame = a.seal(m.Beat())
    a.write(frame)
    node0.pump(lambda: "a" in node0.keeper.heard, "a's beat heard")
    b.write(frame)  # a's message, copied onto b's connection
    assert "authentication" in b.dropped().reason
    assert not node0.joined("b") and node0.joined("a") and len(warnings_of(caplog)) == 1
    node0.keeper.heard.pop("a", None)
    a.write(a.seal(m.Stopped(1)))  # a itself is still heard, its session untouched
    node0.pump(lambda: "a" in node0.keeper.heard, "a's next message heard")
    # a launcher with the token that claims a joined member's id is refused, and told why
    with pytest.raises(AssertionError, match="taken"):
        Puppet(node0, "a")
    assert node0.joined("a")
    a.sock.close()


# ---------------------------------------------------------------- the member's side: node 0 counts as gone


class FakeNode0:
    """A node 0 played by the test: it admits the joiner properly, then ``script(conn, session, hello)`` runs."""

    def __init__(self, port, script) -> None:
        self.listener, self.held = socket.create_server((HOST, port)), []
        self.thread = threading.Thread(target=self.serve, args=(script,), daemon=True)
        self.thread.start()

    def serve(self, script) -> None:
        conn, _ = self.listener.accept()
        self.held.append(conn)
        shake = Server(TOKEN, JOB)
        conn.sendall(wire.encode(m.to_wire(shake.challenge())))
        hello = m.from_wire(wire.Framer().feed(conn.recv(65536))[0])
        assert shake.hello(hello.node_id, hello.nonce, hello.proof) is None
        conn.sendall(wire.encode(m.to_wire(shake.welcome())) + wire.encode(m.to_wire(m.Admitted(False)), shake.session))
        script(conn, shake.session, hello)

    def close(self) -> None:
        self.thread.join(BOUND)
        for conn in self.held:
            conn.close()
        self.listener.close()


def round_1(node_id):
    return m.RoundStart(1, (m.Seat("zero", HOST, 1, 0, 0), m.Seat(node_id, HOST, 1, 1, 1)), 2, 0, "round 1")


def inbox_until(inbox, wanted, bound=BOUND) -> list:
    seen: list = []
    deadline = time.monotonic() + bound
    while not any(isinstance(x, wanted) for x in seen):
        assert time.monotonic() < deadline, f"not within {bound:g} s: {wanted.__name__} (saw {seen})"
        select.select([inbox.read_fd], [], [], 0.5)
        seen += inbox.take()
    return seen


def test_a_member_counts_node_0_gone_when_a_forged_order_comes():
    port = free_ports(1)

    def script(conn, session, hello):
        conn.sendall(wire.encode(m.to_wire(round_1(hello.node_id)), session))
        wrong = auth.Session.of(TOKEN, "0" * 32, hello.nonce, JOB, hello.node_id, at_server=True)
        wrong.sent = session.sent
        conn.sendall(wire.encode(m.to_wire(m.StopWorkers(1, "forged")), wrong))

    node0 = FakeNode0(port, script)
    link = es.join(spec_of(port, 2, 2), JOB, 1, TOKEN)
    try:
        assert link.first.number == 1
        link.serve()
        seen = inbox_until(link.inbox, el.JobOver)
        assert not any(isinstance(x, m.StopWorkers) for x in seen)
        assert "failed the job token's authentication" in seen[-1].reason and seen[-1].code == 1
    finally:
        link.close()
        node0.close()


def test_node_0_messages_swapped_before_the_first_round_fail_the_start():
    port = free_ports(1)

    def script(conn, session, hello):
        first, second = (wire.encode(m.to_wire(x), session) for x in (m.Beat(), round_1(hello.node_id)))
        conn.sendall(second + first)

    node0 = FakeNode0(port, script)
    try:
        with pytest.raises(el.StartFailed, match="failed the job token's authentication .message 1 of its session"):
            es.join(spec_of(port, 2, 2), JOB, 1, TOKEN)
    finally:
        node0.close()


# ---------------------------------------------------------------- the happy path, every launcher real


def test_a_sealed_job_forms_round_1_and_re_forms_round_2_after_a_loss():
    port = free_ports(1)
    spec = spec_of(port, 2, 3, keep_alive_interval=0.2, heartbeat_timeout=30.0)
    listener = es.listen(HOST, port)
    keepers, links = [], []
    threads = [threading.Thread(target=lambda: keepers.append(es.lead(listener, spec, JOB, 1, TOKEN)), daemon=True)]
    threads += [threading.Thread(target=lambda: links.append(es.join(spec, JOB, 1, TOKEN)), daemon=True)
                for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(BOUND)
    try:
        assert len(keepers) == 1 and len(links) == 2  # (a start that failed: its thread's traceback above)
        keeper, (a, b) = keepers[0], links
        assert keeper.first.number == a.first.number == b.first.number == 1 and len(a.first.members) == 3
        assert len(keeper.peers) == 2 and all(p.session is not None for p in keeper.peers.values())
        assert a.conn.session is not None and b.conn.session is not None
        keeper.serve()
        a.serve()
        b.serve()
        b.close()  # lost: node 0 re-forms the job without it
        assert isinstance(inbox_until(keeper.inbox, m.StopWorkers)[-1], m.StopWorkers)
        assert isinstance(inbox_until(a.inbox, m.StopWorkers)[-1], m.StopWorkers)
        keeper.stopped(1)
        a.stopped(1)
        second = inbox_until(a.inbox, m.RoundStart)[-1]
        assert second.number == 2 and {s.node_id for s in second.members} == {keeper.node_id, a.node_id}
        assert inbox_until(keeper.inbox, m.RoundStart)[-1] == second
    finally:
        for link in keepers + links:
            link.close()
        listener.close()
