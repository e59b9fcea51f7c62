"""The launcher's end of the local channel to its own workers (``launcher.local_channel``), served by the event
loop: an abstract Unix socket (no file, no port), one connection per worker that connects, every socket
non-blocking with buffers of its own.

A connection is kept only when the kernel names its process as one of this launcher's workers (SO_PEERCRED)
and that process proves the launch's key on the launcher's nonce; the launcher proves the key back in its
welcome. Anything else (another process, a wrong proof, a line that is not a message, a message too long or
out of turn) loses the connection, never the launcher: the worker is then restarted as a program that did
not opt in would be. What a worker says reaches the event loop as ``Said`` events; the launcher's word goes
out with ``send``.
"""

from __future__ import annotations

import os
import secrets
import selectors
import socket
import struct
import time
from dataclasses import dataclass, field
from typing import Callable, Optional

from launcher import envvars as ev
from launcher import local_channel as lc
from launcher.nodes.transport.connection import send_buffered
from launcher.nodes.transport.listener import BACKLOG, Listener, bind
from launcher.output.messages import log

RECV_BYTES = 64 * 1024
HELLO_WITHIN = 30.0  # seconds a worker's connection may go without its hello (it says it at once)
OUT_LIMIT = 64 << 20  # bytes waiting for one worker to read them: past this, the worker is let go
PEERCRED = struct.Struct("3i")  # pid, uid, gid


@dataclass(eq=False)
class Connection:
    """A worker's connection: challenged on ``nonce``, welcomed once it proved the key; its bytes in and out."""

    sock: socket.socket
    pid: int
    nonce: str
    welcomed: bool = False
    into: bytearray = field(default_factory=bytearray)
    out: bytearray = field(default_factory=bytearray)


@dataclass(frozen=True)
class Said:
    """A worker's message, once it proved the key: ``hello`` (``keep``: it re-enters in place) or ``parked``."""

    pid: int
    message: dict


