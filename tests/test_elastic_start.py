"""The first round of an elastic job formed over real loopback sockets, in-process (node 0's side in a
thread): the joiners' places, and what strangers and failures do. Every wait is bounded."""

import socket
import threading

import pytest

from conftest import free_ports
from launcher.nodes.elastic import link as el
from launcher.nodes.elastic.c10d import start as es
from launcher.nodes.transport import messages as m
from launcher.nodes.transport import wire
from launcher.nodes.transport.handshake import Client, Server
from launcher.plan.elastic import ElasticSpec, Rendezvous

HOST = "127.0.0.1"


def spec_of(port, low=2, high=2, **settings):
    return ElasticSpec(low, high, "c10d", host=HOST, port=port, rendezvous=Rendezvous(**settings))


def leading(spec, job="job", token=None):
    """Node 0's side in a thread: its (Place or exception) once it ends."""
    listener = es.listen(spec.host, spec.port)
    assert listener is not None
    outcome = []

    def lead():
        try:
            keeper = es.lead(listener, spec, job, 1, token)
            outcome.append(el.place_in(keeper.first, keeper.node_id))
            keeper.close()
        except Exception as e:  # the test looks at it
            outcome.append(e)
            listener.close()

    thread = threading.Thread(target=lead, daemon=True)
    thread.start()
    return thread, outcome


def joined(spec, job, workers, token=None, clock=None):
    """Another launcher's place in the first round (its link closed again)."""
    link = es.join(spec, job, workers, token, **({"clock": clock} if clock else {}))
    try:
        return el.place_in(link.first, link.node_id)
    finally:
        link.close()


def say_hello(sock, job="job", token=None, node_id="x", proof=None) -> tuple:
    """Answer node 0's challenge on ``sock`` with a hello of ``job`` and ``node_id``, proving ``token`` (None: proving
    none; ``proof``: this one instead); the hello's bytes and its ``Client``."""
    challenge = m.from_wire(wire.Framer().feed(sock.recv(65536))[0])
    client = Client(token, job, node_id)
    nonce, proven = client.answer(challenge)
    data = wire.encode(m.to_wire(m.Hello({"job_id": job}, None, nonce, proof or proven, node_id=node_id, host=HOST,
                                         workers=1)))
    sock.sendall(data)
    return data, client


def answer_to(port, body=None, timeout=10.0, **hello) -> list:
    """Connect as a stranger, send ``body`` after node 0's challenge (None: a hello, ``say_hello``'s), node 0's
    messages after its challenge until it closes (bounded)."""
    with socket.create_connection((HOST, port), timeout=timeout) as s:
        if body is None:
            say_hello(s, **hello)
        else:
            s.sendall(body)
        got = b""
        while True:
            data = s.recv(65536)
            if not data:
                return [m.from_wire(x) for x in wire.Framer().feed(got)][0 if body is None else 1:]
            got += data


def test_the_second_launcher_cannot_listen_and_each_gets_its_place():
    port = free_ports(1)
    spec = spec_of(port)
    thread, outcome = leading(spec)
    assert es.listen(HOST, port) is None  # the endpoint is node 0's
    place = joined(spec, "job", 1)
    thread.join(10)
    assert place == el.Place(1, 2, 2, (HOST, HOST), False) and outcome == [el.Place(0, 2, 2, (HOST, HOST), True)]


def test_strangers_lose_only_their_connection_and_the_round_still_forms():
    port = free_ports(1)
    spec = spec_of(port)
    thread, outcome = leading(spec)
    assert answer_to(port, b"\x00\x00\x00\x05junk!") == []  # junk: closed, no word
    welcome, reason = answer_to(port, job="other")  # welcomed (no token), then refused by the membership
    assert welcome == m.Welcome() and "its job id is 'other', this job's is 'job'" in reason.reason
    assert answer_to(port, wire.encode(m.to_wire(m.Beat()))) == []  # no hello first
    nested = b'{"type": "hello", "identity": ' + b'{"a": ' * 50 + b'1' + b'}' * 50 + b'}'
    assert answer_to(port, len(nested).to_bytes(4, "big") + nested) == []  # too deep: closed, no word
    assert answer_to(port, (1 << 30).to_bytes(4, "big") + b"x" * 100) == []  # a 1 GiB frame announced
    assert joined(spec, "job", 1).node_rank == 1
    thread.join(10)
    assert outcome == [el.Place(0, 2, 2, (HOST, HOST), True)]


def test_below_min_after_join_timeout_node_0_tells_those_that_joined():
    port = free_ports(1)
    spec = spec_of(port, low=3, high=3, join_timeout=1.0)
    thread, outcome = leading(spec)
    with pytest.raises(el.StartFailed, match="did not take this launcher: only 2 node.s. joined within 1 s"):
        joined(spec, "job", 1)
    thread.join(10)
    assert isinstance(outcome[0], el.StartFailed) and "only 2 node(s) joined within 1 s" in str(outcome[0])
    assert outcome[0].exit_code == 1


