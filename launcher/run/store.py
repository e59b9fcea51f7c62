"""Node 0's rendezvous store (``--agent_store``), served by the launcher itself in its event loop.

The launcher listens on MASTER_PORT from the start of the launch, on the socket that held the
port since the plan: a rank that connects early waits in that socket's queue, not in the TCPStore
client's back-off. The event loop (``launcher.run.loop``) watches the listener and every client's
socket for it; the protocol and the key-value state are ``launcher.run.tcpstore``'s. No thread, no
process, no torch. Every socket is non-blocking and every reply goes out through the client's
own buffer, so no client can stop the loop: one that breaks the protocol, never validates, or
would grow the store past its limit is let go; one that does not read its replies is not read
either. Each attempt starts from an empty store, its clients of the attempt before let go: torch's
keys carry no attempt, so a restart meets as a first start does.
"""

from __future__ import annotations

import selectors
import socket
import time
from dataclasses import dataclass, field
from typing import Callable, Optional, Sequence

from launcher.errors import LaunchError
from launcher.host import preflight
from launcher.nodes.transport.connection import send_buffered
from launcher.nodes.transport.listener import Listener, pending_cap
from launcher.output.messages import log
from launcher.plan.agent_store import StoreSpec
from launcher.run import limits
from launcher.run import tcpstore

STORE_LIMIT = 1 << 30  # bytes of keys and values (tcpstore.KeyValueStore.size)
BUFFER_LIMIT = 256 << 20  # bytes waiting in the clients' buffers, in and out, all together
RECV_BYTES = 256 * 1024
OUT_PAUSE = 1 << 20  # a client with this much not yet taken is not read until it takes it
VALIDATE_SECONDS = 30.0  # a connection that has not validated by then is let go
WARNINGS = 10  # warnings an attempt may print; later ones go to the debug log


@dataclass(eq=False)
class Client:
    sock: socket.socket
    peer: str
    opened: float
    input: tcpstore.Input = field(default_factory=tcpstore.Input)
    out: bytearray = field(default_factory=bytearray)
    alive: bool = True

    def held(self) -> int:
        return self.input.held() + len(self.out)


