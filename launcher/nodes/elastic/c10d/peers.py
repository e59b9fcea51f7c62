"""Node 0's connections to the other launchers of a c10d elastic job (``keeper``): each one's socket, its
framing and, with a job token, its session from the admission on (``auth.Session.elastic``: every message
both ways sealed, numbered, and bound to that one member), and sending to it without waiting long.

A message for many launchers (a heartbeat, a round, a stop) is encoded once (``Shared``); in a session
each launcher gets its own seal of it, over the body's SHA-256 computed once, so that a round that lists
10,000 members is hashed once rather than once per member, and sent without a copy per member.
"""

from __future__ import annotations

import hashlib
import socket
from dataclasses import dataclass
from typing import Optional

from launcher.nodes.transport import auth
from launcher.nodes.transport import messages as m
from launcher.nodes.transport import wire

SEND_TIMEOUT = 2.0  # one small message to a peer; longer, and the peer counts as gone


class Shared:
    """One message for many launchers: its frame encoded once; its seal, per session, over one digest."""

    def __init__(self, message) -> None:
        self.encoded = wire.encode(m.to_wire(message))
        self.body = memoryview(self.encoded)[wire.LENGTH.size:]
        self.digest: Optional[bytes] = None

    def parts(self, session: Optional[auth.Session]) -> list:
        """The buffers of its frame for one launcher: the same bytes for all without a session."""
        if session is None:
            return [self.encoded]
        if self.digest is None:
            self.digest = hashlib.sha256(self.body).digest()
        tag = session.tag(self.body, self.digest)
        return [wire.LENGTH.pack(len(tag) + len(self.body)), tag, self.body]


BEAT = Shared(m.Beat())
BEAT_BODY = bytes(BEAT.body)


@dataclass
class Peer:
    """One connection to node 0's endpoint: a stranger until its hello, then a launcher of the job."""

    sock: socket.socket
    framer: wire.Framer
    node_id: Optional[str] = None
    nonce: str = ""  # of its hello: node 0 proves the job token on it
    session: Optional[auth.Session] = None  # with a job token, from its admission on

    def receive(self) -> Optional[list]:
        """The bodies of the frames that arrived (still sealed in a session); None once closed or junk."""
        try:
            data = self.sock.recv(65536)
            return self.framer.bodies(data) if data else None
        except (BlockingIOError, InterruptedError):
            return []
        except (OSError, wire.ProtocolError):
            return None

    def send(self, message) -> bool:
        return send_parts(self.sock, [wire.encode(m.to_wire(message), self.session)])

    def send_shared(self, shared: Shared) -> bool:
        return send_parts(self.sock, shared.parts(self.session))


def send_parts(sock: socket.socket, parts: list) -> bool:
    """One try without waiting (a heartbeat: one system call); what the buffer did not take, within SEND_TIMEOUT."""
    try:
        try:
            sent = sock.send(parts[0]) if len(parts) == 1 else sock.sendmsg(parts)
        except (BlockingIOError, InterruptedError):
            sent = 0
        if sent < sum(len(part) for part in parts):
            rest = memoryview(parts[0] if len(parts) == 1 else b"".join(parts))[sent:]  # a full buffer: rare
            sock.settimeout(SEND_TIMEOUT)
            try:
                sock.sendall(rest)
            finally:
                sock.setblocking(False)
        return True
    except OSError:
        return False