class WorkerChannel:
    """Only this launcher's workers may connect (``is_worker(pid)``, and the launcher their parent): not their
    children, a data loader's, even once the launcher adopted them as orphans."""

    def __init__(self, run_id: str, welcome: Callable[[], dict], is_worker: Callable[[int], bool],
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.name = f"@launcher-{run_id}-{secrets.token_hex(8)}"
        self.key = lc.new_secret()
        self.is_worker = is_worker
        self.welcome = welcome  # what the welcome says besides its proof: the round, how long to wait for a stop
        self.clock = clock
        self.listener: Optional[Listener] = None
        self.connections: dict = {}  # fd -> Connection
        self.by_pid: dict = {}  # pid -> Connection, once welcomed

    def env(self) -> dict:
        """What each worker is given to find the channel."""
        return {ev.CONTROL_SOCKET: self.name, ev.CONTROL_KEY: self.key} if self.listener is not None else {}

    def listen(self) -> None:
        try:
            # its own workers only, one connection each, stay pending (the others are closed at once): all of them may
            # connect at once, however many there are
            self.listener = Listener(bind(lc.address(self.name)), "local channel", cap=BACKLOG,
                                     hello_within=HELLO_WITHIN)
        except OSError as e:
            log.warning("no local channel to the workers (%s): they are restarted at each round", e.strerror)

    def registrations(self) -> dict:
        if self.listener is None:
            return {}
        return {**self.listener.registrations(self.clock()),
                **{fd: selectors.EVENT_READ | (selectors.EVENT_WRITE if c.out else 0) for fd, c in self.connections.items()}}

    def ready(self, fd: int, mask: int) -> list:
        if self.listener is not None and fd == self.listener.fileno():
            self._accept()
            return []
        c = self.connections.get(fd)
        if c is None:
            return []
        if mask & selectors.EVENT_WRITE:
            self._flush(c)
        if mask & selectors.EVENT_READ and fd in self.connections:
            return self._read(c)
        return []

    def tick(self, now: float) -> None:
        """Let go of the connections that said no hello within HELLO_WITHIN."""
        for sock in self.listener.overdue(now) if self.listener is not None else ():
            c = self.connections.get(sock.fileno())
            if c is not None:
                self._drop(c, f"it said no hello within {HELLO_WITHIN:g} s")

    def next_deadline(self) -> Optional[float]:
        """When the event loop should come back: the end of the listener's pause (out of descriptors), the oldest
        connection's hello deadline."""
        return self.listener.next_deadline() if self.listener is not None else None

    def send(self, pid: int, message: dict, fds: tuple = ()) -> bool:
        """Queue ``message`` for the worker ``pid``; False when it has no welcomed connection. ``fds``: descriptors
        passed with it (SCM_RIGHTS, on its first byte), only when nothing else waits to go to that worker."""
        c = self.by_pid.get(pid)
        if c is None:
            return False
        data = lc.encode(message)
        if fds:
            if c.out:
                return False
            try:
                sent = lc.send_with_fds(c.sock, data, fds)
            except (BlockingIOError, InterruptedError):
                return False
            except OSError:
                self._close(c)
                return False
            data = data[sent:]
        c.out += data
        if len(c.out) > OUT_LIMIT:
            self._drop(c, "it does not read what the launcher tells it")
            return False
        self._flush(c)
        return pid in self.by_pid

    def connected(self, pid: int) -> bool:
        return pid in self.by_pid

    def can_pass(self, pid: int) -> bool:
        """Whether descriptors can go to the worker ``pid`` now (``send(..., fds)``): connected, nothing waiting."""
        c = self.by_pid.get(pid)
        return c is not None and not c.out

    def forget(self, pid: int) -> None:
        c = self.by_pid.get(pid)
        if c is not None:
            self._close(c)

    def close(self) -> None:
        for c in list(self.connections.values()):
            self._close(c)
        if self.listener is not None:
            self.listener.close()
            self.listener = None

    # ------------------------------------------------------------ inside

    def _accept(self) -> None:
        new, pushed_out = self.listener.accept(self.clock())
        for sock in pushed_out:  # connections that never said hello, the oldest past the listener's cap
            if sock.fileno() in self.connections:
                self._close(self.connections[sock.fileno()])
        for sock, _ in new:
            pid = PEERCRED.unpack(sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, PEERCRED.size))[0]
            if _parent_of(pid) != os.getpid() or not self.is_worker(pid):
                log.debug("local channel: process %d is not a worker of this launcher; closed", pid)
                self.listener.settled(sock)
                sock.close()
                continue
            for older in [o for o in self.connections.values() if o.pid == pid and not o.welcomed]:
                self._close(older)  # one connection waiting for its hello per worker: the newest
            c = Connection(sock, pid, lc.new_secret())
            self.connections[sock.fileno()] = c
            c.out += lc.encode({"t": lc.CHALLENGE, "nonce": c.nonce})
            self._flush(c)

    def _read(self, c: Connection) -> list:
        try:
            data = c.sock.recv(RECV_BYTES)
        except (BlockingIOError, InterruptedError):
            return []
        except OSError:
            data = b""
        if not data:
            self._close(c)
            return []
        c.into += data
        said = []
        while c.sock.fileno() in self.connections:
            end = c.into.find(b"\n")
            if end < 0:
                if len(c.into) > lc.MAX_LINE:
                    self._drop(c, "a message longer than the channel takes")
                break
            line, c.into = bytes(c.into[:end]), c.into[end + 1:]
            message = lc.decode(line)
            if message is None:
                self._drop(c, "a line that is not a message")
            elif not c.welcomed:
                said += self._hello(c, message)
            else:
                said.append(Said(c.pid, message))
        return said

    def _hello(self, c: Connection, message: dict) -> list:
        nonce = message.get("nonce")
        if message["t"] != lc.HELLO or not isinstance(nonce, str) or len(nonce) > 128 \
                or not lc.proven(self.key, "worker", message.get("proof"), c.nonce, nonce):
            self._drop(c, "it did not prove the launch's key")
            return []
        old = self.by_pid.get(c.pid)
        if old is not None:  # a worker connects once; a second connection replaces the first
            self._close(old)
        c.welcomed = True
        self.listener.settled(c.sock)
        self.by_pid[c.pid] = c
        c.out += lc.encode({**self.welcome(), "t": lc.WELCOME, "proof": lc.proof(self.key, "launcher", c.nonce, nonce)})
        self._flush(c)
        return [Said(c.pid, message)] if c.pid in self.by_pid else []

    def _flush(self, c: Connection) -> None:
        if not send_buffered(c.sock, c.out):
            self._close(c)

    def _drop(self, c: Connection, why: str) -> None:
        log.warning("local channel: process %d let go: %s", c.pid, why)
        self._close(c)

    def _close(self, c: Connection) -> None:
        fd = c.sock.fileno()
        if fd >= 0:
            self.connections.pop(fd, None)
        if self.by_pid.get(c.pid) is c:
            del self.by_pid[c.pid]
        if self.listener is not None:
            self.listener.settled(c.sock)
        c.sock.close()


def _parent_of(pid: int) -> Optional[int]:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return int(f.read().rsplit(b")", 1)[1].split()[1])
    except (OSError, IndexError, ValueError):
        return None