def welcome(conn) -> m.Hello:
    """A node 0 played by the test, without a token: its challenge, the launcher's hello (returned), its welcome."""
    conn.sendall(wire.encode(m.to_wire(Server(None, "job").challenge())))
    hello = m.from_wire(wire.Framer().feed(conn.recv(65536))[0])
    conn.sendall(wire.encode(m.to_wire(m.Welcome())))
    return hello


def test_node_0_that_closes_after_admitting_ends_the_start_saying_so():
    port = free_ports(1)
    listener = socket.create_server((HOST, port))
    spec = spec_of(port)

    def close_first():
        conn, _ = listener.accept()
        welcome(conn)
        conn.sendall(wire.encode(m.to_wire(m.Admitted(False))))
        conn.recv(100)
        conn.close()

    threading.Thread(target=close_first, daemon=True).start()
    with pytest.raises(el.StartFailed, match="closed the rendezvous before this launcher's round started"):
        joined(spec, "job", 1)
    listener.close()


def test_what_node_0_sends_with_the_first_round_reaches_the_event_loop():
    """A stop (a loss just after the start) in the same segment as round 1: not lost between the two phases."""
    port = free_ports(1)
    listener = socket.create_server((HOST, port))
    held = []

    def node_0():
        conn, _ = listener.accept()
        hello = welcome(conn)
        members = (m.Seat("zero", HOST, 1, 0, 0), m.Seat(hello.node_id, HOST, 1, 1, 1))
        conn.sendall(b"".join(wire.encode(m.to_wire(x)) for x in (
            m.Admitted(False), m.RoundStart(1, members, 2, 0, "round 1"), m.StopWorkers(1, "node x lost"))))
        held.append(conn)

    threading.Thread(target=node_0, daemon=True).start()
    link = es.join(spec_of(port), "job", 1)
    try:
        assert link.first.number == 1
        link.serve()
        assert link.inbox.take() == [m.StopWorkers(1, "node x lost")]
    finally:
        link.close()
        for conn in held:
            conn.close()
        listener.close()


def test_no_node_0_within_join_timeout_is_a_start_failure_naming_the_endpoint():
    port = free_ports(1)
    with pytest.raises(el.StartFailed, match=f"could not reach node 0's launcher at {HOST}:{port} within 0.5 s"):
        joined(spec_of(port, join_timeout=0.5), "job", 1)


def test_junk_from_node_0_is_a_start_failure():
    port = free_ports(1)
    listener = socket.create_server((HOST, port))

    def junk():
        conn, _ = listener.accept()
        conn.sendall(b"\xff\xff\xff\xffnot a frame")
        conn.recv(100)
        conn.close()

    threading.Thread(target=junk, daemon=True).start()
    with pytest.raises(el.StartFailed, match="sent junk"):
        joined(spec_of(port), "job", 1)
    listener.close()


def test_what_closes_before_admitting_is_not_called_node_0():
    """Whatever else listens on the endpoint and closes the connection."""
    port = free_ports(1)
    listener = socket.create_server((HOST, port))

    def store_like():
        conn, _ = listener.accept()
        conn.close()

    threading.Thread(target=store_like, daemon=True).start()
    with pytest.raises(el.StartFailed, match=f"^{HOST}:{port} closed the connection without an answer: the endpoint is not this job's"):
        joined(spec_of(port), "job", 1)
    listener.close()


def refusal_of(port, body=None, **hello) -> str:
    (answer,) = answer_to(port, body, **hello)
    assert isinstance(answer, m.Refusal)
    return answer.reason


def test_with_a_job_token_only_a_hello_that_proves_it_joins_and_once():
    port = free_ports(1)
    spec = spec_of(port, low=3, high=3)
    thread, outcome = leading(spec, token="s3cret")
    assert refusal_of(port) == "wrong job or job token"  # proves nothing
    assert refusal_of(port, token="other") == "wrong job or job token"
    assert refusal_of(port, token="s3cret", proof="0" * 64) == "wrong job or job token"
    # node 0's refusal proves the token, which the wrong one cannot check: not obeyed, tried again, then given up
    with pytest.raises(el.StartFailed, match=r"refused this launcher \(wrong job or job token\) without proving the "
                                             r"job token \(LAUNCHER_JOB_TOKEN\) until join_timeout"):
        joined(spec_of(port, low=3, high=3, join_timeout=2.5), "job", 1, "wrong")
    sock = socket.create_connection((HOST, port), timeout=10)
    first, client = say_hello(sock, token="s3cret", node_id="first")  # joins, and stays
    framer, bodies = wire.Framer(), []
    while len(bodies) < 2:
        bodies += framer.bodies(sock.recv(65536))
    assert client.welcomed(m.from_wire(wire.decode(bodies[0])))  # node 0 proves the token on the joiner's nonce
    assert m.from_wire(wire.decode(client.session.open(bodies[1]))) == m.Admitted(False)  # in their session
    assert refusal_of(port, first) == "wrong job or job token"  # its hello replayed: a new challenge
    place = joined(spec, "job", 1, "s3cret")
    thread.join(10)
    sock.close()
    assert place.node_rank == 2 and outcome == [el.Place(0, 3, 3, (HOST, HOST, HOST), True)]


