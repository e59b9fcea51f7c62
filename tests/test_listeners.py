"""What any listener of the launcher must withstand, run on all eight servers: a client that never speaks (one, and
more than the server's cap on connections not yet introduced), 1,000 connections at once, a hello that says it is
huge (1 GB), a closed half (at once, or after half a hello), and the server's process out of descriptors (EMFILE).
After each attack a legitimate client of that server is still served: its real client, as its own tests make one.

What 'pass' means, per server:

- ``hub`` (node 0's control channel): a spoke joins. A silent connection is held until pushed out by the pending
  cap (the oldest goes) or its hello's deadline; a huge or half hello is dropped.
- ``gather`` (rank 0's gathering of an MPI job's node list): rank 1 joins and both agree on the list; the same drops.
- ``ring`` (an etcd job's liveness ring): a watcher (another launcher's ring following this one) is held. The ring
  holds silent connections by design (a watcher never speaks): "never speaks" means held, up to its cap (the oldest
  pushed out past it), not dropped; a connection that says anything, or closes its half, is no watcher: dropped.
- ``keeper`` (node 0 of a c10d elastic job): a member joins and the first round starts with it.
- ``monitor`` (``--monitor_port``, HTTP): a GET is answered. Silent clients past the cap push the oldest out.
- ``worker_channel`` (the local channel, an abstract unix socket): a worker says hello and is welcomed. Any process
  that is not one of the launcher's workers (this test's own connections) is closed at once (SO_PEERCRED); the huge
  hello comes from a worker (a child), and is dropped.
- ``store`` (node 0's rendezvous store, torch's TCPStore protocol): a client sets and gets a key.
- ``tune`` (the leading tuner's link, ``launcher tune`` on nodes started on their own): a following tuner joins.

Out of descriptors, every server must neither die nor spin (its loop is not woken again and again by a listener it
cannot accept from: at most a few busy turns while the table is full, which the pause of the listener bounds), and
must accept again once descriptors are free. Every wait is bounded; no duration is asserted; the keeper and the
monitor run on a fake clock, which the test moves.
"""

from __future__ import annotations

import errno
import logging
import os
import resource
import secrets
import selectors
import socket
import struct
import subprocess
import sys
import threading
import time
from contextlib import contextmanager
from pathlib import Path

import pytest

from launcher import local_channel as lc
from launcher.nodes.static import gather
from launcher.nodes.static.channel import Joined
from launcher.nodes.static.hub import Hub
from launcher.nodes.static.spoke import Spoke
from launcher.nodes.transport import listener as kit
from launcher.nodes.transport.messages import Identity
from launcher.nodes.tune import follower as tune_follower, leader as tune_leader
from launcher.run import store
from launcher.run.tcpstore_protocol import Query
from link_harness import C10d, Clock
from tests.conftest import free_port
from tests.test_gather import finish, spec, start as start_rank, wait_listening
from tests.test_store import Raw, VALIDATE, closed_by_server, frame, new_store, watch
from tests.test_worker_channel import REPO, result, spawn

BOUND = 60.0  # seconds of real time any one wait may take (a hang guard, never a timing)
CROWD = 1000
IDENTITY = Identity("job1", ("127.0.0.1", "127.0.0.2"), (7000,), "-u train.py")
TOKEN = "secret"


def wait_until(condition, what: str, bound: float = BOUND) -> None:
    deadline = time.monotonic() + bound
    while not condition():
        assert time.monotonic() < deadline, f"not within {bound:g} s: {what}"
        time.sleep(0.01)


