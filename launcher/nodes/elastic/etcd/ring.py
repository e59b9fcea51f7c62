"""The liveness ring of an etcd job: each launcher holds one TCP connection to the next live launcher (by the age of
their node keys, the last one to the first), so that a launcher whose process is gone is noticed at once, not when
its lease expires.

When a launcher's process ends (killed, crashed, its node's processes all gone while its kernel runs), the kernel
closes its sockets: the launcher before it in the ring sees its connection close (or refused, when it connects
afresh) and revokes the gone launcher's lease, which deletes its keys, so that every launcher learns of the loss
through its watch as of any other. A launcher that is alive but silent (stopped, partitioned, its machine powered
off) closes nothing: it is found when its lease expires, as before. Nothing is sent on a connection; the listener
only accepts and holds (one that says anything is no watcher: let go). The ring is driven by the link's thread (``link.EtcdLink``): ``follow`` names the launcher
to watch, ``registrations`` and ``ready`` serve its selector, and ``ready`` returns the launchers found gone.
"""

from __future__ import annotations

import errno
import selectors
import socket
import time
from dataclasses import dataclass
from typing import Optional

from launcher.nodes.transport.listener import Listener, bind
from launcher.output.messages import log

HELD_LIMIT = 4096  # connections the listener holds at most (one is expected; more are dropped, oldest first)


@dataclass(frozen=True)
class Peer:
    """A launcher the ring may watch: its node id, the lease its key is under, and its ring's address."""

    node_id: str
    lease: int
    address: tuple  # (host, port)


class Ring:
    def __init__(self) -> None:
        self.listener: Optional[Listener] = None
        self.held: dict = {}  # fd -> socket: connections from the launcher before this one (its listener's pending)
        self.watched: Optional[Peer] = None
        self.conn: Optional[socket.socket] = None  # to ``watched``
        self.connected = False

    def listen(self, host: str) -> Optional[tuple]:
        """Listen on ``host`` (a free port); the address to publish, or None where it cannot (no ring then)."""
        try:
            self.listener = Listener(bind(host, 0, reuse=False), "the liveness ring", HELD_LIMIT)
        except OSError as e:
            log.debug("elastic job: no liveness ring on %s (%s): a gone launcher is found when its lease expires",
                      host, e.strerror)
            return None
        return host, self.listener.sock.getsockname()[1]

    def follow(self, peer: Optional[Peer]) -> None:
        """Watch ``peer`` from now on (None: nobody); a connection to another one is closed."""
        if peer == self.watched:
            return
        self._drop_conn()
        self.watched = peer
        if peer is None:
            return
        try:
            family = socket.AF_INET6 if ":" in peer.address[0] else socket.AF_INET
            self.conn = socket.socket(family, socket.SOCK_STREAM | socket.SOCK_NONBLOCK | socket.SOCK_CLOEXEC)
            self.conn.connect_ex(peer.address)
        except (OSError, OverflowError, TypeError, ValueError):
            self._drop_conn()
            self.watched = None

    def registrations(self) -> dict:
        wanted = {}
        if self.listener is not None:
            wanted.update(self.listener.registrations(time.monotonic()))
        for fd in self.held:
            wanted[fd] = selectors.EVENT_READ
        if self.conn is not None:
            wanted[self.conn.fileno()] = selectors.EVENT_READ | (0 if self.connected else selectors.EVENT_WRITE)
        return wanted

    def watch_with(self, selector, own: int) -> None:
        """``selector`` made to watch what the ring wants watched now; its ``own`` descriptor is left as it is. Every
        one of the ring's is registered afresh (a handful): a closed socket's number may have been taken again."""
        for key in list(selector.get_map().values()):
            if key.fd != own:
                selector.unregister(key.fd)
        for fd, events in self.registrations().items():
            selector.register(fd, events)

    def ready(self, fd: int, mask: int) -> list:
        """What ``fd`` had: the Peer found gone (its connection closed or refused), in a list; else []."""
        if self.listener is not None and fd == self.listener.fileno():
            self._accept()
        elif fd in self.held:
            self._read_held(fd)
        elif self.conn is not None and fd == self.conn.fileno():
            return self._conn_ready(mask)
        return []

    def close(self) -> None:
        self._drop_conn()
        for sock in self.held.values():
            sock.close()
        self.held.clear()
        if self.listener is not None:
            self.listener.close()
            self.listener = None

    # ------------------------------------------------------------ inside

    def _conn_ready(self, mask: int) -> list:
        problem = self.conn.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
        if not self.connected and not problem and mask & selectors.EVENT_WRITE:
            self.connected = True
            return []
        if not problem:
            try:
                if self.conn.recv(1, socket.MSG_PEEK):
                    self.conn.recv(4096)  # nothing is sent on the ring: anything that comes is read and dropped
                    return []
            except (BlockingIOError, InterruptedError):
                return []
            except OSError as e:
                problem = e.errno or errno.ECONNRESET
        gone = self.watched
        self._drop_conn()
        self.watched = None
        if problem in (errno.ECONNREFUSED, errno.ECONNRESET, errno.EPIPE, 0):  # its process is gone
            return [gone]
        log.debug("elastic job: the ring's connection to %s failed (%s)", gone.node_id, errno.errorcode.get(problem))
        return []

    def _accept(self) -> None:
        """Every connection is held, silent (a watcher never speaks), up to HELD_LIMIT: past it the oldest goes."""
        new, pushed_out = self.listener.accept(time.monotonic())
        for sock in pushed_out:
            self.held.pop(sock.fileno(), None)
            sock.close()
        for sock, _ in new:
            self.held[sock.fileno()] = sock

    def _read_held(self, fd: int) -> None:
        """A held connection that says anything, or closes its end, is no watcher (or a gone one): let go."""
        sock = self.held[fd]
        try:
            sock.recv(1)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            pass
        del self.held[fd]
        self.listener.settled(sock)
        sock.close()

    def _drop_conn(self) -> None:
        if self.conn is not None:
            self.conn.close()
        self.conn = None
        self.connected = False


def successor(peers: list, node_id: str) -> Optional[Peer]:
    """The launcher after ``node_id`` in ``peers`` (in ring order: their keys' age), the first after the last; None
    when it is alone or not among them."""
    ids = [p.node_id for p in peers]
    if node_id not in ids or len(peers) < 2:
        return None
    return peers[(ids.index(node_id) + 1) % len(peers)]
