"""This worker's end of its launcher's local channel (``launcher.local_channel``): connect and prove the key both
ways, then one thread reads the launcher's word: the round is over (``stop``), the next round's variables and
output descriptors (``round``). And a warm worker's wait for its first round (``await_first_round``, --warm_start)."""

from __future__ import annotations

import logging
import os
import socket
import sys
import threading
from contextlib import suppress
from typing import Callable, Optional

from launcher import envvars as ev
from launcher import local_channel as lc

log = logging.getLogger("launcher.runtime.elastic")

CONNECT_TIMEOUT = 10.0  # the launcher's welcome


class LauncherGone(SystemExit):
    """The launcher closed its channel while this worker waited for the next round: there is none."""


class Lines:
    """The launcher's lines off the channel's socket, and the descriptors that came with them (SCM_RIGHTS)."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.buffer = bytearray()
        self.fds: list = []

    def readline(self, limit: Optional[int]) -> bytes:
        """The next line, its newline included; b"" at the end (or past ``limit`` bytes without one)."""
        while True:
            end = self.buffer.find(b"\n")
            if end >= 0:
                line, self.buffer = bytes(self.buffer[:end + 1]), self.buffer[end + 1:]
                return line
            if limit is not None and len(self.buffer) > limit:
                return b""
            data, fds = lc.receive_with_fds(self.sock, 65536)
            self.fds += fds
            if not data:
                return b""
            self.buffer += data

    def take_fds(self, count: int) -> list:
        taken, self.fds = self.fds[:count], self.fds[count:]
        return taken


class Channel:
    """This worker's end of its launcher's local channel: one thread reads the launcher's word."""

    def __init__(self, sock: socket.socket, lines: Lines, welcome: dict) -> None:
        self.sock = sock
        self.lines = lines
        self.reform_wait = float(welcome.get("reform_wait") or 0)
        self.stopped = threading.Event()  # the launcher said the round is over
        self.rounds: list = []  # the next rounds: (variables, output descriptors), in order
        self.gone = False
        self.changed = threading.Condition()
        self.on_stop: Callable[[], None] = lambda: None  # aborts the process group of the round
        self.thread = threading.Thread(target=self._read, name="launcher-channel", daemon=True)
        self.thread.start()

    @classmethod
    def connect(cls, env, keep: bool) -> Optional["Channel"]:
        """The launcher's channel named in ``env``, after both sides proved the key; None without one."""
        name, key = env.get(ev.CONTROL_SOCKET), env.get(ev.CONTROL_KEY)
        if not name or not key:
            return None
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
        sock.settimeout(CONNECT_TIMEOUT)
        lines = Lines(sock)
        try:
            sock.connect(lc.address(name))
            challenge = lc.decode(lines.readline(lc.MAX_LINE))
            if not challenge or challenge.get("t") != lc.CHALLENGE or not isinstance(challenge.get("nonce"), str):
                raise OSError("no challenge from the launcher")
            nonce = lc.new_secret()
            sock.sendall(lc.encode({"t": lc.HELLO, "nonce": nonce, "pid": os.getpid(), "keep": keep,
                                    "proof": lc.proof(key, "worker", nonce, challenge["nonce"])}))
            welcome = lc.decode(lines.readline(lc.MAX_LINE))
            if not welcome or welcome.get("t") != lc.WELCOME or \
                    not lc.proven(key, "launcher", welcome.get("proof"), nonce, challenge["nonce"]):
                raise OSError("the launcher did not prove the key")
        except (OSError, ValueError) as e:
            sock.close()
            log.warning("launcher.runtime.elastic: no channel to the launcher (%s): this worker is restarted at "
                        "each membership change", e)
            return None
        sock.settimeout(None)
        return cls(sock, lines, welcome)

    def _read(self) -> None:
        while True:
            try:
                line = self.lines.readline(None)  # the launcher proved the key: its word is taken whole
            except (OSError, ValueError):
                line = b""
            if not line:
                with self.changed:
                    self.gone = True
                    self.changed.notify_all()
                return
            message = lc.decode(line, limit=None)
            if message is None:
                continue
            round_ = lc.round_of(message)
            if message["t"] == lc.STOP:
                self.stopped.set()
                self.on_stop()
                with self.changed:
                    self.changed.notify_all()
            elif round_ is not None:
                with self.changed:
                    self.rounds.append((round_[0], self.lines.take_fds(round_[1])))
                    self.changed.notify_all()

    def round_over(self, wait: float) -> bool:
        """Whether the launcher says the round is over, waiting up to ``wait`` seconds for its word."""
        return self.stopped.wait(wait)

    def next_round(self) -> dict:
        """The next round's variables, once the launcher gives them (``LauncherGone`` if it leaves first); this
        process's standard output and error go where that round's worker's go (its log by its new rank)."""
        with self.changed:
            while not self.rounds and not self.gone:
                self.changed.wait()
            if not self.rounds:
                raise LauncherGone(1)
            self.stopped.clear()
            env, fds = self.rounds.pop(0)
        _redirect(fds)
        return env

    def parked(self) -> None:
        with suppress(OSError):
            self.sock.sendall(lc.encode({"t": lc.PARKED}))


def _redirect(fds: list) -> None:
    """Standard output and error onto the round's (the first two of ``fds``); every one of ``fds`` closed."""
    for stream in (sys.stdout, sys.stderr):
        with suppress(OSError, ValueError):
            stream.flush()
    for target, fd in zip((1, 2), fds):
        os.dup2(fd, target)
    for fd in fds:
        os.close(fd)


def await_first_round() -> None:
    """A worker started warm (``--warm_start``, ``launcher.run.warm``): say it is ready on the socket its launcher gave
    it, wait there for its first round, and take that round's variables and output (``LauncherGone`` if the launcher
    lets it go first). Nothing for any other worker."""
    fd = os.environ.pop(ev.WARM_FD, None)
    if fd is None:
        return
    try:
        sock = socket.socket(fileno=int(fd))
        sock.sendall(lc.READY)
        lines = Lines(sock)
        message = lc.decode(lines.readline(None), limit=None)  # the launcher's own end of a socket pair: taken whole
    except (OSError, ValueError):
        raise LauncherGone(1) from None
    round_ = lc.round_of(message) if message else None
    if round_ is None:
        raise LauncherGone(1)
    env, fds = round_[0], lines.take_fds(round_[1])
    sock.close()
    progress = fds.pop() if message.get("progress") is True and len(fds) > 2 else None
    os.environ.clear()
    os.environ.update(env)
    if progress is not None:  # the launcher's page of this worker, at the number it came on here
        os.set_inheritable(progress, False)
        os.environ[ev.PROGRESS_FD] = str(progress)
    _redirect(fds)
