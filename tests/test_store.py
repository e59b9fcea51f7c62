"""Node 0's rendezvous store: who serves it (launcher/plan/agent_store.py), the plan's variable, and
the socket side (launcher/run/store.py) against real sockets: well-behaved clients served, hostile
ones let go while the others go on, memory bounded, every attempt from an empty store."""

import dataclasses
import logging
import selectors
import socket
import struct
import threading
import time
from contextlib import contextmanager

import pytest

from launcher import envvars as ev
from launcher.errors import LaunchError
from launcher.plan import agent_store
from launcher.plan.model import HostFacts, Interface, LaunchOptions
from launcher.plan.planner import make_plan
from launcher.run import store
from launcher.run import tcpstore_protocol as protocol
from launcher.run.tcpstore_protocol import Query

PY = "/usr/bin/python3"
TORCH_HOST = HostFacts(gpu_count=None, cpu_count=8, interfaces=(Interface("lo", "127.0.0.1", "255.0.0.0"),),
                       python=PY, run_id="abc", temp_dir="/tmp", importable=frozenset({"torch"}),
                       torch_version="2.13.0+cpu")
TWO_NODES = dict(cluster_node_ips="127.0.0.1,127.0.0.2", started_port=6170, nproc_per_node=2)


def plan(host=TORCH_HOST, env=None, **opts):
    opts.setdefault("training_script", "train.py")
    return make_plan(LaunchOptions(**opts), env or {}, host, lambda ip, n: tuple(range(40000, 40000 + n)))


@pytest.mark.parametrize("choice, nodes, no_python, python, importable, version, used", [
    ("auto", 2, False, PY, {"torch"}, "2.13.0+cpu", True),
    ("auto", 1, False, PY, {"torch"}, "2.13.0+cpu", False),  # one node: every rank starts together
    ("auto", 2, False, PY, {"torch"}, "2.5.0", True),
    ("auto", 2, False, PY, {"torch"}, "2.4.1", False),  # older than the protocol served
    ("auto", 2, False, PY, {"torch"}, None, True),  # no metadata found: torch's own word is the import
    ("auto", 2, False, PY, {"torch", "paddle"}, "2.13.0", False),  # Paddle's rank 0 hosts a store of its own
    ("auto", 2, False, PY, set(), None, False),  # a Paddle-only install
    ("auto", 2, False, "/venv/bin/python", {"torch"}, "2.13.0", False),  # PYTHON_EXEC: not looked into
    ("auto", 2, True, PY, {"torch"}, "2.13.0", False),  # --no_python: not a Python worker
    ("off", 2, False, PY, {"torch"}, "2.13.0", False),
    ("on", 1, False, PY, {"torch", "paddle"}, "2.13.0", True),
    ("on", 1, True, PY, set(), None, True),
    ("on", 2, False, "/venv/bin/python", set(), "1.0", True),
])
def test_who_serves_the_store(choice, nodes, no_python, python, importable, version, used):
    assert agent_store.uses_agent_store(choice, nodes, no_python, python, PY, frozenset(importable), version) is used


def test_on_without_torch_or_with_an_old_torch_is_refused_in_one_sentence():
    with pytest.raises(LaunchError, match=r"^--agent_store on, but the workers' Python \(/usr/bin/python3\) cannot "
                                          r"import torch.*give --agent_store off\.$"):
        agent_store.uses_agent_store("on", 2, False, PY, PY, frozenset())
    with pytest.raises(LaunchError, match=r"^--agent_store on, but the workers' torch 2\.4\.1 is older than 2\.5, "
                                          r"whose store protocol the launcher serves; give --agent_store off\.$"):
        agent_store.uses_agent_store("on", 2, False, PY, PY, frozenset({"torch"}), "2.4.1")
    with pytest.raises(LaunchError, match="is not one of auto, on, off"):
        agent_store.uses_agent_store("maybe", 2, False, PY, PY, frozenset())


@pytest.mark.parametrize("version, old", [("2.4.1", True), ("1.13.1", True), ("2.5.0a0+git1234", False),
                                          ("2.13.0+cpu", False), ("3.0", False), ("", False), ("nightly", False)])
def test_too_old(version, old):
    assert agent_store.too_old(version) is old


