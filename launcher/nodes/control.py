"""The control channel between the launchers of one job, so that they act as one.

Node 0's launcher listens on the control port (``--control_port``, default: the first worker
port minus one); every other node's launcher connects to it, retrying until the join timeout.
Single-node jobs open no port. Everything is non-blocking and driven by the launcher's selector:
each socket is one more descriptor in its event loop, and the launcher never imports torch.

Wire format: messages are JSON objects, each preceded by its length (4 bytes, big endian), at
most ``MAX_MESSAGE`` bytes. A connection that sends anything else (junk, an oversized or
malformed message, a wrong job, a wrong token, a second connection for a node already joined,
nothing at all for ``HELLO_TIMEOUT`` seconds) is dropped and logged; it never stops the job.

Handshake: node 0 sends ``challenge`` with a random nonce; the peer answers ``hello`` with the
job's identity (job id, node list, ports, script), its node index, a nonce of its own and, when a
job token is set (``LAUNCHER_JOB_TOKEN``), HMAC-SHA256(token, nonce + job id + node) as proof;
node 0 answers ``welcome`` (or ``refused``, with the reason). With a token, authentication is
mutual: the welcome (and a refusal) proves the token on the peer's nonce, a node obeys no node 0
that does not prove it (it tries again until the join timeout), and every message after the
welcome is sealed in a ``Session`` bound to both nonces. Then both sides send ``beat`` every
``heartbeat_timeout / 6`` seconds; silence for ``heartbeat_timeout`` seconds (or TCP's own
keep-alive giving up) means the peer is lost.
"""

from __future__ import annotations

import errno
import hashlib
import hmac
import json
import os
import secrets
import selectors
import socket
import struct
import time
from dataclasses import dataclass, field
from typing import Optional

from launcher.output.messages import log
from launcher.plan.policy import one_line

MAX_MESSAGE = 64 * 1024
HELLO_TIMEOUT = 5.0
MAX_PENDING = 64  # connections not yet introduced; more are closed at once
RETRY_EVERY = 0.2  # a node that cannot reach node 0 yet tries again this often
RETRY_REFUSED = 1.0  # ... and after a refusal that does not prove the job token
TOKEN_VAR = "LAUNCHER_JOB_TOKEN"
LISTED_NODES = 256  # a job of more nodes names them in its hello by their digest
_LENGTH = struct.Struct("!I")


class ProtocolError(Exception):
    pass


def encode(message: dict, session: Optional["Session"] = None) -> bytes:
    body = json.dumps(message, separators=(",", ":")).encode()
    if session is not None:
        body = session.seal(body)
    if len(body) > MAX_MESSAGE:
        raise ValueError(f"control message of {len(body)} bytes is over {MAX_MESSAGE}")
    return _LENGTH.pack(len(body)) + body


MAX_DEPTH = 8  # nesting of lists and objects in a message; the deepest real one has 3
MAX_DIGITS = 20  # of an integer in a message: no field takes a bigger one


def _number(text: str):
    """json's parse_float and parse_int: finite numbers of sensible size only."""
    value = float(text) if any(c in text for c in ".eE") else int(text) if len(text.lstrip("-")) <= MAX_DIGITS else None
    if value is None or value != value or value in (float("inf"), float("-inf")):
        raise ValueError(f"the number {text[:40]}")
    return value


def _refuse_constant(name: str):
    raise ValueError(f"the constant {name}")


def _check_tree(value, depth: int = 0) -> None:
    """ProtocolError for nesting deeper than MAX_DEPTH; UnicodeError for text with lone surrogates."""
    if depth > MAX_DEPTH:
        raise ProtocolError(f"a message nested deeper than {MAX_DEPTH}")
    if isinstance(value, str):
        value.encode()
    elif isinstance(value, dict):
        for key, item in value.items():
            key.encode()
            _check_tree(item, depth + 1)
    elif isinstance(value, list):
        for item in value:
            _check_tree(item, depth + 1)


