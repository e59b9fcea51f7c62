"""The one handshake of every link between launchers (``launcher.nodes.transport.handshake``), without sockets:
what each side accepts, and every attack on it (a replayed hello, a replayed welcome, a stranger's refusal, a
wrong token, a reflected proof, an altered reason)."""

import pytest

from launcher.nodes.transport import messages as m
from launcher.nodes.transport.auth import fresh_nonce
from launcher.nodes.transport.handshake import REFUSED_UNPROVEN, Client, Server
from launcher.nodes.transport.wire import ProtocolError

JOB = "job1"


def hello_of(client: Client, server: Server) -> tuple:
    """The client's (nonce, proof) for the server's challenge."""
    return client.answer(server.challenge())


def test_with_a_token_both_sides_prove_it_and_hold_one_session():
    server, client = Server("t", JOB), Client("t", JOB, 3)
    nonce, proof = hello_of(client, server)
    assert fresh_nonce(nonce) and nonce != server.nonce and proof is not None
    assert server.hello(3, nonce, proof) is None and server.proven
    assert client.welcomed(server.welcome())
    assert client.session is not None and server.session is not None
    assert client.session.open(server.session.seal(b"down")) == b"down"
    assert server.session.open(client.session.seal(b"up")) == b"up"


def test_without_a_token_there_is_no_proof_and_no_session():
    server, client = Server(None, JOB), Client(None, JOB, "a")
    nonce, proof = hello_of(client, server)
    assert proof is None and server.hello("a", nonce, proof) is None
    welcome = server.welcome()
    assert welcome == m.Welcome() and client.welcomed(welcome)
    assert server.session is None and client.session is None
    assert server.refusal("its script is 'x'").reason == "its script is 'x'"  # named: nothing guards the job


def test_without_a_token_a_hello_that_proves_one_is_refused():
    server = Server(None, JOB)
    nonce, proof = hello_of(Client("t", JOB, "a"), server)
    assert server.hello("a", nonce, proof) == "it proves a job token, and this job has none"


@pytest.mark.parametrize("token", [None, "wrong"])
def test_with_a_token_a_hello_that_does_not_prove_it_hears_only_that(token):
    server, client = Server("t", JOB), Client(token, JOB, 1)
    nonce, proof = hello_of(client, server)
    assert server.hello(1, nonce, proof) is not None and not server.proven
    refusal = server.refusal("its script is '-u other.py'")
    assert refusal.reason == REFUSED_UNPROVEN  # nothing of the job
    # one without a token obeys any refusal; one with another token cannot tell node 0's from a stranger's
    assert client.refused(refusal) is (token is None)
    assert Client("t", JOB, 1).refused(refusal) is False  # proven on this client's nonce only


@pytest.mark.parametrize("nonce, proof, why", [
    (None, "0" * 64, "it gives no nonce to prove the job token on"),
    ("x" * 32, "0" * 64, "it gives no nonce to prove the job token on"),
    ("c" * 32, None, "it gives no proof of the job token (LAUNCHER_JOB_TOKEN)"),
    ("c" * 32, ["x"], "it gives no proof of the job token (LAUNCHER_JOB_TOKEN)"),
    ("c" * 32, "\u00e9" * 64, "its proof of the job token (LAUNCHER_JOB_TOKEN) is wrong"),
    ("c" * 32, "0" * 64, "its proof of the job token (LAUNCHER_JOB_TOKEN) is wrong"),
])
def test_a_hello_of_wrong_values_is_refused_with_its_reason(nonce, proof, why):
    assert Server("t", JOB).hello(1, nonce, proof) == why


def test_a_proof_holds_for_the_one_it_names_and_its_job_only():
    server = Server("t", JOB)
    nonce, proof = hello_of(Client("t", JOB, 1), server)
    assert server.hello(2, nonce, proof) is not None  # another node index
    other_job = Server("t", "job2")
    nonce, proof = Client("t", JOB, 1).answer(other_job.challenge())
    assert other_job.hello(1, nonce, proof) is not None


def test_a_hello_replayed_on_a_new_connection_is_refused():
    first = Server("t", JOB)
    nonce, proof = hello_of(Client("t", JOB, 1), first)
    assert first.hello(1, nonce, proof) is None
    again = Server("t", JOB)  # a new connection: a new challenge
    assert again.nonce != first.nonce
    assert again.hello(1, nonce, proof) == "its proof of the job token (LAUNCHER_JOB_TOKEN) is wrong"
    assert again.refusal("x").reason == REFUSED_UNPROVEN


def test_a_welcome_replayed_on_another_connection_is_not_obeyed():
    server, client = Server("t", JOB), Client("t", JOB, 1)
    assert server.hello(1, *hello_of(client, server)) is None
    welcome = server.welcome()
    other = Client("t", JOB, 1)  # the same node on a new connection, challenged by whoever holds the port
    other.answer(Server("t", JOB).challenge())
    assert not other.welcomed(welcome) and other.session is None
    assert client.welcomed(welcome)


def test_a_refusal_is_obeyed_only_when_proven_on_this_connection():
    server, client = Server("t", JOB), Client("t", JOB, 1)
    nonce, _ = hello_of(client, server)
    assert server.hello(1, nonce, "0" * 64) is not None  # its proof mangled on the way: node 0 proves its refusal
    refusal = server.refusal("wrong proof")
    assert client.refused(refusal)
    assert not client.refused(m.Refusal(refusal.reason))  # a stranger's, unproven
    assert not client.refused(m.Refusal("another reason", refusal.proof))  # its reason altered
    other = Client("t", JOB, 1)
    other.answer(Server("t", JOB).challenge())
    assert not other.refused(refusal)  # replayed to another connection


def test_a_node_that_proves_the_token_is_told_the_reason():
    server, client = Server("t", JOB), Client("t", JOB, 1)
    assert server.hello(1, *hello_of(client, server)) is None
    refusal = server.refusal("node 1 (10.0.0.2) is already joined")
    assert refusal.reason == "node 1 (10.0.0.2) is already joined" and client.refused(refusal)


def test_a_reflected_proof_is_no_welcome():
    server, client = Server("t", JOB), Client("t", JOB, 1)
    _, proof = hello_of(client, server)
    assert not client.welcomed(m.Welcome(proof))  # its own hello's proof, sent back
    assert not client.welcomed(m.Welcome(None)) and not client.welcomed(m.Welcome("\u00e9" * 64))


def test_a_client_answers_one_fresh_challenge_only():
    client = Client("t", JOB, 1)
    assert client.answer(m.Challenge(None)) is None and client.answer(m.Challenge("x" * 32)) is None
    assert client.answer(m.Welcome()) is None
    assert client.answer(m.Challenge("a" * 32)) is not None
    assert client.answer(m.Challenge("b" * 32)) is None  # a second challenge on the same connection
    assert not Client("t", JOB, 1).welcomed(Server("t", JOB).welcome())  # a welcome before any challenge


def test_the_sessions_of_two_connections_do_not_open_each_others_messages():
    sessions = []
    for _ in range(2):
        server, client = Server("t", JOB), Client("t", JOB, "a")
        assert server.hello("a", *hello_of(client, server)) is None
        assert client.welcomed(server.welcome())
        sessions.append((server.session, client.session))
    (server_a, client_a), (server_b, client_b) = sessions
    with pytest.raises(ProtocolError):
        client_b.open(server_a.seal(b"{}"))
    with pytest.raises(ProtocolError):
        client_a.open(client_a.seal(b"{}"))  # reflected