def test_node_0_of_two_serves_the_store_on_master_port_and_every_rank_is_told():
    p = plan(node_ip="127.0.0.1", **TWO_NODES)
    assert p.agent_store == agent_store.StoreSpec("127.0.0.1", 6170)
    assert {w.env[ev.ELASTIC_USE_AGENT_STORE] for w in p.workers} == {"True"}
    assert p.workers[0].env[ev.MASTER_PORT] == "6170"


def test_other_nodes_are_told_but_serve_nothing():
    p = plan(node_ip="127.0.0.2", **TWO_NODES)
    assert p.node_rank == 1 and p.agent_store is None
    assert {w.env[ev.ELASTIC_USE_AGENT_STORE] for w in p.workers} == {"True"}


def test_one_node_opt_out_old_torch_and_paddle_jobs_keep_rank_0_hosting():
    for p in (plan(nproc_per_node=3), plan(agent_store="off", node_ip="127.0.0.1", **TWO_NODES),
              plan(host=dataclasses.replace(TORCH_HOST, torch_version="2.3.0"), node_ip="127.0.0.1", **TWO_NODES),
              plan(host=dataclasses.replace(TORCH_HOST, importable=frozenset()), node_ip="127.0.0.1", **TWO_NODES)):
        assert p.agent_store is None
        assert {w.env[ev.ELASTIC_USE_AGENT_STORE] for w in p.workers} == {"False"}


def test_on_serves_on_one_node_too():
    p = plan(agent_store="on", nproc_per_node=3)
    assert p.agent_store == agent_store.StoreSpec("127.0.0.1", 40000)


def test_parameter_server_mode_serves_no_store():
    p = plan(server_num=1, worker_num=1)
    assert p.agent_store is None and all(ev.ELASTIC_USE_AGENT_STORE not in w.env for w in p.workers)


def test_the_torch_version_is_read_from_its_metadata_without_importing_it():
    import subprocess
    import sys

    code = ("import sys; from launcher.host import preflight; v = preflight.installed_version('torch'); "
            "print(v, 'torch' in sys.modules, preflight.installed_version('no_such_package_here'))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    torch_dist = pytest.importorskip("importlib.metadata").version("torch")
    assert out == [torch_dist, "False", "None"]


# ---------------------------------------------------------------- the socket side (launcher.run.store)


def new_store():
    """An AgentStore on a free loopback port, and the socket that holds the port."""
    held = socket.socket()
    held.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    held.bind(("127.0.0.1", 0))
    return store.AgentStore(agent_store.StoreSpec("127.0.0.1", held.getsockname()[1]), [held]), held


def watch(agent, selector) -> None:
    """``selector`` told what the store's ``changes`` say, as the launcher's event loop is."""
    for fd, events in agent.changes():
        key = selector.get_map().get(fd)
        if not events:
            if key is not None:
                selector.unregister(fd)
        elif key is not None:
            selector.modify(fd, events)
        else:
            selector.register(fd, events)


@contextmanager
def served(limit_s=60.0, **attrs):
    """An AgentStore on a free loopback port, served by a loop like the launcher's in a thread: its port."""
    agent, held = new_store()
    for name, value in attrs.items():
        setattr(agent, name, value)
    agent.listen()
    agent.begin_attempt()
    selector, stop = selectors.DefaultSelector(), threading.Event()
    lock = threading.Lock()  # the test calls begin_attempt() between turns

    def serve():
        deadline = time.monotonic() + limit_s
        while not stop.is_set() and time.monotonic() < deadline:
            with lock:
                watch(agent, selector)
            for key, mask in selector.select(0.05):
                with lock:
                    agent.ready(key.fd, mask, time.monotonic())
            with lock:
                agent.tick(time.monotonic())

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    agent.lock = lock
    try:
        yield agent
    finally:
        stop.set()
        thread.join(10)
        agent.close()
        held.close()
        selector.close()


def frame(query, *parts) -> bytes:
    return bytes([query]) + b"".join(parts)


def sized(b: bytes) -> bytes:
    return struct.pack("<Q", len(b)) + b


VALIDATE = frame(Query.VALIDATE, struct.pack("<I", protocol.MAGIC))


def closed_by_server(sock, timeout) -> bool:
    """Whether the server closed ``sock`` (end of stream or reset) within ``timeout``; what it sent is read and dropped."""
    sock.settimeout(timeout)
    try:
        while sock.recv(65536):
            pass
        return True
    except (ConnectionResetError, BrokenPipeError):
        return True
    except socket.timeout:
        return False


class Raw:
    """A client on a plain socket, writing what torch's client writes."""

    def __init__(self, port, validate=True):
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=10)
        if validate:
            self.sock.sendall(VALIDATE)

    def recv_exactly(self, n):
        data = b""
        while len(data) < n:
            chunk = self.sock.recv(n - len(data))
            if not chunk:
                raise ConnectionError("closed")
            data += chunk
        return data

    def set(self, key, value):
        self.sock.sendall(frame(Query.SET, sized(key), sized(value)))

    def get(self, key):
        self.sock.sendall(frame(Query.GET, sized(key)))
        return self.recv_exactly(struct.unpack("<Q", self.recv_exactly(8))[0])

    def ping(self, nonce=1234):
        self.sock.sendall(frame(Query.PING, struct.pack("<I", nonce)))
        return struct.unpack("<I", self.recv_exactly(4))[0]

    def closed_by_store(self, timeout=10):
        """Whether the store closed this connection (within ``timeout``)."""
        return closed_by_server(self.sock, timeout)

    def close(self):
        self.sock.close()