def decode(body: bytes) -> dict:
    """One message from its body; ProtocolError for anything else. Nothing a peer sends raises
    another exception: nesting, numbers and text are bounded before a handler sees them."""
    try:
        message = json.loads(body.decode(), parse_float=_number, parse_int=_number, parse_constant=_refuse_constant)
        _check_tree(message)
    except RecursionError:
        raise ProtocolError(f"a message nested deeper than {MAX_DEPTH}") from None
    except (UnicodeError, ValueError):
        raise ProtocolError("a message that is not JSON") from None
    if not isinstance(message, dict) or not isinstance(message.get("type"), str):
        raise ProtocolError("a message without a type")
    return message


class Framer:
    """Cuts a byte stream into messages; ProtocolError on anything that is not one."""

    def __init__(self) -> None:
        self.buffer = bytearray()

    def bodies(self, data: bytes) -> list:
        """The bodies of the frames completed by ``data`` (not decoded)."""
        self.buffer += data
        bodies = []
        while len(self.buffer) >= _LENGTH.size:
            (size,) = _LENGTH.unpack_from(self.buffer)
            if size > MAX_MESSAGE:
                raise ProtocolError(f"a message of {size} bytes (the limit is {MAX_MESSAGE})")
            if len(self.buffer) < _LENGTH.size + size:
                break
            bodies.append(bytes(self.buffer[_LENGTH.size:_LENGTH.size + size]))
            del self.buffer[:_LENGTH.size + size]
        return bodies

    def feed(self, data: bytes) -> list:
        return [decode(body) for body in self.bodies(data)]


@dataclass(frozen=True)
class Identity:
    """What makes two launchers parts of the same job."""

    job_id: str
    nodes: tuple
    ports: tuple
    script: str

    def as_dict(self) -> dict:
        """For the hello; a long node list as its digest, so that the hello of a job of 10,000
        nodes still fits one message (both ends make the same)."""
        nodes = list(self.nodes)
        if len(nodes) > LISTED_NODES:
            nodes = "sha256:" + hashlib.sha256("\n".join(nodes).encode()).hexdigest()
        return {"job_id": self.job_id, "nodes": nodes, "ports": list(self.ports), "script": self.script}

    def mismatch(self, other) -> Optional[str]:
        """What differs in a peer's identity (a dict from the wire), or None."""
        if not isinstance(other, dict):
            return "no job identity"
        for name in ("job_id", "nodes", "ports", "script"):
            mine = self.as_dict()[name]
            if other.get(name) != mine:
                return f"its {name} is {other.get(name)!r}, this job's is {mine!r}"
        return None


def proof(token: str, nonce: str, job_id: str, node: int) -> str:
    return hmac.new(token.encode(), f"{nonce}|{job_id}|{node}".encode(), hashlib.sha256).hexdigest()


def proves(given, expected: str) -> bool:
    """Whether ``given`` (from the wire: any type) is the ``expected`` proof."""
    return isinstance(given, str) and hmac.compare_digest(given.encode("utf-8", "replace"), expected.encode())


def fresh_nonce(value) -> bool:
    """A nonce as ``secrets.token_hex(16)`` makes it: what a challenge and a hello carry."""
    return isinstance(value, str) and len(value) == 32 and all(c in "0123456789abcdef" for c in value)


def hub_proof(token: str, node_nonce: str, hub_nonce: str, job_id: str, node: int) -> str:
    """Node 0's answer to a joining node's nonce: its welcome proves that it knows the token too."""
    return proof(token, f"node 0|{node_nonce}|{hub_nonce}", job_id, node)


def refusal_proof(token: str, node_nonce: str, reason: str, job_id: str, node: int) -> str:
    return proof(token, f"refused|{node_nonce}|{reason}", job_id, node)


TAG = 32  # bytes of HMAC-SHA256 ahead of every message body of a session


