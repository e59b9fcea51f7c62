"""The liveness ring of an etcd job (launcher.nodes.elastic.etcd.ring), on loopback sockets: a launcher whose process is
gone (its sockets closed by the kernel: its connection closes, or a new one is refused) is reported; one that is
alive but silent (it accepts and keeps the connection) is not; the ring order; a node key's ring address read
defensively. Every wait is bounded."""

import selectors
import socket
import time

import pytest

from launcher.nodes.elastic.etcd import keys as ek
from launcher.nodes.elastic.etcd.ring import Peer, Ring, successor

WAIT = 10.0


def serve(ring: Ring, until, seconds=WAIT) -> list:
    """Turns of the ring's selector until ``until(gone)``; every Peer reported gone."""
    gone, deadline = [], time.monotonic() + seconds
    with selectors.DefaultSelector() as selector:
        while not until(gone):
            assert time.monotonic() < deadline, f"not within {seconds} s; gone so far: {gone}"
            ring.watch_with(selector, -1)
            for key, mask in selector.select(0.05):
                gone += ring.ready(key.fd, mask)
    return gone


def listener() -> socket.socket:
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(4)
    return sock


@pytest.fixture
def ring():
    made = Ring()
    assert made.listen("127.0.0.1") is not None
    yield made
    made.close()


def test_a_peer_whose_process_is_gone_is_reported(ring):
    peer_listener = listener()
    peer = Peer("b", 7, peer_listener.getsockname())
    ring.follow(peer)
    serve(ring, lambda gone: ring.connected)
    held, _ = peer_listener.accept()
    held.close()  # the kernel closes a dead process's sockets: this is what the watcher sees
    peer_listener.close()
    assert serve(ring, lambda gone: gone) == [peer]
    assert ring.watched is None


def test_a_peer_that_refuses_the_connection_is_reported(ring):
    gone_listener = listener()
    address = gone_listener.getsockname()
    gone_listener.close()  # nobody listens there any more: the connection is refused
    ring.follow(Peer("b", 7, address))
    assert serve(ring, lambda gone: gone) == [Peer("b", 7, address)]


def test_a_silent_peer_is_not_reported(ring):
    peer_listener = listener()
    ring.follow(Peer("b", 7, peer_listener.getsockname()))
    serve(ring, lambda gone: ring.connected)
    held, _ = peer_listener.accept()  # a stopped process's kernel keeps its connections: nothing closes
    deadline = time.monotonic() + 1.0
    assert serve(ring, lambda gone: gone or time.monotonic() > deadline) == []
    held.close()
    peer_listener.close()


def test_the_listener_holds_what_connects_and_lets_go_what_speaks_or_closes(ring):
    address = ring.listener.sock.getsockname()
    clients = [socket.create_connection(address) for _ in range(3)]
    serve(ring, lambda gone: len(ring.held) == 3)
    clients[0].sendall(b"anything")  # nothing is sent on the ring: what speaks is no watcher
    clients[1].close()
    serve(ring, lambda gone: len(ring.held) == 1)
    for c in clients:
        c.close()


def test_following_another_peer_drops_the_old_connection(ring):
    first, second = listener(), listener()
    ring.follow(Peer("b", 1, first.getsockname()))
    serve(ring, lambda gone: ring.connected)
    ring.follow(Peer("c", 2, second.getsockname()))
    assert ring.watched.node_id == "c" and not ring.connected
    ring.follow(None)
    assert ring.watched is None and ring.conn is None
    first.close()
    second.close()


def test_the_ring_order_is_the_keys_age_the_last_one_watching_the_first():
    peers = [Peer(n, i, ("127.0.0.1", 1000 + i)) for i, n in enumerate("abc")]
    assert [successor(peers, n).node_id for n in "abc"] == ["b", "c", "a"]
    assert successor(peers[:1], "a") is None and successor(peers, "z") is None


@pytest.mark.parametrize("ring_value", [None, [], ["h"], ["h", 0], ["h", 70000], ["h", "80"], [1, 80], ["", 80],
                                        ["h" * 300, 80], ["h", True], {"host": "h"}, "h:80", ["h", 80, 1]])
def test_a_node_key_with_no_ring_address_of_ours_has_none(ring_value):
    import json

    value = json.dumps({"id": "n1", "host": "h", "workers": 1, "proof": None, "ring": ring_value})
    joiner = ek.read_node(value, 5, 1, None, "job")
    assert joiner is not None and joiner.ring is None


def test_a_node_key_carries_its_ring_address():
    from launcher.nodes.elastic import membership as mb

    value = ek.node_value(mb.Node("n1", "10.0.0.1", 2), 5, None, "job", ("10.0.0.1", 4242))
    assert ek.read_node(value, 5, 1, None, "job").ring == ("10.0.0.1", 4242)