def stream(sock: socket.socket, head: bytes, total: int = 1 << 30, bound: float = BOUND) -> bool:
    """``head``, then bytes up to ``total``, until the server closes the connection (True) or the bound."""
    sock.settimeout(bound)
    chunk = b"x" * (1 << 20)
    try:
        sock.sendall(head)
        for _ in range(total // len(chunk)):
            sock.sendall(chunk)
    except (ConnectionResetError, BrokenPipeError):
        return True
    except socket.timeout:
        return False
    return False


def busy(selector, counter: dict) -> None:
    """``selector``'s select counted: how many turns found something ready while ``counter['on']``."""
    plain = selector.select

    def select(timeout=None):
        got = plain(timeout)
        if got and counter.get("on"):
            counter["turns"] = counter.get("turns", 0) + 1
        return got
    selector.select = select


@contextmanager
def no_descriptor_left():
    """This process's table of descriptors full: the soft RLIMIT_NOFILE lowered to just above the highest one
    open, and the rest filled; everything restored after."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    spare = os.open("/dev/null", os.O_RDONLY | os.O_CLOEXEC)
    top = max(int(fd) for fd in os.listdir("/proc/self/fd"))
    filled = []
    resource.setrlimit(resource.RLIMIT_NOFILE, (top + 32, hard))
    try:
        while True:
            try:
                filled.append(os.dup(spare))
            except OSError as e:
                assert e.errno == errno.EMFILE
                break
        yield
    finally:
        for fd in filled:
            os.close(fd)
        os.close(spare)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


class Driver:
    """A loop like the launcher's, in a thread of its own, for servers the event loop drives: one selector (made
    once: none is needed while the table is full), re-registered each turn from ``sync``; ``turn`` dispatches."""

    def __init__(self, sync, dispatch) -> None:
        self.sync, self.dispatch = sync, dispatch
        self.selector = selectors.DefaultSelector()
        self.lock = threading.Lock()
        self.events: list = []
        self.error = None
        self.stopped = threading.Event()
        self.counter: dict = {}
        busy(self.selector, self.counter)
        self.thread = threading.Thread(target=self.run, daemon=True)
        self.thread.start()

    def run(self) -> None:
        try:
            while not self.stopped.is_set():
                with self.lock:
                    self.sync(self.selector)
                ready = self.selector.select(0.02)
                with self.lock:
                    for key, mask in ready:
                        self.events += self.dispatch(key, mask) or []
        except Exception as e:  # noqa: BLE001 - the test names it
            self.error = e

    def stop(self) -> None:
        self.stopped.set()
        self.thread.join(BOUND)
        self.selector.close()


def register_all(selector, owners) -> None:
    """Every owner's registrations afresh: a closed socket's number may have been taken again."""
    for key in list(selector.get_map().values()):
        selector.unregister(key.fd)
    for owner in owners:
        for fd, events in owner.registrations().items():
            selector.register(fd, events, owner)


# ---------------------------------------------------------------- the eight servers


class Server:
    name = ""
    family = socket.AF_INET
    cap = kit.MAX_PENDING  # connections not yet introduced that it holds at most
    closes_strangers = False  # every connection of this test is closed at once (not the server's kind of client)
    holds_silent = False  # a silent connection is what its clients are (the ring's watchers)
    huge = b""  # the start of a hello that says it is huge
    half = b""  # half of a hello

    def __init__(self, monkeypatch, tmp_path) -> None:
        self.monkeypatch, self.tmp_path = monkeypatch, tmp_path

    def socket(self) -> socket.socket:
        return socket.socket(self.family, socket.SOCK_STREAM)

    def connect(self, blocking: bool = True) -> socket.socket:
        sock = self.socket()
        if blocking:
            sock.settimeout(BOUND)
            deadline = time.monotonic() + BOUND
            while True:
                try:
                    sock.connect(self.address)
                    break
                except BlockingIOError:  # a unix socket's full queue: the server has yet to take from it
                    assert time.monotonic() < deadline, f"{self.name} never took a connection from its queue"
                    time.sleep(0.01)
        else:
            sock.setblocking(False)
            sock.connect_ex(self.address)
        return sock

    def count_selectors_of(self, module) -> None:
        """The selectors ``module`` makes from now on, each counted in ``self.counter`` (``busy``): for a server whose
        loop makes its own selector."""
        self.counter = {}
        original = selectors.DefaultSelector

        class Counted(original):
            def __init__(inner) -> None:
                super().__init__()
                busy(inner, self.counter)
        self.monkeypatch.setattr(module.selectors, "DefaultSelector", Counted)

    def busy_turns(self) -> int:
        return self.counter.get("turns", 0)

    def count_busy(self, on: bool) -> None:
        self.counter["on"] = on

    def resume(self) -> None:
        """Descriptors are free again: time passes (a fake clock moves)."""

    def alive(self) -> bool:
        return self.thread.is_alive()

    def huge_hello_dropped(self) -> bool:
        with self.connect() as sock:
            return stream(sock, self.huge)


class DrivenServer(Server):
    """A server the launcher's event loop (or the etcd link's thread) drives: here a ``Driver``."""

    def drive(self, sync, dispatch) -> None:
        self.driver = Driver(sync, dispatch)
        self.thread, self.counter = self.driver.thread, self.driver.counter

    @contextmanager
    def beside(self, client):
        """``client`` (a spoke, a ring) driven by the same loop while the block runs."""
        with self.driver.lock:
            self.owners.append(client)
        try:
            yield client
        finally:
            with self.driver.lock:
                self.owners.remove(client)
            client.close()

    def alive(self) -> bool:
        return self.thread.is_alive() and self.driver.error is None

    def stop(self) -> None:
        self.driver.stop()
        self.close()
        assert self.driver.error is None, self.driver.error


class HubServer(DrivenServer):
    name = "hub"
    huge = struct.pack("!I", 1 << 30)
    half = struct.pack("!I", 40) + b'{"type": "hel'

    def start(self) -> None:
        port = free_port()
        self.address = ("127.0.0.1", port)
        self.hub = Hub(IDENTITY, "127.0.0.1", port, heartbeat_timeout=10, join_timeout=BOUND, token=TOKEN)
        self.owners = [self.hub]
        now = time.monotonic
        self.drive(lambda sel: register_all(sel, self.owners) or [o.tick(now()) for o in self.owners],
                   lambda key, mask: key.data.ready(key.fd, mask, now()))

    def serve_legit(self) -> None:
        with self.beside(Spoke(IDENTITY, 1, "127.0.0.1", self.address[1], 10, BOUND, TOKEN)):
            wait_until(lambda: Joined(1) in self.driver.events and Joined(0) in self.driver.events, "the spoke joined")

    def close(self) -> None:
        self.hub.close()


class GatherServer(Server):
    name = "gather"
    huge = struct.pack("!I", 1 << 30)
    half = struct.pack("!I", 40) + b'{"type": "jo'

    def start(self) -> None:
        self.count_selectors_of(gather)  # rank 0's selector, made inside gather()
        port = free_port()
        self.address = ("127.0.0.1", port)
        self.rank0 = start_rank(spec(0, 2, port), "127.0.0.1", timeout=2 * BOUND)
        self.thread = self.rank0["thread"]
        wait_listening(port)

    def serve_legit(self) -> None:
        rank1 = start_rank(spec(1, 2, self.address[1]), "127.0.0.2", timeout=BOUND)
        finish(self.rank0, rank1, seconds=2 * BOUND)
        assert self.rank0.get("nodes") == rank1.get("nodes") == ("127.0.0.1", "127.0.0.2"), \
            (self.rank0.get("error"), rank1.get("error"))

    def alive(self) -> bool:
        return self.thread.is_alive() and "error" not in self.rank0

    def stop(self) -> None:
        pass  # rank 0 returned once rank 1 joined (else its join timeout ends it)


class RingServer(DrivenServer):
    name = "ring"
    holds_silent = True
    huge = b"x"  # a watcher never speaks: one byte is as good as a gigabyte
    half = b"x"

    def start(self) -> None:
        from launcher.nodes.elastic.etcd import ring as ring_module

        self.cap = 64
        self.monkeypatch.setattr(ring_module, "HELD_LIMIT", self.cap)
        self.ring = ring_module.Ring()
        self.address = self.ring.listen("127.0.0.1")
        assert self.address is not None
        self.owners = [self.ring]
        self.drive(lambda sel: register_all(sel, self.owners), lambda key, mask: key.data.ready(key.fd, mask))

    def holds(self, sock) -> bool:
        with self.driver.lock:
            return any(s.getpeername() == sock.getsockname() for s in self.ring.held.values() if s.fileno() >= 0)

    def serve_legit(self) -> None:
        from launcher.nodes.elastic.etcd.ring import Peer, Ring

        watcher = Ring()
        watcher.follow(Peer("watched", 1, self.address))  # before it is driven: it connects now
        with self.beside(watcher):
            wait_until(lambda: watcher.connected and self.holds(watcher.conn), "the watcher's connection is held")
            assert self.driver.events == [], "the watcher saw this ring gone"

    def close(self) -> None:
        self.ring.close()


class KeeperServer(Server):
    name = "keeper"
    huge = struct.pack("!I", 1 << 30)
    half = struct.pack("!I", 40) + b'{"type": "hel'

    def start(self) -> None:
        self.harness = C10d(low=2, high=2, token=TOKEN)
        self.formed: list = [None, None]
        self.thread = threading.Thread(target=self.harness._form_one, args=(0, 1, self.formed), daemon=True)
        self.thread.start()
        wait_until(lambda: self.harness.keeper is not None, "node 0 listens")
        self.keeper = self.harness.keeper
        self.address = (self.harness.spec.host, self.harness.spec.port)
        self.counter = {}
        busy(self.keeper.selector, self.counter)

    def resume(self) -> None:
        self.harness.clock.advance(kit.PAUSE + 1.0)
        self.keeper.waker.put(None)

    def serve_legit(self) -> None:
        member = threading.Thread(target=self.harness._form_one, args=(1, 1, self.formed), daemon=True)
        member.start()
        member.join(BOUND)
        self.thread.join(BOUND)
        assert not member.is_alive() and not self.thread.is_alive(), "the first round did not start"
        keeper, joined = self.formed
        assert keeper is self.keeper and keeper.first is not None, keeper
        assert getattr(joined, "first", None) is not None and joined.first.number == keeper.first.number, joined

    def alive(self) -> bool:
        return self.thread.is_alive()

    def stop(self) -> None:
        self.harness.close()


class MonitorServer(Server):
    name = "monitor"
    huge = b"GET / HTTP/1.1\r\nX-Huge: "
    half = b"GET / HT"

    def start(self) -> None:
        pytest.importorskip("prometheus_client")
        from launcher.run.monitor import MAX_CLIENTS, Monitor

        self.cap = MAX_CLIENTS
        self.clock = Clock()
        self.monitor = Monitor("127.0.0.1", 0, clock=self.clock)
        self.address = ("127.0.0.1", self.monitor.port)
        self.counter = {}
        busy(self.monitor.selector, self.counter)
        self.monitor.start()
        self.thread = self.monitor.thread

    def resume(self) -> None:
        self.clock.advance(kit.PAUSE + 1.0)
        self.monitor._wake()

    def serve_legit(self) -> None:
        with self.connect() as sock:
            sock.sendall(b"GET / HTTP/1.1\r\nHost: test\r\n\r\n")
            answer = b""
            while True:
                data = sock.recv(65536)
                if not data:
                    break
                answer += data
        assert answer.startswith(b"HTTP/1.1 200 OK"), answer[:200]

    def stop(self) -> None:
        self.monitor.close()


WORKER = r"""
import json, os, socket, sys
from launcher import local_channel as lc
s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
s.settimeout(60)
s.connect(lc.address(os.environ["LAUNCHER_CONTROL_SOCKET"]))
s.recv(65536)  # the challenge
closed, chunk = False, b"x" * (1 << 20)
try:
    for _ in range(1024):  # a line of 1 GB, were it all taken
        s.sendall(chunk)