@dataclass
class Session:
    """After a handshake with a job token, each side seals every message it sends with
    HMAC-SHA256(key, direction|number|body), the key derived from the token and both nonces, and
    opens only the next number from the other side: a forged, replayed, reordered or reflected
    message is a ProtocolError (the connection is lost), never obeyed."""

    key: bytes
    outgoing: str
    incoming: str
    sent: int = 0
    received: int = 0

    @classmethod
    def between(cls, token: str, hub_nonce: str, node_nonce: str, job_id: str, node: int, at_hub: bool) -> "Session":
        key = hmac.new(token.encode(), f"session|{hub_nonce}|{node_nonce}|{job_id}|{node}".encode(), hashlib.sha256).digest()
        down, up = f"0>{node}", f"{node}>0"
        return cls(key, down, up) if at_hub else cls(key, up, down)

    def _tag(self, direction: str, number: int, body: bytes) -> bytes:
        return hmac.new(self.key, f"{direction}|{number}|".encode() + body, hashlib.sha256).digest()

    def seal(self, body: bytes) -> bytes:
        tag = self._tag(self.outgoing, self.sent, body)
        self.sent += 1
        return tag + body

    def open(self, body: bytes) -> bytes:
        tag, rest = body[:TAG], body[TAG:]
        if len(body) < TAG or not hmac.compare_digest(tag, self._tag(self.incoming, self.received, rest)):
            raise ProtocolError(f"message {self.received} of its session with a wrong authentication "
                                f"(forged, replayed or out of order)")
        self.received += 1
        return rest


# ---------------------------------------------------------------- events for the launcher


@dataclass(frozen=True)
class Joined:
    node: int


@dataclass(frozen=True)
class Received:
    node: int  # the sender: a peer for node 0, always 0 elsewhere
    message: dict


@dataclass(frozen=True)
class Lost:
    node: int
    reason: str


@dataclass(frozen=True)
class NeverJoined:
    nodes: tuple  # with their reason, one sentence for all
    reason: str


# ---------------------------------------------------------------- one connection


@dataclass
class Connection:
    sock: socket.socket
    where: str
    opened: float
    node: Optional[int] = None
    nonce: str = ""  # this side's nonce for the peer to prove the token on
    peer_nonce: str = ""
    session: Optional[Session] = None  # with a job token, from the welcome on
    framer: Framer = field(default_factory=Framer)
    out: bytearray = field(default_factory=bytearray)
    heard: float = 0.0
    said: float = 0.0
    connected: bool = True  # False while a node's connect() to node 0 is in progress

    def send(self, message: dict, now: float) -> None:
        self.out += encode(message, self.session)
        self.said = now
        self.flush()

    def flush(self) -> None:
        while self.out:
            try:
                n = self.sock.send(self.out)
            except (BlockingIOError, InterruptedError):
                return
            except OSError:
                self.out.clear()  # the peer is gone: reading will say so
                return
            del self.out[:n]

    def receive(self) -> list:
        """Bodies of the frames that arrived; ProtocolError for junk, ConnectionError at the end."""
        try:
            data = self.sock.recv(65536)
        except (BlockingIOError, InterruptedError):
            return []
        except OSError as e:
            raise ConnectionError(e.strerror or str(e)) from None
        if not data:
            raise ConnectionError("connection closed")
        return self.framer.bodies(data)

    def open(self, body: bytes) -> dict:
        """A body as the message it carries, its seal checked in a session; ProtocolError if not."""
        return decode(self.session.open(body) if self.session is not None else body)


def keepalive(heartbeat_timeout: float) -> tuple:
    """TCP's (idle, interval, count) so that it gives up on a silent peer within the heartbeat
    timeout (2 s at the least: its unit is the second), each within what Linux takes."""
    whole = max(2, int(heartbeat_timeout))
    count = min(127, whole - 1)
    every = min(32767, whole // (count + 1))
    return every, every, count


def _tune(sock: socket.socket, heartbeat_timeout: float) -> None:
    """Non-blocking, no Nagle delay, and TCP's own detection of a dead peer within the timeout."""
    sock.setblocking(False)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
    for name, value in zip(("TCP_KEEPIDLE", "TCP_KEEPINTVL", "TCP_KEEPCNT"), keepalive(heartbeat_timeout)):
        if hasattr(socket, name):
            sock.setsockopt(socket.IPPROTO_TCP, getattr(socket, name), value)
    if hasattr(socket, "TCP_USER_TIMEOUT"):  # milliseconds, at most 2**31 - 1: 24 days
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_USER_TIMEOUT, min(2**31 - 1, int(heartbeat_timeout * 1000)))


# ---------------------------------------------------------------- both ends