def test_without_a_store_nothing_is_done():
    agent = store.AgentStore(None, ())
    agent.listen()
    agent.begin_attempt()
    assert agent.changes() == [] and agent.next_deadline() is None
    agent.tick(0.0)
    agent.close()


def test_the_reserved_socket_is_the_one_listened_on_and_kept():
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        port = held.getsockname()[1]
        agent = store.AgentStore(agent_store.StoreSpec("127.0.0.1", port), [held])
        agent.listen()
        assert agent.listener.sock is held
        with socket.create_connection(("127.0.0.1", port), timeout=5):  # queued, not refused
            pass
        agent.close()
        assert held.fileno() != -1  # the launch closes what it reserved


def test_a_port_in_use_is_refused_in_one_sentence():
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        agent = store.AgentStore(agent_store.StoreSpec("127.0.0.1", port), [])
        with pytest.raises(LaunchError, match=rf"^port {port} on 127.0.0.1, the rendezvous store's \(MASTER_PORT\), "
                                              r"cannot be listened on \(.*\); stop the program holding it, or "
                                              r"choose another --started_port \(--master_port\)\.$"):
            agent.listen()


def test_a_client_is_served_and_answers_come_in_order():
    with served() as agent:
        c = Raw(agent.spec.port)
        assert c.ping(99) == 99
        c.set(b"/k", b"v" * 100_000)
        assert c.get(b"/k") == b"v" * 100_000 and c.get(b"/none") == b""
        c.close()


@pytest.mark.parametrize("bad", [
    b"GET / HTTP/1.1\r\nHost: x\r\n\r\n",
    frame(Query.GET, sized(b"/k")),  # no VALIDATE first
    VALIDATE + frame(Query.SET, struct.pack("<Q", 2 ** 63)),
    VALIDATE + frame(Query.WAIT, struct.pack("<Q", 2 ** 63)),
    VALIDATE + bytes([200]),
    VALIDATE + VALIDATE,
    VALIDATE + frame(Query.SET, sized(b"/n"), sized(b"text")) + frame(Query.ADD, sized(b"/n"), struct.pack("<q", 1)),
])
def test_a_bad_client_is_let_go_and_the_others_go_on(bad, caplog):
    caplog.set_level(logging.DEBUG, logger="launcher")
    with served() as agent:
        good = Raw(agent.spec.port)
        good.set(b"/before", b"1")
        hostile = Raw(agent.spec.port, validate=False)
        hostile.sock.sendall(bad)
        assert hostile.closed_by_store()
        assert good.get(b"/before") == b"1" and good.ping() == 1234
        hostile.close()
        good.close()
    assert any("rendezvous store: the connection from 127.0.0.1:" in r.getMessage() and r.levelno == logging.DEBUG
               for r in caplog.records)


def test_a_truncated_request_then_silence_holds_nothing_up():
    with served() as agent:
        hostile = Raw(agent.spec.port)
        hostile.sock.sendall(frame(Query.SET, sized(b"/k"), struct.pack("<Q", 1000), b"only part"))
        good = Raw(agent.spec.port)
        good.set(b"/a", b"1")
        assert good.get(b"/a") == b"1"
        assert not hostile.closed_by_store(timeout=0.3)  # it may yet send the rest, as torch's clients may
        hostile.close()
        good.close()


