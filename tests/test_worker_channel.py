"""The local channel between the launcher and its workers, tested as an adversary would use it.

- ``launcher.run.worker_channel.WorkerChannel`` (the launcher's end), driven here by a selector loop as the
  launcher's event loop drives it: the happy path (hello, stop, round), a wrong key, hostile lines, a worker that
  never reads, processes that are not the launcher's children (a thread, a grandchild, an adopted orphan);
  each time the server must never raise and must go on serving a well-behaved worker;
- ``launcher.runtime.channel.Channel.connect`` (the worker's end) against fake launchers that cannot prove the key;
- ``launcher.local_channel``: ``decode`` on hostile bytes, and the one-way ``proof``/``proven``.

Clients that must pass the parent-pid check are children of this process (``python -c CHILD mode``); each
writes what it saw as one JSON line to its stdout file.
"""

import ctypes
import json
import os
import random
import secrets
import selectors
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from launcher import envvars as ev
from launcher import local_channel as lc
from launcher.run.worker_channel import HELLO_WITHIN, OUT_LIMIT, Said, WorkerChannel

REPO = Path(__file__).resolve().parent.parent
WAIT = 30  # seconds: the bound of every wait on a child

CHILD = r"""
import json, os, socket, subprocess, sys, time
from launcher import local_channel as lc

def connect():
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(30)
    s.connect(lc.address(os.environ["LAUNCHER_CONTROL_SOCKET"]))
    return s, s.makefile("rb")

def hello(s, f):  # the worker's handshake by hand: True once the launcher proved the key back
    challenge = lc.decode(f.readline())
    if not challenge:
        return False
    key, nonce = os.environ["LAUNCHER_CONTROL_KEY"], lc.new_secret()
    s.sendall(lc.encode({"t": "hello", "nonce": nonce, "pid": os.getpid(), "keep": False,
                         "proof": lc.proof(key, "worker", nonce, challenge["nonce"])}))
    welcome = lc.decode(f.readline()) or {}
    return lc.proven(key, "launcher", welcome.get("proof"), nonce, challenge["nonce"])

def again(mode, *args):
    return [sys.executable, "-c", os.environ["TEST_CHILD"], mode, *args]

mode, out = sys.argv[1], {}
if mode == "worker":  # the real worker's end
    from launcher.runtime.elastic import Channel
    ch = Channel.connect(os.environ, keep=True)
    out["connected"] = ch is not None
    if ch is not None:
        out["stopped"] = ch.round_over(20)
        with ch.changed:
            ch.changed.wait_for(lambda: ch.rounds or ch.gone, 20)
        out["rounds"] = [env for env, _ in ch.rounds]
elif mode == "hello":
    out["welcomed"] = hello(*connect())
elif mode == "mute":  # proves the key, then never reads again until its stdin closes
    conn = connect()
    out["welcomed"] = hello(*conn)
    print(json.dumps(out), flush=True)
    sys.stdin.read()
elif mode == "raw":  # sends the bytes of a file instead of its hello; did the launcher close the connection?
    s, f = connect()
    f.readline()
    try:
        s.sendall(open(sys.argv[2], "rb").read())
        out["closed"] = s.recv(1) == b""
    except OSError:
        out["closed"] = True
elif mode == "silent":  # takes the challenge, then says nothing: is it let go?
    s, f = connect()
    f.readline()
    out["closed"] = s.recv(1) == b""
elif mode == "grandchild":  # its own child says hello
    subprocess.run(again("hello"), timeout=30)
    sys.exit(0)
elif mode == "orphan":  # its child says hello once orphaned (adopted by the nearest subreaper)
    print(json.dumps({"orphan": subprocess.Popen(again("orphaned", str(os.getpid()))).pid}), flush=True)
    os._exit(0)
elif mode == "orphaned":
    deadline = time.monotonic() + 30
    while os.getppid() == int(sys.argv[2]) and time.monotonic() < deadline:
        time.sleep(0.01)
    out["welcomed"] = hello(*connect())
print(json.dumps(out), flush=True)
"""


# ---------------------------------------------------------------- helpers


@pytest.fixture
def server():
    spawned: set = set()  # the test's workers: the children ``spawn`` started
    channel = WorkerChannel("test", lambda: {"round": 3, "reform_wait": 1.5}, lambda pid: pid in spawned)
    channel.spawned = spawned
    channel.listen()
    assert channel.listener is not None
    yield channel
    channel.close()


