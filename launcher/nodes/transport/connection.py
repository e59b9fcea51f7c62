"""One TCP connection between launchers: its socket tuned for a quick verdict on a dead peer, its framing
(``wire.MAX_MESSAGE`` until the peer is proven, then what the job needs), its handshake and then its session,
and sending to it without waiting long.

A message for many connections (a heartbeat, a round, a stop) is encoded once (``Shared``); in a session each
connection gets its own seal of it, over the body's SHA-256 computed once, so that a round that lists 10,000
members is hashed once rather than once per member, and sent without a copy per member.
"""

from __future__ import annotations

import hashlib
import socket
import time
from dataclasses import dataclass, field
from typing import Optional, Union

from launcher.nodes.transport import messages as m
from launcher.nodes.transport.auth import Session
from launcher.nodes.transport.handshake import Client, Server
from launcher.nodes.transport.wire import LENGTH, Framer, decode, encode

HELLO_TIMEOUT = 5.0
RETRY_EVERY = 0.2  # a node that cannot reach node 0 yet tries again this often
RETRY_REFUSED = 1.0  # ... and after a refusal that does not prove the job token
SEND_TIMEOUT = 2.0  # what the kernel's buffer did not take of one message at once; longer, and the peer is gone


class Shared:
    """One message for many connections: its frame encoded once; its seal, per session, over one digest."""

    def __init__(self, message) -> None:
        self.encoded = encode(m.to_wire(message))
        self.body = memoryview(self.encoded)[LENGTH.size:]
        self.digest: Optional[bytes] = None

    def parts(self, session: Optional[Session]) -> list:
        """The buffers of its frame for one connection: the same bytes for all without a session."""
        if session is None:
            return [self.encoded]
        if self.digest is None:
            self.digest = hashlib.sha256(self.body).digest()
        tag = session.tag(self.body, self.digest)
        return [LENGTH.pack(len(tag) + len(self.body)), tag, self.body]


def send_buffered(sock: socket.socket, out: bytearray) -> bool:
    """Send what the kernel takes of ``out`` now, without waiting (what went is cut from it); False: the peer is gone."""
    while out:
        try:
            del out[:sock.send(out)]
        except (BlockingIOError, InterruptedError):
            return True
        except OSError:
            return False
    return True


@dataclass
class Connection:
    sock: socket.socket
    where: str = ""
    opened: float = 0.0
    node: object = None  # who the peer is, once its handshake is over (a node index, an elastic node id)
    handshake: Union[Server, Client, None] = None
    session: Optional[Session] = None  # with a job token, from the welcome on
    framer: Framer = field(default_factory=Framer)
    out: bytearray = field(default_factory=bytearray)
    heard: float = 0.0
    said: float = 0.0
    connected: bool = True  # False while a node's connect() to node 0 is in progress

    def frame(self, message) -> list:
        """The buffers of ``message`` (a JSON object, a message, or one ``Shared``), sealed in the session."""
        if isinstance(message, Shared):
            return message.parts(self.session)
        return [encode(message if isinstance(message, dict) else m.to_wire(message), self.session)]

    def send(self, message, now: float = 0.0) -> None:
        """Queue ``message`` and send what the kernel takes now; the rest waits for ``flush``."""
        for part in self.frame(message):
            self.out += part
        self.said = now
        self.flush()

    def flush(self) -> None:
        if not send_buffered(self.sock, self.out):
            self.out.clear()  # the peer is gone: reading will say so

    def send_within(self, message, timeout: float = SEND_TIMEOUT) -> bool:
        """One try without waiting (a heartbeat: one system call); what the buffer did not take, within
        ``timeout``; False when the peer is gone or too slow."""
        parts = self.frame(message)
        try:
            try:
                sent = self.sock.send(parts[0]) if len(parts) == 1 else self.sock.sendmsg(parts)
            except (BlockingIOError, InterruptedError):
                sent = 0
            if sent < sum(len(part) for part in parts):
                rest = memoryview(parts[0] if len(parts) == 1 else b"".join(parts))[sent:]  # a full buffer: rare
                self.sock.settimeout(timeout)
                try:
                    self.sock.sendall(rest)
                finally:
                    self.sock.setblocking(False)
            return True
        except OSError:
            return False

    def receive(self) -> list:
        """Bodies of the frames that arrived (still sealed in a session); ProtocolError for junk,
        ConnectionError at the end."""
        try:
            data = self.sock.recv(65536)
        except (BlockingIOError, InterruptedError, socket.timeout):
            return []
        except OSError as e:
            raise ConnectionError(e.strerror or str(e)) from None
        if not data:
            raise ConnectionError("connection closed")
        return self.framer.bodies(data)

    def unseal(self, body: bytes) -> bytes:
        """A body with its seal checked in the session (as it came without one); ProtocolError if it fails."""
        return self.session.open(body) if self.session is not None else body

    def open(self, body: bytes) -> dict:
        """A body as the message it carries, its seal checked in a session; ProtocolError if not."""
        return decode(self.unseal(body))


def dial(host: str, port: int, deadline: float, clock=time.monotonic) -> socket.socket:
    """A blocking connection to ``host``:``port`` (a node's to a server that may not listen yet), tried every
    RETRY_EVERY until ``deadline`` on ``clock``, each try bounded by a second; the last try's OSError once no time
    is left for another."""
    while True:
        try:
            return socket.create_connection((host, port), timeout=max(0.1, min(1.0, deadline - clock())))
        except OSError:
            if clock() + RETRY_EVERY >= deadline:
                raise
            time.sleep(RETRY_EVERY)


def keepalive(heartbeat_timeout: float) -> tuple:
    """TCP's (idle, interval, count) so that it gives up on a silent peer within the heartbeat
    timeout (2 s at the least: its unit is the second), each within what Linux takes."""
    whole = max(2, int(heartbeat_timeout))
    count = min(127, whole - 1)
    every = min(32767, whole // (count + 1))
    return every, every, count


def tune(sock: socket.socket, heartbeat_timeout: float) -> None:
    """Non-blocking, no Nagle delay, and TCP's own detection of a dead peer within the timeout."""
    sock.setblocking(False)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
    for name, value in zip(("TCP_KEEPIDLE", "TCP_KEEPINTVL", "TCP_KEEPCNT"), keepalive(heartbeat_timeout)):
        if hasattr(socket, name):
            sock.setsockopt(socket.IPPROTO_TCP, getattr(socket, name), value)
    if hasattr(socket, "TCP_USER_TIMEOUT"):  # milliseconds, at most 2**31 - 1: 24 days
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_USER_TIMEOUT, min(2**31 - 1, int(heartbeat_timeout * 1000)))