def test_a_client_that_never_validates_is_let_go_after_a_while():
    """On a fake clock: the store knows the time only from the ``now`` its loop gives it. A connection that
    has not validated is let go VALIDATE_SECONDS after it came, not before; a validated one never is."""
    import select

    agent, held = new_store()
    agent.listen()
    agent.begin_attempt()
    selector = selectors.DefaultSelector()

    def turn(now, until=lambda: True):
        """Turns of the launcher's loop at ``now``, at least one, until ``until()`` (120 s: a hang guard)."""
        deadline = time.monotonic() + 120
        while True:
            watch(agent, selector)
            for key, mask in selector.select(0.02):
                agent.ready(key.fd, mask, now)
            agent.tick(now)
            if until():
                return
            assert time.monotonic() < deadline, "the store's loop never got there"

    came = 1000.0
    silent = Raw(agent.spec.port, validate=False)
    validated = Raw(agent.spec.port)
    try:
        turn(came, until=lambda: len(agent.clients) == 2 and len(agent.listener.pending) == 1)
        assert agent.next_deadline() == came + store.VALIDATE_SECONDS
        turn(came + store.VALIDATE_SECONDS - 0.01)
        assert len(agent.clients) == 2  # not before its time
        turn(came + store.VALIDATE_SECONDS)
        assert len(agent.clients) == 1 and not agent.listener.pending
        turn(came + store.VALIDATE_SECONDS)  # the loop lets go of the socket: closed
        assert silent.closed_by_store(timeout=120)
        later = came + 100 * store.VALIDATE_SECONDS
        turn(later)
        assert len(agent.clients) == 1  # a validated client is never timed out
        validated.sock.sendall(frame(Query.PING, struct.pack("<I", 1234)))
        turn(later, until=lambda: select.select([validated.sock], [], [], 0)[0])
        assert struct.unpack("<I", validated.recv_exactly(4))[0] == 1234
    finally:
        silent.close()
        validated.close()
        agent.close()
        agent.changes()
        held.close()
        selector.close()


def test_a_client_that_never_reads_its_answers_is_bounded_and_blocks_no_one():
    with served() as agent:
        writer = Raw(agent.spec.port)
        writer.set(b"/big", b"x" * (4 << 20))
        writer.get(b"/none")  # the set is in
        reader_that_never_reads = Raw(agent.spec.port)
        reader_that_never_reads.sock.setblocking(False)
        asked = 0
        deadline = time.monotonic() + 20
        try:
            while time.monotonic() < deadline and asked < 400:  # 1.6 GiB of answers, were they all made
                reader_that_never_reads.sock.send(frame(Query.GET, sized(b"/big")))
                asked += 1
        except BlockingIOError:
            pass  # the store stopped reading it: its requests pile up in the kernel
        time.sleep(0.5)
        assert writer.ping() == 1234 and writer.get(b"/none") == b""
        with agent.lock:
            held = sum(c.held() for c in agent.clients.values())
        assert held <= store.OUT_PAUSE + (4 << 20) + protocol.MAX_FRAME
        reader_that_never_reads.close()
        writer.close()


def test_thousands_of_connections_leave_the_store_serving(caplog):
    with served() as agent:
        crowd = []
        for i in range(2000):
            c = Raw(agent.spec.port, validate=i % 2 == 0)
            crowd.append(c)
        good = Raw(agent.spec.port)
        good.set(b"/k", b"v")
        assert good.get(b"/k") == b"v"
        for c in crowd:
            c.close()
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and len(agent.clients) > 1:
            time.sleep(0.05)
        assert len(agent.clients) == 1 and good.ping() == 1234
        good.close()


def test_beyond_its_open_files_the_store_closes_new_connections_with_a_warning(caplog):
    with served() as agent:
        with agent.lock:
            agent.max_clients = 2
        first, second = Raw(agent.spec.port), Raw(agent.spec.port)
        assert first.ping() == second.ping() == 1234
        third = Raw(agent.spec.port)
        assert third.closed_by_store()
        assert first.ping() == 1234
        for c in (first, second, third):
            c.close()
    assert any("holds 2 connections, as many as its open files allow" in r.getMessage() and
               r.levelno == logging.WARNING for r in caplog.records)