except OSError:
    closed = True
print(json.dumps({"closed": closed}), flush=True)
"""


class WorkerChannelServer(DrivenServer):
    name = "worker_channel"
    family = socket.AF_UNIX
    closes_strangers = True

    def start(self) -> None:
        from launcher.run.worker_channel import WorkerChannel

        spawned: set = set()
        self.channel = WorkerChannel("test", lambda: {"round": 3, "reform_wait": 1.5}, lambda pid: pid in spawned)
        self.channel.spawned = spawned
        self.channel.listen()
        assert self.channel.listener is not None
        self.address = lc.address(self.channel.name)
        self.drive(lambda sel: register_all(sel, [self.channel]), lambda key, mask: self.channel.ready(key.fd, mask))

    def huge_hello_dropped(self) -> bool:
        out = self.tmp_path / f"huge-{secrets.token_hex(4)}"
        env = {**os.environ, "PYTHONPATH": str(REPO), **self.channel.env()}
        with open(f"{out}.out", "w") as stdout, open(f"{out}.err", "w") as stderr:
            proc = subprocess.Popen([sys.executable, "-c", WORKER], env=env, cwd=REPO, stdout=stdout, stderr=stderr)
        self.channel.spawned.add(proc.pid)
        proc.out = out
        return result(proc) == {"closed": True}

    def serve_legit(self) -> None:
        with self.driver.lock:
            said = len(self.driver.events)
        good = spawn(self.tmp_path, self.channel, "hello")
        assert result(good) == {"welcomed": True}, Path(f"{good.out}.err").read_text()
        wait_until(lambda: any(s.pid == good.pid for s in self.driver.events[said:]), "the worker's hello was heard")

    def close(self) -> None:
        self.channel.close()


class StoreServer(DrivenServer):
    name = "store"
    huge = VALIDATE + frame(Query.SET, struct.pack("<Q", 1 << 30))
    half = VALIDATE[:3]

    def start(self) -> None:
        self.monkeypatch.setattr(store, "VALIDATE_SECONDS", 3600.0)  # only the cap lets a silent client go
        self.agent, self.held = new_store()
        self.agent.listen()
        self.agent.begin_attempt()
        self.cap = kit.pending_cap(2 * self.agent.expected)
        self.address = ("127.0.0.1", self.agent.spec.port)
        self.drive(self.sync, lambda key, mask: self.agent.ready(key.fd, mask, time.monotonic()))

    def sync(self, selector) -> None:
        self.agent.tick(time.monotonic())
        watch(self.agent, selector)

    def serve_legit(self) -> None:
        good = Raw(self.agent.spec.port)
        try:
            good.set(b"/k", b"v")
            assert good.get(b"/k") == b"v"
        finally:
            good.close()

    def close(self) -> None:
        self.agent.close()
        self.agent.changes()
        self.held.close()


class TuneServer(Server):
    """The leading tuner's end of the tune link (``launcher tune`` on nodes started on their own), pumped by a loop of
    its own as the tuner pumps it between two looks at its trial."""

    name = "tune"
    huge = struct.pack("!I", 1 << 30)
    half = struct.pack("!I", 40) + b'{"type": "tune_he'

    def start(self) -> None:
        self.error = None
        self.count_selectors_of(tune_leader)  # the link's selector, made by Followers
        port = free_port()
        self.address = ("127.0.0.1", port)
        self.followers = tune_leader.Followers.bind("127.0.0.1", port, TOKEN)
        self.stopped = threading.Event()
        self.thread = threading.Thread(target=self.run, daemon=True)
        self.thread.start()

    def run(self) -> None:
        try:
            while not self.stopped.is_set():
                self.followers.pump(0.02, lambda *lines: None)
        except Exception as e:  # noqa: BLE001 - the test names it
            self.error = e

    def serve_legit(self) -> None:
        joined = len(self.followers.joined)
        leader = tune_follower.Leader.join("127.0.0.1", self.address[1], TOKEN, "node-b", time.monotonic() + BOUND)
        try:
            wait_until(lambda: len(self.followers.joined) > joined, "a following tuner joined")
        finally:
            leader.close()

    def alive(self) -> bool:
        return self.thread.is_alive() and self.error is None

    def stop(self) -> None:
        self.stopped.set()
        self.thread.join(BOUND)
        self.followers.close()
        assert self.error is None, self.error


SERVERS = [HubServer, GatherServer, RingServer, KeeperServer, MonitorServer, WorkerChannelServer, StoreServer,
           TuneServer]


@pytest.fixture(params=SERVERS, ids=[s.name for s in SERVERS])
def server(request, monkeypatch, tmp_path):
    made = request.param(monkeypatch, tmp_path)
    made.start()
    yield made
    made.stop()


def close_all(socks) -> None:
    for sock in socks:
        sock.close()


# ---------------------------------------------------------------- the attacks


def test_a_client_that_never_speaks_keeps_no_one_out(server):
    silent = server.connect()
    try:
        server.serve_legit()
        if server.holds_silent:
            wait_until(lambda: server.holds(silent), "the ring holds a connection that never spoke")
    finally:
        silent.close()


def test_more_silent_clients_than_the_cap_push_the_oldest_out_and_keep_no_one_out(server):
    crowd = []
    try:
        for _ in range(server.cap + 10):
            crowd.append(server.connect())
        # the oldest is let go (pushed out by the newer ones), while the server holds no more than its cap
        assert closed_by_server(crowd[0], 20.0), f"{server.name} holds more silent connections than its cap"
        if server.holds_silent:
            wait_until(lambda: server.holds(crowd[-1]), "the newest silent connection is held")
        server.serve_legit()
    finally:
        close_all(crowd)


def test_a_thousand_connections_at_once_keep_no_one_out(server):
    crowd = []
    try:
        for _ in range(CROWD):
            crowd.append(server.connect(blocking=False))
        server.serve_legit()
    finally:
        close_all(crowd)


def test_a_hello_that_says_it_is_huge_is_dropped_not_buffered(server):
    assert server.huge_hello_dropped(), f"{server.name} took a hello of 1 GB"
    assert server.alive()
    server.serve_legit()


@pytest.mark.parametrize("after", ["nothing", "half a hello"])
def test_a_closed_half_is_let_go(server, after):
    with server.connect() as sock:
        if after != "nothing" and not server.closes_strangers:
            sock.sendall(server.half or server.huge[:3])
        sock.shutdown(socket.SHUT_WR)
        assert closed_by_server(sock, BOUND), f"{server.name} holds a connection whose peer closed its half"
    server.serve_legit()


def test_out_of_descriptors_the_server_neither_spins_nor_dies_and_accepts_again(server, monkeypatch):
    monkeypatch.setattr(kit, "PAUSE", 5.0)  # real seconds, where the server's clock is real: fewer turns to count
    knocking = server.socket()  # made now: no descriptor is left for it once the table is full
    try:
        with no_descriptor_left():
            server.count_busy(True)
            assert knocking.connect_ex(server.address) == 0  # in the accept queue: the server tries to accept it
            time.sleep(1.0)  # the server meets EMFILE meanwhile (a period to look at, not a timing)
            server.count_busy(False)
        assert server.alive(), f"{server.name} died out of descriptors"
        assert server.busy_turns() <= 3, f"{server.name} spun: {server.busy_turns()} busy turns with no descriptor left"
        server.resume()
        server.serve_legit()
    finally:
        knocking.close()


# ---------------------------------------------------------------- the listener alone, on a fake clock


class Conn:
    """An accepted connection, as far as the listener looks at it."""

    def __init__(self, fd: int) -> None:
        self.fd = fd

    def fileno(self) -> int:
        return self.fd

    def setblocking(self, flag: bool) -> None:
        pass

    def close(self) -> None:
        self.fd = -1


class Queue:
    """A listening socket whose accept queue the test fills (a Conn, or an OSError to raise)."""

    def __init__(self) -> None:
        self.waiting: list = []
        self.closed = False

    def fileno(self) -> int:
        return 3

    def setblocking(self, flag: bool) -> None:
        pass

    def set_inheritable(self, flag: bool) -> None:
        pass

    def listen(self, backlog: int) -> None:
        pass

    def accept(self):
        if not self.waiting:
            raise BlockingIOError()
        got = self.waiting.pop(0)
        if isinstance(got, OSError):
            raise got
        return got, ("127.0.0.1", got.fd)

    def close(self) -> None:
        self.closed = True


def test_past_the_cap_the_oldest_pending_is_pushed_out_and_an_introduced_one_never_is():
    queue = Queue()
    listener = kit.Listener(queue, "test", cap=3)
    queue.waiting = [Conn(fd) for fd in range(10, 13)]
    new, pushed = listener.accept(1.0)
    assert [c.fd for c, _ in new] == [10, 11, 12] and pushed == []
    listener.settled(new[0][0])  # introduced: no longer pending
    queue.waiting = [Conn(13), Conn(14)]
    new2, pushed = listener.accept(2.0)
    assert [c.fd for c, _ in new2] == [13, 14] and [c.fd for c in pushed] == [11]
    # a batch longer than the cap: those the owner never saw are closed by the listener, not handed back
    queue.waiting = [Conn(fd) for fd in range(20, 26)]
    new3, pushed = listener.accept(3.0)
    assert [c.fd for c, _ in new3] == [23, 24, 25] and sorted(c.fd for c in pushed) == [12, 13, 14]
    assert len(listener.pending) == 3


def test_a_connection_already_closed_by_its_owner_is_not_handed_back():
    queue = Queue()
    listener = kit.Listener(queue, "test", cap=1)
    queue.waiting = [Conn(10)]
    (first, _), = listener.accept(1.0)[0]
    first.close()  # the owner closed it and forgot to say so
    queue.waiting = [Conn(11)]
    assert listener.accept(2.0)[1] == []


def test_the_hello_deadline_names_the_overdue_oldest_first_on_the_owners_clock():
    queue = Queue()
    listener = kit.Listener(queue, "test", hello_within=5.0)
    queue.waiting = [Conn(10)]
    listener.accept(100.0)
    queue.waiting = [Conn(11)]
    listener.accept(102.0)
    assert listener.next_deadline() == 105.0
    assert listener.overdue(104.9) == []
    assert [c.fd for c in listener.overdue(105.0)] == [10]
    assert listener.next_deadline() == 107.0
    assert kit.Listener(Queue(), "no deadline").next_deadline() is None


def test_out_of_descriptors_it_pauses_says_so_once_and_accepts_again(caplog):
    caplog.set_level(logging.DEBUG, logger="launcher")
    queue = Queue()
    listener = kit.Listener(queue, "test")
    for _ in range(2):
        queue.waiting = [OSError(errno.EMFILE, "Too many open files"), Conn(10)]
        assert listener.accept(100.0) == ([], [])
        assert listener.registrations(100.0) == {} and listener.next_deadline() == 100.0 + kit.PAUSE
        assert listener.accept(100.0) == ([], [])  # not even tried while it pauses
        assert listener.registrations(100.0 + kit.PAUSE) == {3: selectors.EVENT_READ}
        assert [c.fd for c, _ in listener.accept(100.0 + kit.PAUSE)[0]] == [10]
    warned = [r for r in caplog.records if "cannot accept a connection" in r.getMessage()]
    assert [r.levelname for r in warned] == ["WARNING", "DEBUG"]


def test_any_other_accept_failure_is_no_pause():
    queue = Queue()
    listener = kit.Listener(queue, "test")
    queue.waiting = [ConnectionAbortedError(), OSError(errno.EPROTO, "protocol"), Conn(10)]
    assert listener.accept(1.0) == ([], [])  # the aborted one skipped, the failure ends the batch
    assert listener.registrations(1.0) == {3: selectors.EVENT_READ}
    assert [c.fd for c, _ in listener.accept(1.0)[0]] == [10]


def test_a_selector_kept_by_its_owner_watches_it_while_it_accepts_and_close_lets_go():
    queue = Queue()
    listener = kit.Listener(queue, "test")
    with selectors.DefaultSelector() as selector:
        sock = socket.socket()
        queue.fileno = sock.fileno  # a real descriptor for the selector
        listener.watch_with(selector, 1.0, "data")
        assert selector.get_map()[sock.fileno()].data == "data"
        listener.paused_until = 5.0
        listener.watch_with(selector, 2.0)
        assert sock.fileno() not in selector.get_map()
        listener.watch_with(selector, 5.0)
        listener.close()
        listener.close()
        assert sock.fileno() not in selector.get_map() and queue.closed
        sock.close()


def test_node_0_of_an_elastic_job_lets_go_a_connection_with_no_hello_within_read_timeout(monkeypatch, tmp_path):
    """The keeper's hello deadline is the rendezvous' read_timeout (a joining launcher's own wait for node 0's answer),
    on its clock: a connection still silent then is closed, and a launcher that speaks still joins."""
    server = KeeperServer(monkeypatch, tmp_path)
    server.start()
    try:
        silent = server.connect()
        assert not closed_by_server(silent, 0.5), "closed before its hello's deadline"
        server.harness.clock.advance(server.harness.rendezvous.read_timeout + 1.0)
        server.keeper.waker.put(None)
        assert closed_by_server(silent, 20.0), "a connection with no hello past read_timeout is still held"
        silent.close()
        server.serve_legit()
    finally:
        server.stop()