def pump(server, until, seconds=2 * WAIT) -> list:
    """Run the server's turns, as the launcher's event loop does, until ``until(said)`` holds; every Said."""
    said, deadline = [], time.monotonic() + seconds
    while not until(said):
        assert time.monotonic() < deadline, f"not in {seconds} s; said so far: {said}"
        with selectors.DefaultSelector() as selector:  # afresh each turn: a closed number may be taken again
            for fd, events in server.registrations().items():
                selector.register(fd, events)
            for key, mask in selector.select(0.02):
                said += server.ready(key.fd, mask)
    return said


def spawn(tmp_path, server, mode, *args, env=None, **popen) -> subprocess.Popen:
    """A child of this process running ``CHILD`` in ``mode``, given the server's channel (or ``env``'s)."""
    out = tmp_path / f"{mode}-{secrets.token_hex(4)}"
    env = {**os.environ, "PYTHONPATH": str(REPO), "TEST_CHILD": CHILD, **(server.env() if env is None else env)}
    with open(f"{out}.out", "w") as stdout, open(f"{out}.err", "w") as stderr:
        proc = subprocess.Popen([sys.executable, "-c", CHILD, mode, *args], env=env, cwd=REPO,
                                stdout=stdout, stderr=stderr, **popen)
    getattr(server, "spawned", set()).add(proc.pid)
    proc.out = out
    return proc


def result(proc) -> dict:
    """The child's last JSON line, once it ended."""
    proc.wait(timeout=WAIT)
    lines = Path(f"{proc.out}.out").read_text().splitlines()
    assert lines, f"no result; stderr: {Path(f'{proc.out}.err').read_text()}"
    return json.loads(lines[-1])


def exited(proc):
    return lambda said: proc.poll() is not None


def assert_serves(server, tmp_path) -> None:
    """A well-behaved worker still gets in."""
    good = spawn(tmp_path, server, "hello")
    said = pump(server, exited(good))
    assert result(good) == {"welcomed": True}
    assert [s.pid for s in said] == [good.pid] and said[0].message["t"] == "hello"


def fake_launcher(behaviour: str) -> tuple:
    """A launcher that knows the right key's name but proves it as ``behaviour`` says; (env, thread)."""
    key, name = lc.new_secret(), f"@test-fake-{secrets.token_hex(8)}"
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(lc.address(name))
    listener.listen(1)
    listener.settimeout(WAIT)

    def serve():  # one worker: challenge, its hello (if any), the welcome, then the line is closed
        with listener, listener.accept()[0] as conn, conn.makefile("rb") as f:
            conn.settimeout(WAIT)
            nonce = "\ud800" if behaviour == "surrogate-nonce" else lc.new_secret()
            conn.sendall(lc.encode({"t": lc.CHALLENGE, "nonce": nonce}))
            hello = lc.decode(f.readline()) or {}
            if not hello:
                return
            theirs = hello.get("nonce", "")
            proof = {"right-key": lc.proof(key, "launcher", nonce, theirs),
                     "wrong-key": lc.proof(lc.new_secret(), "launcher", nonce, theirs),
                     "reflected": hello.get("proof"),  # the worker's own proof handed back
                     "non-ascii-proof": "\u00e9" * 64}.get(behaviour, "")
            conn.sendall(lc.encode({"t": lc.WELCOME, "proof": proof, "round": 0}))

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    return {ev.CONTROL_SOCKET: name, ev.CONTROL_KEY: key}, thread


# ---------------------------------------------------------------- the launcher's end


def test_a_worker_says_hello_and_hears_stop_then_round(server, tmp_path):
    worker = spawn(tmp_path, server, "worker")
    said = pump(server, lambda said: said)
    assert said == [Said(worker.pid, said[0].message)]
    assert said[0].message["t"] == "hello" and said[0].message["keep"] is True
    assert server.connected(worker.pid)
    assert server.send(worker.pid, {"t": "stop", "reason": "a node left"})
    assert server.send(worker.pid, {"t": "round", "env": {"RANK": "1", "WORLD_SIZE": "2"}})
    pump(server, exited(worker))
    assert result(worker) == {"connected": True, "stopped": True, "rounds": [{"RANK": "1", "WORLD_SIZE": "2"}]}


