"""Every other node's end of the control channel: it connects to node 0 (retrying until the join
timeout), obeys only a node 0 that proves the job token, and stays."""

from __future__ import annotations

import os
import selectors
import socket
import time
from typing import Callable, Optional

from launcher.nodes.transport.auth import TOKEN_VAR
from launcher.nodes.static.channel import NEVER_JOINED, Gone, Joined
from launcher.nodes.transport.connection import RETRY_EVERY, RETRY_REFUSED, Connection, tune
from launcher.nodes.static.endpoint import Endpoint
from launcher.nodes.transport.handshake import Client
from launcher.nodes.transport.wire import MAX_FRAME
from launcher.nodes.transport.messages import Hello, Identity, Message, Refusal, Welcome, to_wire
from launcher.output.messages import log
from launcher.plan.policy import one_line


class Spoke(Endpoint):
    """Every node but 0: connects to node 0 (retrying until the join timeout) and stays."""

    def __init__(self, identity: Identity, node: int, hub_ip: str, port: int, heartbeat_timeout: float,
                 join_timeout: float, token: Optional[str], clock: Callable[[], float] = time.monotonic,
                 checkup: Optional[Callable[[], object]] = None) -> None:
        super().__init__(identity, node, heartbeat_timeout, join_timeout, token, clock)
        self.checkup = checkup  # this node's health checkup for its hello, made afresh for each
        self.address = (hub_ip, port)
        self.next_try = clock()
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
            return [Gone((0,), NEVER_JOINED, f"{self.node_name(0)} never answered on port {self.address[1]} within "
                                      f"{self.join_timeout:g} s ({self.last_error})")]
        if self.hub is None and not self.welcomed and now >= self.next_try:
            self._connect(now)  # once welcomed, a lost node 0 is lost for good: no new connection
        if self.welcomed:
            return self._beat_and_check(now)
        return []

    def _connect(self, now: float) -> None:
        family = socket.AF_INET6 if ":" in self.address[0] else socket.AF_INET
        sock = socket.socket(family, socket.SOCK_STREAM)
        tune(sock, self.heartbeat_timeout)
        try:
            sock.connect(self.address)
        except (BlockingIOError, InterruptedError):
            pass
        except OSError as e:
            self.last_error = e.strerror or str(e)
            sock.close()
            self.next_try = now + RETRY_EVERY
            return
        c = Connection(sock, f"{self.address[0]}:{self.address[1]}", now,
                       handshake=Client(self.token, self.identity.job_id, self.node), heard=self.awake(now), connected=False)
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
        self._retry(fd, self.clock())

    def _handshake(self, fd, c, message: Message, now: float) -> list:
        answer = c.handshake.answer(message)
        if answer is not None:
            checkup = self.checkup() if self.checkup is not None else None
            c.send(to_wire(Hello(self.identity.as_dict(), self.node, *answer, checkup=checkup)), now)
            return []
        if isinstance(message, Refusal) and c.handshake.server_nonce:
            return self._refused(fd, c, message, now)
        if isinstance(message, Welcome) and c.handshake.server_nonce:
            return self._welcomed(fd, c, message)
        self._drop(fd, f"unexpected {message.type[:40]!r} in the handshake")
        return []

    def _refused(self, fd, c, message: Refusal, now: float) -> list:
        """Node 0 will not take this node: no point in trying again, if it is node 0 (with a token:
        if it proves it); a refusal that proves nothing may be a stranger's, so try again."""
        reason = message.reason if message.reason is not None else "no reason given"
        if c.handshake.refused(message):
            self.gave_up = True
            self.discarded.append(self.connections.pop(fd).sock)
            return [Gone((0,), NEVER_JOINED, f"{self.node_name(0)} refused this node: {one_line(reason)}")]
        self._unproven(fd, f"refused this node ({one_line(reason, 200)}) without proving the job token")
        self.next_try = now + RETRY_REFUSED
        return []

    def _welcomed(self, fd, c, message: Welcome) -> list:
        if not c.handshake.welcomed(message):
            self._unproven(fd, f"welcomed this node without proving the job token ({TOKEN_VAR})")
            return []
        c.session = c.handshake.session
        c.node = 0
        c.framer.limit = MAX_FRAME  # node 0 of the job: what it says is not limited
        self.welcomed = True
        self._watch_from(self.clock())
        log.debug("control: joined node 0 at %s:%d", *self.address)
        return [Joined(0)]

    def _unproven(self, fd: int, what: str) -> None:
        """Whoever answers on node 0's port does not prove the token: not obeyed; try again."""
        if what not in self.warned:
            self.warned.add(what)
            log.warning("control: whoever answers on %s:%d %s; not obeyed: trying again until the join timeout",
                        *self.address, what)
        self.last_error = f"it {what}"
        self._retry(fd, self.clock())

    def send(self, message: dict) -> None:
        c = self.hub
        if c is not None and c.node is not None:
            c.send(message, self.clock())