def test_a_client_that_would_pass_the_stores_limit_is_let_go_with_a_warning_naming_it(monkeypatch, caplog):
    monkeypatch.setattr(store, "STORE_LIMIT", 1 << 20)
    with served() as agent:
        good, greedy = Raw(agent.spec.port), Raw(agent.spec.port)
        good.set(b"/small", b"1")
        peer = "%s:%d" % greedy.sock.getsockname()
        for i in range(10):
            try:
                greedy.set(b"/big%d" % i, b"x" * 200_000)
            except (ConnectionResetError, BrokenPipeError):  # let go of while it still sends: the store closed it
                break
        assert greedy.closed_by_store()
        assert good.get(b"/small") == b"1"
        good.close()
        greedy.close()
    assert [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING] == [
        f"the rendezvous store on 127.0.0.1:{agent.spec.port} let go of the connection from {peer}: the store "
        f"would hold over {1 << 20} bytes of keys and values"]


def test_each_attempt_starts_from_an_empty_store_and_lets_go_of_the_clients_before():
    with served() as agent:
        old = Raw(agent.spec.port)
        old.set(b"/k", b"attempt 0")
        assert old.get(b"/k") == b"attempt 0"
        with agent.lock:
            agent.begin_attempt()
        assert old.closed_by_store()
        new = Raw(agent.spec.port)
        assert new.get(b"/k") == b""
        old.close()
        new.close()


def test_a_waiter_is_woken_by_another_client_and_a_client_gone_is_forgotten():
    with served() as agent:
        waiter, gone, setter = Raw(agent.spec.port), Raw(agent.spec.port), Raw(agent.spec.port)
        for c in (waiter, gone):
            c.sock.sendall(frame(Query.WAIT, struct.pack("<Q", 1), sized(b"/x")))
        assert not waiter.closed_by_store(timeout=0.3)  # nothing comes until /x is set
        gone.close()
        setter.set(b"/x", b"1")
        assert setter.ping() == 1234
        waiter.sock.settimeout(10)
        assert waiter.recv_exactly(1) == protocol.STOP_WAITING
        waiter.close()
        setter.close()


def accepted_client(agent, port):
    """A connection to the store, accepted by it (as a worker of another node holds one)."""
    client = socket.create_connection(("127.0.0.1", port))
    for _ in range(200):
        agent.ready(agent.listener.fileno(), selectors.EVENT_READ, time.monotonic())
        if agent.clients:
            return client
        time.sleep(0.01)
    raise AssertionError("the store accepted no connection")


def client_fd(agent) -> int:
    (fd,) = agent.clients
    return fd


@contextmanager
def listening_store():
    agent, held = new_store()
    agent.listen()
    agent.begin_attempt()
    try:
        yield agent, held.getsockname()[1]
    finally:
        agent.close()
        held.close()


def test_a_job_that_ended_well_serves_the_connections_still_open_until_they_close():
    """Node 0 ends without waiting for a node not yet joined, whose workers may still use its store (a launcher slow
    to reach node 0): the store serves them until they let go."""
    with listening_store() as (agent, port):
        client = accepted_client(agent, port)
        threading.Timer(0.3, client.close).start()  # the worker ends
        agent.drain(120)  # returns once it closed: the bound is far
        assert not agent.clients


def test_the_drain_is_bounded_and_needs_nothing_when_no_one_is_connected():
    store.AgentStore(None, ()).drain(1e9)  # no store: nothing to wait for
    with listening_store() as (agent, port):
        agent.drain(1e9)  # nobody connected
        stranger = accepted_client(agent, port)  # connected, never validated: no worker's
        agent.drain(1e9, clock=lambda: 0.0)  # let go at once: the clock never moves, the drain did not wait
        assert not agent.clients and stranger.recv(1) == b""
        client = accepted_client(agent, port)
        client.sendall(VALIDATE)
        for _ in range(200):
            agent.ready(client_fd(agent), selectors.EVENT_READ, time.monotonic())
            if all(c.input.validated for c in agent.clients.values()):
                break
            time.sleep(0.01)
        ticks = iter(range(0, 10_000))
        agent.drain(5, clock=lambda: next(ticks))  # a worker that never lets go: served up to the bound only
        assert agent.clients
        client.close()