@pytest.mark.parametrize("proof", [None, "0" * 64])
def test_with_a_job_token_a_node_0_that_does_not_prove_it_is_not_joined(proof):
    """One-way trust closed: whatever holds the endpoint must prove the token to the joiner too."""
    port = free_ports(1)
    listener = socket.create_server((HOST, port))

    def impostor():
        conn, _ = listener.accept()
        conn.sendall(wire.encode(m.to_wire(Server("s3cret", "job").challenge())))
        conn.recv(65536)
        conn.sendall(wire.encode(m.to_wire(m.Welcome(proof))) + wire.encode(m.to_wire(m.Admitted(False))))
        conn.recv(100)
        conn.close()

    threading.Thread(target=impostor, daemon=True).start()
    with pytest.raises(el.StartFailed, match="welcomed this launcher without proving the job token"):
        joined(spec_of(port, join_timeout=0.5), "job", 1, "s3cret")
    listener.close()


def test_a_refusal_that_proves_nothing_is_not_obeyed_and_the_real_node_0_is_joined():
    """Whoever answers first on node 0's port with a refusal it cannot prove does not end the joiner: it tries
    again, and joins the node 0 that proves the job token."""
    port = free_ports(1)
    spec = spec_of(port, join_timeout=60)
    impostor_listener = socket.create_server((HOST, port))

    def impostor_then_node_0():
        conn, _ = impostor_listener.accept()
        conn.sendall(wire.encode(m.to_wire(Server("other", "job").challenge())))
        conn.recv(65536)
        conn.sendall(wire.encode(m.to_wire(m.Refusal("go away", "0" * 64))))
        impostor_listener.close()
        conn.close()
        threads.append(leading(spec, token="s3cret"))

    threads = []
    threading.Thread(target=impostor_then_node_0, daemon=True).start()
    place = joined(spec, "job", 1, "s3cret")
    threads[0][0].join(10)
    assert place.node_rank == 1 and threads[0][1] == [el.Place(0, 2, 2, (HOST, HOST), True)]


def test_without_a_job_token_a_hello_that_proves_one_is_refused():
    port = free_ports(1)
    spec = spec_of(port)
    thread, outcome = leading(spec)
    assert refusal_of(port, token="s3cret") == "it proves a job token, and this job has none"
    joined(spec, "job", 1)
    thread.join(10)
    assert outcome == [el.Place(0, 2, 2, (HOST, HOST), True)]


def test_a_joined_launcher_that_goes_silent_is_dropped_and_the_round_forms_without_it():
    port = free_ports(1)
    spec = spec_of(port, high=3, heartbeat_timeout=0.5, keep_alive_interval=0.1, last_call_timeout=1.5)
    thread, outcome = leading(spec)
    with socket.create_connection((HOST, port), timeout=10) as silent:
        say_hello(silent, node_id="silent")  # then never a heartbeat
        framer, seen = wire.Framer(), []
        while not any(isinstance(x, m.Dropped) for x in seen):
            data = silent.recv(65536)
            assert data, f"closed without a word after {seen}"
            seen += [m.from_wire(b) for b in framer.feed(data)]
    assert seen[:2] == [m.Welcome(), m.Admitted(False)] and "no heartbeat for" in seen[-1].reason
    assert joined(spec, "job", 1).node_rank == 1
    thread.join(10)
    assert outcome == [el.Place(0, 2, 2, (HOST, HOST), True)]


def test_connections_that_never_say_hello_cannot_keep_a_launcher_out():
    from launcher.nodes.transport.listener import MAX_PENDING

    port = free_ports(1)
    spec = spec_of(port)
    thread, outcome = leading(spec)
    quiet = [socket.create_connection((HOST, port), timeout=10) for _ in range(MAX_PENDING + 5)]
    try:
        assert joined(spec, "job", 1).node_rank == 1
        thread.join(10)
        assert outcome == [el.Place(0, 2, 2, (HOST, HOST), True)]
    finally:
        for s in quiet:
            s.close()
