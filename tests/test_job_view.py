"""The whole job on each node's page (launcher.run.job_view): each other node's /view.json fetched while someone
watches, from real sockets. A peer that refuses, never answers, drips its answer, sends too much or sends junk is a
row that says so; the others' rows come all the same. Every wait is for an event, bounded."""

import json
import socket
import threading

import pytest

from conftest import wait_for
from launcher.output.monitor_view import NodeView, WorkerView, view_json
from launcher.run import job_view
from launcher.run.job_view import JobViews, fetch_view

WAIT = 30


class Peer:
    """A TCP server on 127.0.0.1 that answers each connection with ``answer(sock)``, in a thread; closed at the end."""

    def __init__(self, answer):
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.answer, self.open = answer, []
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self):
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.open.append(conn)
            threading.Thread(target=self._one, args=(conn,), daemon=True).start()

    def _one(self, conn):
        try:
            conn.recv(65536)
            self.answer(conn)
        except OSError:
            pass

    def close(self):
        self.sock.close()
        for conn in self.open:
            conn.close()


def http(body, code=b"200 OK"):
    def answer(conn):
        conn.sendall(b"HTTP/1.1 " + code + b"\r\nContent-Length: %d\r\n\r\n" % len(body) + body)
        conn.close()
    return answer


def node_view(node, *ranks):
    workers = tuple(WorkerView(r, r, f"rank {r}", 100 + r, "running", 0, last_line=f"line of {r}") for r in ranks)
    return view_json(NodeView(node, "127.0.0.1", 2, 4, "run", "running", 0, 0, workers=workers))


@pytest.fixture
def peers():
    made = []
    yield lambda answer: made.append(Peer(answer)) or made[-1]
    for peer in made:
        peer.close()


def test_a_peer_s_view_is_fetched(peers):
    peer = peers(http(node_view(1, 2, 3)))
    assert json.loads(fetch_view("127.0.0.1", peer.port))["node"] == 1


@pytest.mark.parametrize("answer, why", [
    (lambda conn: None, "no whole answer"),  # never answers
    (lambda conn: [conn.sendall(b"HTTP/1.1 200 OK\r\n\r\n" + b"x" * 4096) for _ in range(200)], "over"),  # too much
    (http(b"starting\n", b"503 Service Unavailable"), "HTTP 503: starting"),
    (lambda conn: conn.sendall(b"SSH-2.0-OpenSSH\r\n\r\n") or conn.close(), "not HTTP"),
])
def test_a_peer_that_does_not_answer_with_a_view_raises_one_line(peers, monkeypatch, answer, why):
    peer = peers(answer)
    with pytest.raises((OSError, ValueError), match=why):
        fetch_view("127.0.0.1", peer.port, wait=2.0, limit=64 * 1024)


def test_a_peer_that_drips_its_answer_is_cut_at_the_deadline(peers):
    import time

    def drip(conn):
        conn.sendall(b"HTTP/1.1 200 OK\r\n\r\n")
        for _ in range(100):
            conn.sendall(b" ")
            time.sleep(0.2)
    peer = peers(drip)
    with pytest.raises(TimeoutError):
        fetch_view("127.0.0.1", peer.port, wait=1.0)


def test_the_job_s_rows_come_from_every_peer_that_answers_and_name_the_others(peers):
    good, junk = peers(http(node_view(1, 2, 3))), peers(http(b"[" * 10_000))
    closed = socket.create_server(("127.0.0.1", 0))
    refused_port = closed.getsockname()[1]
    closed.close()
    ports = {"127.0.0.2": good.port, "127.0.0.3": junk.port, "127.0.0.4": refused_port}
    changed = threading.Event()
    views = JobViews(1, changed.set, fetch=lambda host, _: fetch_view("127.0.0.1", ports[host], wait=2.0))
    try:
        assert views.latest() == () and views.thread is None  # nobody watches: no fetch, no thread
        views.want([(1, "127.0.0.2"), (2, "127.0.0.3"), (3, "127.0.0.4")])
        wait_for(lambda: len(views.latest()) == 3, WAIT, "a round of fetches")
        rows = {row["node"]: row for row in views.latest()}
        assert [w["rank"] for w in rows[1]["workers"]] == [2, 3] and rows[1]["error"] == ""
        assert "not a JSON object" in rows[2]["error"]
        assert "refused" in rows[3]["error"].lower()
        assert changed.is_set()
    finally:
        views.close()


def test_nobody_watching_stops_the_fetches(peers, monkeypatch):
    asked = []
    clock = [0.0]
    views = JobViews(1, lambda: None, fetch=lambda host, port: asked.append(host) or node_view(1), clock=lambda: clock[0])
    monkeypatch.setattr(job_view, "GATHER_EVERY", 0.01)
    try:
        views.want([(1, "h")])
        wait_for(lambda: len(asked) >= 2, WAIT, "fetches while watched")
        clock[0] += job_view.WATCH_LINGER + 1  # the last watcher asked long ago
        wait_for(lambda: views.wake.is_set() is False, WAIT, "the thread waiting")
        seen = len(asked)
        views.wake.set()  # woken: it looks, finds nobody watching, fetches nothing
        wait_for(lambda: not views.wake.is_set(), WAIT, "the thread waiting again")
        assert len(asked) <= seen + 1  # at most the round that was under way
    finally:
        views.close()


def test_a_monitor_on_a_free_port_says_how_to_see_the_other_nodes():
    pytest.importorskip("prometheus_client")
    from launcher.run.monitor import Monitor

    monitor = Monitor("127.0.0.1", 0)
    try:
        made = NodeView(0, "127.0.0.1", 2, 4, "run", "running", 0, 0, node_ips=("127.0.0.1", "127.0.0.2"))
        (row,) = monitor._peers(made, watched=True)
        assert row["node"] == 1 and "the same fixed --monitor_port on every node" in row["error"]
        assert monitor.job_views is None
    finally:
        monitor.close()


def test_asking_again_while_the_fetches_go_on_does_not_hasten_them(monkeypatch):
    """The monitor asks at each of its turns, and each round of fetches wakes it: a round per ask would fetch
    without pause (it did)."""
    monkeypatch.setattr(job_view, "GATHER_EVERY", 3600.0)  # the next round only by the clock: never, here
    asked, rounds = [], threading.Event()
    views = JobViews(1, rounds.set, fetch=lambda host, port: asked.append(host) or node_view(1))
    try:
        views.want([(1, "h")])
        assert rounds.wait(WAIT), "no first round"
        rounds.clear()
        for _ in range(50):
            views.want([(1, "h")])
        assert not rounds.wait(1.0), "a round per ask"  # a bound on what must not come, not a timing
    finally:
        views.close()
    assert asked == ["h"]