def test_a_round_longer_than_max_line_reaches_the_worker(server, tmp_path):
    """A legal environment (240 kB of non-ASCII values) is over 1 MiB as a JSON line."""
    worker = spawn(tmp_path, server, "worker")
    pump(server, lambda said: said)
    big = {f"V{i}": "\u00e9" * 60000 for i in range(4)}
    assert len(lc.encode({"t": "round", "env": big})) > lc.MAX_LINE
    server.send(worker.pid, {"t": "stop", "reason": "a node left"})
    server.send(worker.pid, {"t": "round", "env": big})
    server.send(worker.pid, {"t": "round", "env": {"SMALL": "1"}})
    pump(server, exited(worker))
    assert result(worker)["rounds"][0] == big


def test_a_wrong_key_is_dropped_without_a_word(server, tmp_path):
    worker = spawn(tmp_path, server, "worker", env={**server.env(), ev.CONTROL_KEY: lc.new_secret()})
    said = pump(server, exited(worker))
    assert said == [] and server.connections == {} and not server.connected(worker.pid)
    assert result(worker) == {"connected": False}
    assert_serves(server, tmp_path)


HOSTILE = {
    "not-json": b"hello there\n",
    "invalid-utf8": b"\xff\xfe\xfd\x80\n",
    "json-array": b"[1,2,3]\n",
    "deeply-nested": b"[" * 100000 + b"\n",
    "longer-than-max-line": b"x" * (lc.MAX_LINE + 10),
    "hello-not-a-dict": b'["hello"]\n',
    "type-not-a-string": b'{"t":5}\n',
    "non-string-nonce": b'{"t":"hello","nonce":5,"proof":"00"}\n',
    "nonce-too-long": b'{"t":"hello","nonce":"' + b"a" * 200 + b'","proof":"00"}\n',
    "out-of-turn": b'{"t":"parked"}\n',
    "non-ascii-proof": b'{"t":"hello","nonce":"abc","proof":"\\u00e9"}\n',
    "lone-surrogate-nonce": b'{"t":"hello","nonce":"\\ud800","proof":"00"}\n',
}


@pytest.mark.parametrize("payload", HOSTILE.values(), ids=HOSTILE.keys())
def test_a_hostile_line_drops_only_that_connection(server, tmp_path, payload):
    (tmp_path / "payload").write_bytes(payload)
    raw = spawn(tmp_path, server, "raw", str(tmp_path / "payload"))
    said = pump(server, exited(raw))
    assert said == [] and server.connections == {}
    assert result(raw) == {"closed": True}
    assert_serves(server, tmp_path)


