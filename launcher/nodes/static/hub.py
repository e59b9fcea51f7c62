"""Node 0's end of the control channel: it listens, checks who comes (job identity, node index,
job token), and keeps one connection per node."""

from __future__ import annotations

import selectors
import time
from typing import Callable, Optional

from launcher.nodes.static.channel import NEVER_JOINED, Gone, Joined
from launcher.nodes.transport.connection import HELLO_TIMEOUT, Connection, tune
from launcher.nodes.static.endpoint import Endpoint
from launcher.nodes.transport.handshake import Server
from launcher.nodes.transport.listener import Listener, bind, pending_cap
from launcher.nodes.transport.wire import MAX_FRAME
from launcher.nodes.transport.messages import Hello, Identity, Message
from launcher.output.messages import log


class Hub(Endpoint):
    """Node 0: listens, checks who comes, and keeps one connection per node."""

    beats_all = True

    def __init__(self, identity: Identity, bind_ip: str, port: int, heartbeat_timeout: float,
                 join_timeout: float, token: Optional[str], clock: Callable[[], float] = time.monotonic,
                 judge: Optional[Callable[[int, object], object]] = None) -> None:
        super().__init__(identity, 0, heartbeat_timeout, join_timeout, token, clock)
        self.judge = judge  # (node, its checkup as sent) -> node 0's verdict (``admission.Verdict``)
        self.verdicts: dict = {}  # node -> the verdict on the checkup of its hello
        self.listener = Listener(bind(bind_ip, port, everywhere=True), "control", pending_cap(len(identity.nodes)),
                                 hello_within=HELLO_TIMEOUT)
        self.port = port
        self.peers: dict = {}  # node -> fd
        self.ever_joined: set = set()
        self.join_reported = False
        self.dropped = 0

    def registrations(self) -> dict:
        wanted = super().registrations()
        if not self.closed:
            wanted.update(self.listener.registrations(self.clock()))
        return wanted

    def next_deadline(self) -> Optional[float]:
        times = [t for t in (super().next_deadline(), self.listener.next_deadline()) if t is not None]
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
        for sock in self.listener.overdue(now):  # no hello within HELLO_TIMEOUT
            c = self.connections.get(sock.fileno())
            if c is not None and c.sock is sock:
                self._drop(sock.fileno(), f"said nothing valid for {HELLO_TIMEOUT:.0f} s")
        events = self._beat_and_check(now)
        missing = [n for n in range(1, len(self.identity.nodes)) if n not in self.ever_joined]
        if missing and not self.join_reported and now >= self.join_deadline:
            self.join_reported = True
            names = ", ".join(self.node_name(n) for n in missing)
            events.append(Gone(tuple(missing), NEVER_JOINED, f"{names} never joined within {self.join_timeout:g} s "
                                                      f"(node 0 listens on port {self.port})"))
        return events

    def _accept(self, now: float) -> None:
        new, pushed_out = self.listener.accept(now)
        for sock in pushed_out:  # silently: a flood would flood the log
            if self.connections.pop(sock.fileno(), None) is not None:
                self.discarded.append(sock)
                self.dropped += 1
        for sock, addr in new:
            tune(sock, self.heartbeat_timeout)
            c = Connection(sock, f"{addr[0]}:{addr[1]}", now, handshake=Server(self.token, self.identity.job_id),
                           heard=self.awake(now))
            self.connections[sock.fileno()] = c
            c.send(c.handshake.challenge(), now)

    def _handshake(self, fd, c, message: Message, now: float) -> list:
        """A hello: its proof checked (``handshake``), then its job identity and node index."""
        if not isinstance(message, Hello):
            self._drop(fd, f"a {message.type[:40]!r} message before saying hello")
            return []
        node = message.node
        problem = c.handshake.hello(node, message.nonce, message.proof) or self.identity.mismatch(message.identity)
        if problem is None and not (type(node) is int and 0 < node < len(self.identity.nodes)):
            problem = f"node index {node!r} is not one of 1 to {len(self.identity.nodes) - 1}"
        if problem is None and node in self.peers:
            problem = f"{self.node_name(node)} is already joined"
        if problem is not None:  # with a token, a node that does not prove it is told nothing of the job
            c.send(c.handshake.refusal(problem), now)
            self._drop(fd, f"not a node of this job: {problem}")
            return []
        c.node = node
        self.listener.settled(c.sock)
        c.framer.limit = MAX_FRAME  # a node of the job: what it says is not limited
        self.peers[node] = fd
        self._watch_from(now)
        self.ever_joined.add(node)
        if self.judge is not None:  # the coordinator acts on it before any worker starts
            self.verdicts[node] = self.judge(node, message.checkup)
        c.send(c.handshake.welcome(), now)
        c.session = c.handshake.session  # with a token: every message from now on is sealed
        log.debug("control: %s joined from %s", self.node_name(node), c.where)
        return [Joined(node)]

    def _lose(self, fd: int, reason: str) -> Gone:
        lost = super()._lose(fd, reason)
        self.peers.pop(lost.nodes[0], None)
        return lost

    def send(self, node: int, message: dict) -> None:
        fd = self.peers.get(node)
        if fd is not None:
            self.connections[fd].send(message, self.clock())

    def broadcast(self, message: dict) -> None:
        for node in list(self.peers):
            self.send(node, message)

    def joined(self) -> set:
        return set(self.peers)

    def heard_ages(self, now: float) -> dict:
        """node -> seconds since it was last heard, at ``now`` on this node's clock of attention (its loop's lag
        left out)."""
        awake = now - self.away
        return {node: max(0.0, awake - self.connections[fd].heard) for node, fd in self.peers.items()
                if fd in self.connections}

    def close(self) -> None:
        super().close()
        self.listener.close()


