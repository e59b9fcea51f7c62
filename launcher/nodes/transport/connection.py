"""One TCP connection of the control channel: its socket tuned for a quick verdict on a dead
peer, its framing, its outgoing buffer, and its session once sealed."""

from __future__ import annotations

import socket
from dataclasses import dataclass, field
from typing import Optional

from launcher.nodes.transport.auth import Session
from launcher.nodes.transport.wire import Framer, decode, encode

HELLO_TIMEOUT = 5.0
RETRY_EVERY = 0.2  # a node that cannot reach node 0 yet tries again this often
RETRY_REFUSED = 1.0  # ... and after a refusal that does not prove the job token


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