class AgentStore:
    """The store node 0's launcher serves (none where ``spec`` is None: then every method does nothing)."""

    def __init__(self, spec: Optional[StoreSpec], reserved: Sequence[socket.socket], expected: int = 1,
                 keep_free: int = 64) -> None:
        self.spec = spec
        self.reserved = reserved
        self.expected, self.keep_free = expected, keep_free  # clients, and descriptors left to the launch
        self.listener: Optional[Listener] = None  # its pending connections: the clients yet to validate
        self.state = tcpstore.KeyValueStore(STORE_LIMIT)
        self.clients: dict = {}  # fd -> Client
        self.max_clients = 0
        self.serving = False
        self.told: dict = {}  # fd -> the selector events the event loop was last told
        self.pending: dict = {}  # fd -> the events to tell it at its next turn (0: stop watching)
        self.discarded: list = []  # sockets let go of, closed once the loop stopped watching them
        self.warnings = 0

    def listen(self) -> None:
        """Listen on the store's port, on the socket that holds it (one bound now if none does)."""
        if self.spec is None:
            return
        port = self.spec.port
        held = [s for s in self.reserved if s.getsockname()[1] == port]
        sock = held[0] if held else preflight.reserve_port(self.spec.address, port)
        try:
            if sock is None:
                raise OSError("it is in use")
            # every rank's client (torch's, and its agent's) may come at once; the others push the oldest out
            self.listener = Listener(sock, f"the rendezvous store {self._where()}", pending_cap(2 * self.expected),
                                     VALIDATE_SECONDS)
        except OSError as e:
            raise LaunchError(f"port {port} on {self.spec.address}, the rendezvous store's (MASTER_PORT), cannot be "
                              f"listened on ({e.strerror or e}); stop the program holding it, or choose another "
                              "--started_port (--master_port).") from None
        self.max_clients = limits.store_connections(self.expected, self.keep_free)

    def begin_attempt(self) -> None:
        """An empty store for the attempt about to start; the clients of the one before let go."""
        if self.listener is None:
            return
        for client in list(self.clients.values()):
            self._drop(client, "the attempt ended")
        self.state = tcpstore.KeyValueStore(STORE_LIMIT)
        self.serving, self.warnings = True, 0
        self._want(self.listener.fileno(), selectors.EVENT_READ)

    # ---------------------------------------------------------------- what the event loop calls

    def changes(self) -> list:
        """[(fd, selector events)] to watch from now on, 0 for those to watch no more; the sockets let
        go of are closed here (the caller stops watching them at once, before anything is accepted)."""
        for sock in self.discarded:
            sock.close()
        self.discarded.clear()
        found = list(self.pending.items())
        for fd, events in found:
            if events:
                self.told[fd] = events
            else:
                self.told.pop(fd, None)
        self.pending.clear()
        return found

    def next_deadline(self) -> Optional[float]:
        return self.listener.next_deadline() if self.serving else None

    def tick(self, now: float) -> None:
        """Let go of the connections that never validated in time; accept again after a pause."""
        if self.listener is None:
            return
        for sock in self.listener.overdue(now):
            self._drop(self.clients[sock.fileno()], f"no VALIDATE within {VALIDATE_SECONDS:g} s")
        if self.serving:
            self._want(self.listener.fileno(), selectors.EVENT_READ if self.listener.accepting(now) else 0)

    def ready(self, fd: int, mask: int, now: float) -> None:
        """The listener or a client's socket is ready."""
        if self.listener is not None and fd == self.listener.fileno():
            self._accept(now)
            return
        client = self.clients.get(fd)
        if client is not None and mask & selectors.EVENT_WRITE:
            self._flush(client)
        if client is not None and client.alive and mask & selectors.EVENT_READ:
            self._read(client)
        if client is not None and client.alive:
            self._update(client)

    def drain(self, seconds: float, clock: Callable[[], float] = time.monotonic) -> None:
        """The job ended well here: workers still connected (another node's, whose launcher had not yet reached this
        one's: it ends without waiting for them) are served until they let go, up to ``seconds``. Those of a node
        that joined are gone by now, and so are this node's: their connections end at the first read. A connection
        that never validated is no worker's (torch's store client validates as it connects): let go at once."""
        for client in [c for c in self.clients.values() if not c.input.validated]:
            self._drop(client, "the job ended here, and it had not validated")
        self.changes()
        if self.listener is None or not self.clients:
            return
        deadline, said = clock() + seconds, False
        with selectors.DefaultSelector() as selector:
            while self.clients and clock() < deadline:
                for client in self.clients.values():
                    selector.register(client.sock, selectors.EVENT_READ | (selectors.EVENT_WRITE if client.out else 0))
                for key, mask in selector.select(min(0.5, max(0.0, deadline - clock()))):
                    self.ready(key.fd, mask, clock())
                for key in list(selector.get_map().values()):
                    selector.unregister(key.fileobj)
                if self.clients and not said:
                    log.info("rendezvous store: %d connection(s) of workers of other nodes still open; serving them "
                             "up to %g s", len(self.clients), seconds)
                    said = True
                self.changes()  # the sockets let go of, closed

    def close(self) -> None:
        for client in list(self.clients.values()):
            self._drop(client, "the launch ended")
        self.changes()
        self.serving = False
        if self.listener is not None:
            self.listener.close(keep_socket=self.listener.sock in self.reserved)

    # ---------------------------------------------------------------- connections

    def _accept(self, now: float) -> None:
        new, pushed_out = self.listener.accept(now)
        self._want(self.listener.fileno(), selectors.EVENT_READ if self.listener.accepting(now) else 0)
        for sock in pushed_out:
            self._drop(self.clients[sock.fileno()], "it had not validated, and newer connections came")
        for sock, address in new:
            peer = _peer(address)
            if len(self.clients) >= self.max_clients:
                self._warn(f"the rendezvous store {self._where()} holds {len(self.clients)} connections, as many as "
                           f"its open files allow (ulimit -n); the connection from {peer} is closed")
                self.listener.settled(sock)
                sock.close()
                continue
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            client = Client(sock, peer, now)
            self.clients[sock.fileno()] = client
            self._want(sock.fileno(), selectors.EVENT_READ)

    def _read(self, client: Client) -> None:
        try:
            data = client.sock.recv(RECV_BYTES)
        except (BlockingIOError, InterruptedError):
            return
        except OSError as e:
            self._drop(client, e.strerror or str(e))
            return
        if not data:
            self._drop(client, "it closed the connection")
            return
        client.input.feed(data)
        self._serve(client)
        if client.input.validated:
            self.listener.settled(client.sock)

    def _serve(self, client: Client) -> None:
        """Carry out the client's complete requests, while it takes its answers."""
        while len(client.out) < OUT_PAUSE:
            frame, problem = client.input.take()
            if problem:
                self._drop(client, problem)
                return
            if frame is None:
                break
            result = self.state.apply(client, frame)
            if result.full:
                self._drop(client, result.refused, warn=True)
                return
            if result.refused:
                self._drop(client, result.refused)
                return
            for to, data in result.replies:
                self._send(to, data)
            if not client.alive:
                return
        if client.held() > OUT_PAUSE and sum(c.held() for c in self.clients.values()) > BUFFER_LIMIT:
            self._drop(client, f"the store's clients hold over {BUFFER_LIMIT} bytes unread or unanswered", warn=True)

    def _send(self, client: Client, data: bytes) -> None:
        if client.alive:
            client.out += data
            if self._push(client):
                self._update(client)

    def _flush(self, client: Client) -> None:
        if self._push(client) and len(client.out) < OUT_PAUSE:
            self._serve(client)  # what it sent while it was not read

    def _push(self, client: Client) -> bool:
        """What the kernel takes of the client's replies now; False: the connection broke (the client let go)."""
        if send_buffered(client.sock, client.out):
            return True
        self._drop(client, "the connection broke")
        return False

    def _update(self, client: Client) -> None:
        events = (selectors.EVENT_READ if len(client.out) < OUT_PAUSE else 0)
        self._want(client.sock.fileno(), events | (selectors.EVENT_WRITE if client.out else 0))

    def _drop(self, client: Client, why: str, warn: bool = False) -> None:
        if not client.alive:
            return
        client.alive = False
        fd = client.sock.fileno()
        del self.clients[fd]
        self.listener.settled(client.sock)
        self.state.forget(client)
        self.discarded.append(client.sock)
        self._want(fd, 0)
        if warn:
            self._warn(f"the rendezvous store {self._where()} let go of the connection from {client.peer}: {why}")
        else:
            log.debug("rendezvous store: the connection from %s let go: %s", client.peer, why)

    def _want(self, fd: int, events: int) -> None:
        if self.told.get(fd, 0) != events or fd in self.pending:
            self.pending[fd] = events

    def _warn(self, text: str) -> None:
        self.warnings += 1
        if self.warnings <= WARNINGS:
            log.warning("%s", text)
        else:
            log.debug("%s", text)

    def _where(self) -> str:
        return f"on {self.spec.address}:{self.spec.port}"


def _peer(address) -> str:
    try:
        return f"{address[0]}:{address[1]}"
    except (TypeError, IndexError):
        return str(address)
