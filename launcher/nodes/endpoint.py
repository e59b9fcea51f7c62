"""What node 0's hub and the other nodes' spoke share: the connections, the heartbeats, losing a
peer, and their part in the launcher's selector."""

from __future__ import annotations

import selectors
import time
from typing import Optional

from launcher.nodes.auth import TOKEN_VAR
from launcher.nodes.channel import Lost, Received
from launcher.nodes.messages import Beat, Identity, Message, from_wire, to_wire
from launcher.nodes.wire import ProtocolError
from launcher.output.messages import log

HELLO_TIMEOUT = 5.0
MAX_PENDING = 64  # connections not yet introduced; more are closed at once
# The accept queue of node 0's listeners (the kernel caps it at net.core.somaxconn): as many launchers as join at
# once wait there. A shorter queue drops the connections past it, which the kernel then retries after 1, 3, 7, 15 s.
BACKLOG = 4096
RETRY_EVERY = 0.2  # a node that cannot reach node 0 yet tries again this often
RETRY_REFUSED = 1.0  # ... and after a refusal that does not prove the job token


class Endpoint:
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
                c.send(to_wire(Beat()), now)
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

    def _on_message(self, fd, c, message: dict, now: float) -> list:
        """A message of a connection: the handshake's, a heartbeat, or one for the coordinator."""
        typed = from_wire(message)
        if c.node is None:
            return self._handshake(fd, c, typed, now)
        if isinstance(typed, Beat):
            return []
        return [Received(c.node, message)]

    def _handshake(self, fd, c, message: Message, now: float) -> list:
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