class Channel:
    """What node 0's hub and the other nodes' spoke share: heartbeats and the selector's part."""

    def __init__(self, identity: Identity, node: int, heartbeat_timeout: float, join_timeout: float,
                 token: Optional[str]) -> None:
        self.identity = identity
        self.node = node
        self.heartbeat_timeout = heartbeat_timeout
        self.beat_every = heartbeat_timeout / 6
        self.join_deadline = time.monotonic() + join_timeout
        self.join_timeout = join_timeout
        self.token = token or None
        if self.token is None:
            log.warning("control: no %s is set: whoever reaches node 0's control port can join this job as a "
                        "node, or take the port and pose as node 0, and stop the job; set the same secret "
                        "in %s on every node", TOKEN_VAR, TOKEN_VAR)
        self.connections: dict = {}  # fd -> Connection
        self.closed = False
        # sockets let go of, closed only when the launcher's loop next asks what to watch: until
        # then its selector still holds their numbers, which a new socket must not take over
        self.discarded: list = []

    def node_name(self, node: int) -> str:
        return f"node {node} ({self.identity.nodes[node]})"

    # the selector's part
    def registrations(self) -> dict:
        """{fd: selector events} this channel wants watched now. The caller stops watching any
        other descriptor of the channel at once (the sockets let go of are closed here)."""
        for sock in self.discarded:
            sock.close()
        self.discarded.clear()
        wanted = {}
        for fd, c in self.connections.items():
            wanted[fd] = selectors.EVENT_READ | (selectors.EVENT_WRITE if c.out else 0)
        return wanted

    def next_deadline(self) -> Optional[float]:
        times = []
        for c in self.connections.values():
            if c.node is None:
                times.append(c.opened + HELLO_TIMEOUT)
            else:
                times += [c.said + self.beat_every, c.heard + self.heartbeat_timeout]
        return min(times) if times else None

    def _beat_and_check(self, now: float) -> list:
        events = []
        for fd, c in list(self.connections.items()):
            if c.node is None:
                if now - c.opened >= HELLO_TIMEOUT:
                    self._drop(fd, f"said nothing valid for {HELLO_TIMEOUT:.0f} s")
                continue
            if now - c.heard >= self.heartbeat_timeout:
                events.append(self._lose(fd, f"no heartbeat for {now - c.heard:.1f} s"))
                continue
            if now - c.said >= self.beat_every:
                c.send({"type": "beat"}, now)
        return events

    def _read(self, fd: int, now: float) -> list:
        c = self.connections[fd]
        try:
            bodies = c.receive()
        except ProtocolError as e:
            return self._refuse(fd, f"sent {e}")
        except ConnectionError as e:
            return self._refuse(fd, f"connection lost ({e})" if c.node is not None else str(e))
        events = []
        for body in bodies:
            if fd not in self.connections:
                break
            try:
                message = c.open(body)
            except ProtocolError as e:
                return events + self._refuse(fd, f"sent {e}")
            c.heard = now
            events += self._on_message(fd, c, message, now)
        return events

    def _refuse(self, fd: int, reason: str) -> list:
        """Let go of a connection: a joined node's is lost, any other is dropped."""
        if self.connections[fd].node is not None:
            return [self._lose(fd, reason)]
        self._drop(fd, reason)
        return []

    def _on_message(self, fd, c, message, now) -> list:
        raise NotImplementedError

    def _drop(self, fd: int, reason: str) -> None:
        c = self.connections.pop(fd)
        log.warning("control: dropped the connection from %s: %s", c.where, reason)
        self.discarded.append(c.sock)

    def _lose(self, fd: int, reason: str) -> Lost:
        c = self.connections.pop(fd)
        self.discarded.append(c.sock)
        return Lost(c.node, f"{self.node_name(c.node)} lost: {reason}")

    def close(self) -> None:
        for c in self.connections.values():
            c.flush()
            c.sock.close()
        self.connections.clear()
        for sock in self.discarded:
            sock.close()
        self.discarded.clear()
        self.closed = True