def test_a_worker_that_never_reads_is_let_go_without_blocking(server, tmp_path):
    mute = spawn(tmp_path, server, "mute", stdin=subprocess.PIPE)
    pump(server, lambda said: said)
    message = {"t": "round", "env": {"X": "y" * (1 << 20)}}
    sent = [server.send(mute.pid, message) for _ in range(2 * OUT_LIMIT // len(lc.encode(message)))]
    assert sent[0] and not sent[-1] and not server.connected(mute.pid) and server.connections == {}
    assert_serves(server, tmp_path)
    mute.stdin.close()
    assert result(mute) == {"welcomed": True}


def test_a_worker_that_says_no_hello_is_let_go_at_its_deadline(tmp_path):
    """A worker's connection that never says hello does not stay pending: the listener's hello deadline (fake clock)."""
    now = [1000.0]
    spawned: set = set()
    server = WorkerChannel("test", lambda: {"round": 1}, lambda pid: pid in spawned, clock=lambda: now[0])
    server.spawned = spawned
    server.listen()
    try:
        silent = spawn(tmp_path, server, "silent")
        pump(server, lambda said: server.connections)  # connected: challenged, pending
        server.tick(now[0] + HELLO_WITHIN / 2)
        assert server.connections and silent.poll() is None
        now[0] += HELLO_WITHIN
        server.tick(now[0])
        assert not server.connections and result(silent) == {"closed": True}
        assert_serves(server, tmp_path)
    finally:
        server.close()


def test_a_thread_of_this_process_is_refused(server):
    got = []
    thread = threading.Thread(target=lambda: got.append(_connect_and_read(server.name)), daemon=True)
    thread.start()
    pump(server, lambda said: not thread.is_alive())
    assert got == [b""] and server.connections == {}


def _connect_and_read(name: str) -> bytes:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.settimeout(WAIT)
        s.connect(lc.address(name))
        return s.recv(1024)


def test_a_grandchild_is_refused(server, tmp_path):
    parent = spawn(tmp_path, server, "grandchild")
    said = pump(server, exited(parent))
    assert said == [] and server.connections == {}
    assert result(parent) == {"welcomed": False}
    assert_serves(server, tmp_path)


def test_an_orphan_adopted_by_a_subreaper_launcher_is_refused(server, tmp_path):
    """The launcher is its job's subreaper (``Session``: ``adopt_orphans``): a worker's child orphaned becomes its
    child, though it is no worker (the class's docstring: "their children, a data loader's, may not")."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(36, 1, 0, 0, 0)  # PR_SET_CHILD_SUBREAPER
    try:
        parent = spawn(tmp_path, server, "orphan")
        parent.wait(timeout=WAIT)
        orphan = json.loads(Path(f"{parent.out}.out").read_text().splitlines()[0])["orphan"]
        said = pump(server, lambda said: os.waitpid(orphan, os.WNOHANG)[0] == orphan)
    finally:
        libc.prctl(36, 0, 0, 0, 0)
    assert said == [] and result(parent) == {"welcomed": False}


def test_close_twice_and_unknown_descriptors_are_harmless(server):
    assert server.ready(10**6, selectors.EVENT_READ | selectors.EVENT_WRITE) == []
    assert not server.send(12345, {"t": "stop"}) and not server.connected(12345)
    server.forget(12345)
    server.close()
    server.close()
    assert server.registrations() == {} and server.env() == {}
    assert server.ready(10**6, selectors.EVENT_READ) == []


# ---------------------------------------------------------------- the worker's end


@pytest.mark.parametrize("behaviour", ["wrong-key", "reflected", "non-ascii-proof", "surrogate-nonce"])
def test_a_worker_never_accepts_a_launcher_that_cannot_prove_the_key(behaviour):
    elastic = pytest.importorskip("launcher.runtime.elastic")
    env, thread = fake_launcher(behaviour)
    assert elastic.Channel.connect(env, keep=True) is None
    thread.join(WAIT)


def test_a_worker_accepts_the_fake_launcher_that_proves_the_key():
    """The fake launcher above fails only where it is told to."""
    elastic = pytest.importorskip("launcher.runtime.elastic")
    env, thread = fake_launcher("right-key")
    channel = elastic.Channel.connect(env, keep=True)
    assert channel is not None and channel.reform_wait == 0
    thread.join(WAIT)
    with channel.changed:  # the fake launcher closed the line: the worker sees it gone
        assert channel.changed.wait_for(lambda: channel.gone, WAIT)
    channel.sock.close()


# ---------------------------------------------------------------- the protocol


@pytest.mark.parametrize("line", [
    b"", b"\n", b"\x00" * 64, bytes(range(256)), random.Random(0).randbytes(4096), b"\xef\xbb\xbf", b"\x00\x00\x00{",
    b"9" * 100000, b"1e99999", b'{"t":"a","n":' + b"9" * 100000 + b"}", b"[" * 100000, b'{"t":' * 100000,
    b"[" * 100000 + b"]" * 100000, b"NaN", b'{"t":null}', b'"' + b"\\" * 1001 + b'"', b"{" + b" " * (lc.MAX_LINE + 1),
], ids=lambda line: f"{line[:12]!r}-{len(line)}")
def test_decode_never_raises(line):
    assert lc.decode(line) is None


def test_decode_takes_a_message():
    assert lc.decode(b'{"t":"parked","round":2}') == {"t": "parked", "round": 2}


def test_proofs_are_one_way():
    key, launcher_nonce, worker_nonce = lc.new_secret(), lc.new_secret(), lc.new_secret()
    by_worker = lc.proof(key, "worker", worker_nonce, launcher_nonce)
    by_launcher = lc.proof(key, "launcher", launcher_nonce, worker_nonce)
    assert lc.proven(key, "worker", by_worker, launcher_nonce, worker_nonce)
    assert lc.proven(key, "launcher", by_launcher, worker_nonce, launcher_nonce)
    assert not lc.proven(key, "launcher", by_worker, worker_nonce, launcher_nonce)
    assert not lc.proven(key, "launcher", by_worker, launcher_nonce, worker_nonce)
    assert not lc.proven(key, "worker", by_launcher, launcher_nonce, worker_nonce)
    assert not lc.proven(key, "worker", by_launcher, worker_nonce, launcher_nonce)
    same = lc.new_secret()  # not even when both nonces are the same
    assert lc.proof(key, "worker", same, same) != lc.proof(key, "launcher", same, same)
    assert not lc.proven(lc.new_secret(), "worker", by_worker, launcher_nonce, worker_nonce)
