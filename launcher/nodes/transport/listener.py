"""One listening socket, as every server of the launcher listens: bound close-on-exec and non-blocking with a deep
accept queue, connections accepted in batches, a pause when the process is out of descriptors, a cap on the
connections not yet introduced, their hello's deadline, and a clean stop.

The listener knows no message. It keeps the connections it accepted until their owner says they are introduced
(``settled``: their hello heard, or closed): these pending ones are at most ``cap``, the oldest pushed out (handed
back to the owner to close) when a newer one comes, so that connections that never speak keep nobody out; the owner
asks which are past their hello's deadline (``overdue``). Out of descriptors (EMFILE, ENFILE, ENOBUFS, ENOMEM), it
stops accepting for ``PAUSE`` seconds, says so once, and accepts again: its owner's loop stops watching it meanwhile
(``registrations`` or ``watch_with``) and wakes by ``next_deadline``. Every time it is given is its owner's ``now``.
"""

from __future__ import annotations

import errno
import logging
import selectors
import socket
from contextlib import suppress
from typing import Optional

from launcher.output.messages import log

# The accept queue (the kernel caps it at net.core.somaxconn): as many launchers as join node 0 at once wait there. A
# shorter queue drops the connections past it, which the kernel then retries after 1, 3, 7, 15 s.
BACKLOG = 4096
MAX_PENDING = 64  # connections not yet introduced, at the least; past it the oldest is pushed out
ACCEPT_BATCH = 64  # connections accepted in one turn at most: the owner's other sockets are served between batches
PAUSE = 0.5  # seconds without accepting once the process is out of descriptors
SCARCE = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM})


def pending_cap(clients: int) -> int:
    """How many connections may wait for their hello: every client of the job may come at once (a burst of thousands
    of launchers is not a flood), and silent strangers past that push the oldest out."""
    return max(MAX_PENDING, clients)


def bind(host: str, port: Optional[int] = None, everywhere: bool = False, reuse: bool = True) -> socket.socket:
    """A listening socket on ``host``:``port`` (the family from ``host``; ``everywhere``: every address of that family;
    ``reuse``: SO_REUSEADDR), or on the unix address ``host`` when ``port`` is None; OSError when it cannot be had."""
    if port is None:
        family, address = socket.AF_UNIX, host
    else:
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        address = (("::" if family == socket.AF_INET6 else "0.0.0.0") if everywhere else host, port)
    sock = socket.socket(family, socket.SOCK_STREAM | socket.SOCK_NONBLOCK | socket.SOCK_CLOEXEC)
    try:
        if reuse and family != socket.AF_UNIX:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(address)
        sock.listen(BACKLOG)
    except OSError:
        sock.close()
        raise
    return sock


class Listener:
    """A server's listening socket (``bind``'s, or one reserved before and handed over) and its pending connections."""

    def __init__(self, sock: socket.socket, what: str, cap: int = MAX_PENDING,
                 hello_within: Optional[float] = None) -> None:
        sock.setblocking(False)
        sock.set_inheritable(False)
        sock.listen(BACKLOG)
        self.sock: Optional[socket.socket] = sock
        self.what = what  # who listens, for the log: "control", "the rendezvous store on HOST:PORT", ...
        self.cap = cap
        self.hello_within = hello_within  # seconds a connection may stay pending (None: no deadline)
        self.pending: dict = {}  # socket -> when it came, oldest first
        self.paused_until: Optional[float] = None
        self.short_said = False
        self.watched_by = None  # the selector ``watch_with`` registered it in

    def fileno(self) -> int:
        return self.sock.fileno() if self.sock is not None else -1

    def accepting(self, now: float) -> bool:
        """Whether it is to be watched now: open, and not pausing."""
        if self.paused_until is not None and now >= self.paused_until:
            self.paused_until = None
        return self.sock is not None and self.paused_until is None

    def registrations(self, now: float) -> dict:
        """{fd: selector events} for an owner that registers its sockets afresh at each turn."""
        return {self.sock.fileno(): selectors.EVENT_READ} if self.accepting(now) else {}

    def watch_with(self, selector, now: float, data=None) -> None:
        """For an owner that keeps its selector: this listener registered in it while accepting, not while pausing."""
        wanted = self.accepting(now)
        if wanted and self.watched_by is None:
            selector.register(self, selectors.EVENT_READ, data)
            self.watched_by = selector
        elif not wanted and self.watched_by is not None:
            self._unwatch()

    def next_deadline(self) -> Optional[float]:
        """When the owner's loop should come back: the end of a pause, the oldest pending connection's deadline."""
        times = [] if self.paused_until is None else [self.paused_until]
        if self.hello_within is not None and self.pending:
            times.append(next(iter(self.pending.values())) + self.hello_within)
        return min(times, default=None)

    def accept(self, now: float) -> tuple:
        """(new, pushed_out): the connections accepted now (a batch at most) as (socket, address), non-blocking and
        pending from ``now``; and the older pending sockets pushed out to make room, for the owner to close."""
        new: dict = {}
        pushed: list = []
        if not self.accepting(now):
            return [], []
        for _ in range(ACCEPT_BATCH):
            try:
                sock, address = self.sock.accept()
            except (BlockingIOError, InterruptedError):
                break
            except ConnectionAbortedError:
                continue
            except OSError as e:
                self._failed(e, now)
                break
            sock.setblocking(False)
            while len(self.pending) >= self.cap:
                oldest = next(iter(self.pending))
                del self.pending[oldest]
                if oldest in new:  # never seen by the owner
                    del new[oldest]
                    oldest.close()
                elif oldest.fileno() >= 0:
                    pushed.append(oldest)
            self.pending[sock] = now
            new[sock] = address
        return list(new.items()), pushed

    def settled(self, sock: socket.socket) -> None:
        """``sock`` is no longer pending: introduced (its hello heard), or closed."""
        self.pending.pop(sock, None)

    def overdue(self, now: float) -> list:
        """The pending sockets past their hello's deadline, no longer pending: for the owner to close."""
        late = []
        while self.hello_within is not None and self.pending:
            sock, came = next(iter(self.pending.items()))
            if now < came + self.hello_within:
                break
            del self.pending[sock]
            if sock.fileno() >= 0:
                late.append(sock)
        return late

    def close(self, keep_socket: bool = False) -> None:
        """Stop listening (the owner closes the connections it keeps; ``keep_socket``: a socket reserved by another,
        who closes it); a second close does nothing."""
        self._unwatch()
        if self.sock is not None and not keep_socket:
            self.sock.close()
        self.sock = None
        self.pending.clear()

    def _failed(self, e: OSError, now: float) -> None:
        if e.errno not in SCARCE:
            log.debug("%s: accept failed: %s", self.what, e)
            return
        self.paused_until = now + PAUSE
        text = "%s cannot accept a connection (%s): it tries again every %g s while descriptors are short"
        log.log(logging.DEBUG if self.short_said else logging.WARNING, text, self.what, e.strerror, PAUSE)
        self.short_said = True

    def _unwatch(self) -> None:
        if self.watched_by is not None:
            with suppress(KeyError, ValueError, OSError, RuntimeError):  # the selector was closed first
                self.watched_by.unregister(self)
        self.watched_by = None