class Hub(Channel):
    """Node 0: listens, checks who comes, and keeps one connection per node."""

    def __init__(self, identity: Identity, bind_ip: str, port: int, heartbeat_timeout: float,
                 join_timeout: float, token: Optional[str]) -> None:
        super().__init__(identity, 0, heartbeat_timeout, join_timeout, token)
        family = socket.AF_INET6 if ":" in bind_ip else socket.AF_INET
        self.listener = socket.socket(family, socket.SOCK_STREAM)
        self.listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.listener.bind(("::" if family == socket.AF_INET6 else "0.0.0.0", port))
        self.listener.listen(128)
        self.listener.setblocking(False)
        self.port = port
        self.peers: dict = {}  # node -> fd
        self.ever_joined: set = set()
        self.join_reported = False
        self.dropped = 0

    def registrations(self) -> dict:
        wanted = super().registrations()
        if not self.closed:
            wanted[self.listener.fileno()] = selectors.EVENT_READ
        return wanted

    def next_deadline(self) -> Optional[float]:
        times = [t for t in (super().next_deadline(),) if t is not None]
        if not self.join_reported and len(self.ever_joined) < len(self.identity.nodes) - 1:
            times.append(self.join_deadline)
        return min(times) if times else None

    def ready(self, fd: int, mask: int, now: float) -> list:
        if fd == self.listener.fileno():
            self._accept(now)
            return []
        if fd not in self.connections:
            return []
        if mask & selectors.EVENT_WRITE:
            self.connections[fd].flush()
        return self._read(fd, now) if mask & selectors.EVENT_READ else []

    def tick(self, now: float) -> list:
        events = self._beat_and_check(now)
        missing = [n for n in range(1, len(self.identity.nodes)) if n not in self.ever_joined]
        if missing and not self.join_reported and now >= self.join_deadline:
            self.join_reported = True
            names = ", ".join(self.node_name(n) for n in missing)
            events.append(NeverJoined(tuple(missing), f"{names} never joined within {self.join_timeout:g} s "
                                                      f"(node 0 listens on port {self.port})"))
        return events

    def _accept(self, now: float) -> None:
        while True:
            try:
                sock, addr = self.listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as e:
                if e.errno in (errno.EMFILE, errno.ENFILE):
                    log.warning("control: out of file descriptors; not accepting connections now")
                return
            self._make_room()
            _tune(sock, self.heartbeat_timeout)
            c = Connection(sock, f"{addr[0]}:{addr[1]}", now, nonce=secrets.token_hex(16), heard=now)
            self.connections[sock.fileno()] = c
            c.send({"type": "challenge", "nonce": c.nonce}, now)

    def _make_room(self) -> None:
        """At most MAX_PENDING connections wait for their hello: the oldest goes (silently: a flood
        would flood the log), so that connections that never speak cannot keep a node out."""
        pending = [fd for fd, c in self.connections.items() if c.node is None]
        if len(pending) >= MAX_PENDING:
            oldest = min(pending, key=lambda fd: self.connections[fd].opened)
            self.discarded.append(self.connections.pop(oldest).sock)
            self.dropped += 1

    def _on_message(self, fd, c, message, now) -> list:
        if c.node is None:
            return self._introduce(fd, c, message, now)
        kind = message["type"]
        if kind == "beat":
            return []
        return [Received(c.node, message)]

    def _introduce(self, fd, c, message, now) -> list:
        if message.get("type") != "hello":
            self._drop(fd, f"a {str(message.get('type'))[:40]!r} message before saying hello")
            return []
        node, c.peer_nonce = message.get("node"), message.get("nonce")
        problem = self.identity.mismatch(message.get("identity"))
        if problem is None and not (type(node) is int and 0 < node < len(self.identity.nodes)):
            problem = f"node index {node!r} is not one of 1 to {len(self.identity.nodes) - 1}"
        if problem is None:
            problem = self._check_proof(c, message.get("proof"), node)
        if problem is None and node in self.peers:
            problem = f"{self.node_name(node)} is already joined"
        if problem is not None:
            self._refuse_node(fd, c, node, problem, now)
            return []
        c.node = node
        self.peers[node] = fd
        self.ever_joined.add(node)
        welcome = {"type": "welcome"}
        if self.token is not None:  # node 0 proves the token on the node's nonce; then every message is sealed
            welcome["proof"] = hub_proof(self.token, c.peer_nonce, c.nonce, self.identity.job_id, node)
            c.send(welcome, now)
            c.session = Session.between(self.token, c.nonce, c.peer_nonce, self.identity.job_id, node, at_hub=True)
        else:
            c.send(welcome, now)
        log.debug("control: %s joined from %s", self.node_name(node), c.where)
        return [Joined(node)]

    def _refuse_node(self, fd, c, node, problem: str, now: float) -> None:
        """Tell a joining node why (which job, in the open, only where no token guards it), then drop it.
        With a token the refusal is proven on the node's nonce: only then does the node give up."""
        said = (problem if self.token is None else "wrong job or job token")[:1000]
        refusal = {"type": "refused", "reason": said}
        if self.token is not None and fresh_nonce(c.peer_nonce):
            refusal["proof"] = refusal_proof(self.token, c.peer_nonce, said, self.identity.job_id, node)
        c.send(refusal, now)
        c.flush()
        self._drop(fd, f"not a node of this job: {problem}")

    def _check_proof(self, c, given, node) -> Optional[str]:
        if self.token is None:
            return None if given is None else "it proves a job token, and this job has none"
        if not isinstance(given, str):
            return f"it gives no proof of the job token ({TOKEN_VAR})"
        if not proves(given, proof(self.token, c.nonce, self.identity.job_id, node)):
            return f"its proof of the job token ({TOKEN_VAR}) is wrong"
        if not fresh_nonce(c.peer_nonce):
            return "it gives no nonce for node 0 to prove the job token on"
        return None

    def _lose(self, fd: int, reason: str) -> Lost:
        lost = super()._lose(fd, reason)
        self.peers.pop(lost.node, None)
        return lost

    def send(self, node: int, message: dict) -> None:
        fd = self.peers.get(node)
        if fd is not None:
            self.connections[fd].send(message, time.monotonic())

    def broadcast(self, message: dict) -> None:
        for node in list(self.peers):
            self.send(node, message)

    def joined(self) -> set:
        return set(self.peers)

    def close(self) -> None:
        super().close()
        self.listener.close()


class Spoke(Channel):
    """Every node but 0: connects to node 0 (retrying until the join timeout) and stays."""

    def __init__(self, identity: Identity, node: int, hub_ip: str, port: int, heartbeat_timeout: float,
                 join_timeout: float, token: Optional[str]) -> None:
        super().__init__(identity, node, heartbeat_timeout, join_timeout, token)
        self.address = (hub_ip, port)
        self.next_try = time.monotonic()
        self.welcomed = False
        self.gave_up = False
        self.last_error = "no answer"
        self.warned: set = set()  # what a node 0 that proves nothing said: logged once each

    @property
    def hub(self) -> Optional[Connection]:
        return next(iter(self.connections.values()), None)

    def next_deadline(self) -> Optional[float]:
        if self.gave_up or self.closed:
            return None
        times = [t for t in (super().next_deadline(),) if t is not None]
        if not self.welcomed:
            times += [self.join_deadline] + ([self.next_try] if self.hub is None else [])
        return min(times) if times else None

    def registrations(self) -> dict:
        wanted = super().registrations()
        c = self.hub
        if c is not None and c.node is None and not c.connected:
            wanted[c.sock.fileno()] = selectors.EVENT_WRITE  # the connect() completes
        return wanted

    def tick(self, now: float) -> list:
        if self.gave_up or self.closed:
            return []
        if not self.welcomed and now >= self.join_deadline:
            self.gave_up = True
            for fd in list(self.connections):
                self.discarded.append(self.connections.pop(fd).sock)
            return [NeverJoined((0,), f"{self.node_name(0)} never answered on port {self.address[1]} within "
                                      f"{self.join_timeout:g} s ({self.last_error})")]
        if self.hub is None and not self.welcomed and now >= self.next_try:
            self._connect(now)  # once welcomed, a lost node 0 is lost for good: no new connection
        if self.welcomed:
            return self._beat_and_check(now)
        return []

    def _connect(self, now: float) -> None:
        family = socket.AF_INET6 if ":" in self.address[0] else socket.AF_INET
        sock = socket.socket(family, socket.SOCK_STREAM)
        _tune(sock, self.heartbeat_timeout)
        try:
            sock.connect(self.address)
        except (BlockingIOError, InterruptedError):
            pass
        except OSError as e:
            self.last_error = e.strerror or str(e)
            sock.close()
            self.next_try = now + RETRY_EVERY
            return
        c = Connection(sock, f"{self.address[0]}:{self.address[1]}", now, nonce=secrets.token_hex(16), heard=now,
                       connected=False)
        self.connections[sock.fileno()] = c

    def ready(self, fd: int, mask: int, now: float) -> list:
        c = self.connections.get(fd)
        if c is None:
            return []
        if not c.connected:
            err = c.sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
            if err:
                self.last_error = os.strerror(err)
                self._retry(fd, now)
                return []
            c.connected = True
        if mask & selectors.EVENT_WRITE:
            c.flush()
        if not mask & selectors.EVENT_READ:
            return []
        try:
            return self._read(fd, now)
        finally:
            if not self.welcomed and fd not in self.connections and not self.gave_up:
                self.next_try = max(self.next_try, now + RETRY_EVERY)

    def _retry(self, fd: int, now: float) -> None:
        self.discarded.append(self.connections.pop(fd).sock)
        self.next_try = now + RETRY_EVERY

    def _drop(self, fd: int, reason: str) -> None:
        self.last_error = reason
        log.debug("control: node 0 at %s:%d: %s; trying again", *self.address, reason)
        self._retry(fd, time.monotonic())

    def _on_message(self, fd, c, message, now) -> list:
        kind = message["type"]
        if c.node is None:
            return self._handshake(fd, c, kind, message, now)
        if kind == "beat":
            return []
        return [Received(0, message)]

    def _handshake(self, fd, c, kind: str, message: dict, now: float) -> list:
        if kind == "challenge" and fresh_nonce(message.get("nonce")) and not c.peer_nonce:
            c.peer_nonce = message["nonce"]
            hello = {"type": "hello", "identity": self.identity.as_dict(), "node": self.node, "nonce": c.nonce}
            if self.token is not None:
                hello["proof"] = proof(self.token, c.peer_nonce, self.identity.job_id, self.node)
            c.send(hello, now)
            return []
        if kind == "refused" and c.peer_nonce:
            return self._refused(fd, c, message, now)
        if kind == "welcome" and c.peer_nonce:
            return self._welcomed(fd, c, message)
        self._drop(fd, f"unexpected {kind[:40]!r} in the handshake")
        return []

    def _refused(self, fd, c, message: dict, now: float) -> list:
        """Node 0 will not take this node: no point in trying again, if it is node 0 (with a token:
        if it proves it); a refusal that proves nothing may be a stranger's, so try again."""
        reason = message.get("reason") if isinstance(message.get("reason"), str) else "no reason given"
        if self.token is None or proves(message.get("proof"),
                                        refusal_proof(self.token, c.nonce, reason[:1000], self.identity.job_id, self.node)):
            self.gave_up = True
            self.discarded.append(self.connections.pop(fd).sock)
            return [NeverJoined((0,), f"{self.node_name(0)} refused this node: {one_line(reason)}")]
        self._unproven(fd, f"refused this node ({one_line(reason, 200)}) without proving the job token")
        self.next_try = now + RETRY_REFUSED
        return []

    def _welcomed(self, fd, c, message: dict) -> list:
        if self.token is not None:
            expected = hub_proof(self.token, c.nonce, c.peer_nonce, self.identity.job_id, self.node)
            if not proves(message.get("proof"), expected):
                self._unproven(fd, f"welcomed this node without proving the job token ({TOKEN_VAR})")
                return []
            c.session = Session.between(self.token, c.peer_nonce, c.nonce, self.identity.job_id, self.node, at_hub=False)
        c.node = 0
        self.welcomed = True
        log.debug("control: joined node 0 at %s:%d", *self.address)
        return [Joined(0)]

    def _unproven(self, fd: int, what: str) -> None:
        """Whoever answers on node 0's port does not prove the token: not obeyed; try again."""
        if what not in self.warned:
            self.warned.add(what)
            log.warning("control: whoever answers on %s:%d %s; not obeyed: trying again until the join timeout",
                        *self.address, what)
        self.last_error = f"it {what}"
        self._retry(fd, time.monotonic())

    def send(self, message: dict) -> None:
        c = self.hub
        if c is not None and c.node is not None:
            c.send(message, time.monotonic())
