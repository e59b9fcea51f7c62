"""One of the launcher's standard streams, written without ever blocking: its pending output in
whole lines under a lock (the links log from threads of their own), bounded to HOLD bytes (the
oldest lines dropped and counted), a terminal's live last line drawn, erased and drawn again, and
the stream given up once it cannot be written any more. ``launcher.output.console`` holds the
streams of stdout and stderr and decides when to wait for them."""

from __future__ import annotations

import os
import re
import select
import stat
import threading
import unicodedata
from dataclasses import dataclass
from typing import Callable, Optional

HOLD = 80 << 20  # the most one stream holds, its oldest lines dropped beyond: more than the echo of a log file
# may be behind at the end (sinks.ECHO_MAX_LAG, 64 MB) with one piece of a long line (8 MB)
ERASE_LINE = b"\r\x1b[K"  # a terminal's cursor back to the line's start, and the line erased
ERASE_REST = b"\x1b[K"


@dataclass
class _Live:
    """The live last line of a terminal: a progress bar's latest state, and whose bar it is."""

    owner: object
    text: bytes
    drawn: bool = False


class Stream:
    """One of the launcher's standard streams, written without ever blocking.

    A terminal, pipe or FIFO is reopened through /proc/self/fd with O_NONBLOCK: a description of
    our own, so the flag never reaches the shell or the other programs sharing the terminal. A
    socket is written with MSG_DONTWAIT. A regular file (or /dev/null) cannot make a writer wait
    for a reader, and is written as it is. What cannot be written now waits in ``pending``.
    The launcher's links log from threads of their own: ``lock`` makes each change of ``pending``
    whole (a write in flight holds a view of it, which a resize from another thread breaks).
    """

    def __init__(self, fd: int, on_lost: Callable[["Stream", OSError], None] = lambda s, e: None) -> None:
        self.fd = fd
        self.out = fd
        self.pending = bytearray()
        self.lock = threading.RLock()
        self.closed = False
        self.on_lost = on_lost  # told once when the stream cannot be written any more
        self.owned = False  # self.out was opened here
        self.sock = None
        self.gated = False  # fallback: write only what poll says fits
        self.live: Optional[_Live] = None
        self.error: Optional[OSError] = None  # why it cannot be written any more
        self.mid_line = False  # what was written so far ends inside a line: ``pending`` starts with its rest
        self.stalled = False  # it took nothing in time at the end: not waited for again
        self.dropped_lines = 0  # dropped unread (not counted: what a lost stream would have got)
        self.dropped_bytes = 0
        try:
            mode = os.fstat(fd).st_mode
        except OSError:
            self.closed = True
            return
        self.tty = os.isatty(fd)
        if stat.S_ISSOCK(mode):
            import socket

            self.sock = socket.socket(fileno=os.dup(fd))
        elif stat.S_ISFIFO(mode) or os.isatty(fd):
            try:
                self.out = os.open(f"/proc/self/fd/{fd}", os.O_WRONLY | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOCTTY)
                self.owned = True
            except OSError:
                self.gated = True

    tty = False

    def add(self, data: bytes, owner: object = None) -> None:
        """Queue whole lines. A live line on screen is erased first, and drawn again after them,
        unless they are its owner's: its bar's line has ended."""
        with self.lock:
            self._add(data, owner)

    def _add(self, data: bytes, owner: object) -> None:
        if self.live is not None:
            data = ERASE_LINE + data
            if self.live.owner is owner:
                self.live = None
            else:
                self.live.drawn = False
        self.pending += data
        if len(self.pending) > HOLD:
            self._drop_oldest(len(self.pending) - HOLD)

    def _drop_oldest(self, excess: int) -> None:
        """Whole lines from the front of ``pending``, at least ``excess`` bytes; the rest of a
        line already written in part stays, so that no line reaches the reader cut."""
        start = self.pending.find(b"\n") + 1 if self.mid_line else 0
        end = self.pending.find(b"\n", start + excess - 1) + 1 or len(self.pending)
        self._count(start, end)
        del self.pending[start:end]

    def drop_pending(self) -> None:
        """What is still pending, dropped and counted (the end's bound is over)."""
        with self.lock:
            self._count(0, len(self.pending))
            self.discard()

    def discard(self) -> None:
        """What is pending, dropped without a word (after Ctrl-C: it may be on screen already)."""
        with self.lock:
            self.pending = bytearray()  # not .clear(): an error's traceback may still hold a view of it
            self.live = None

    def _count(self, start: int, end: int) -> None:
        self.dropped_lines += self.pending.count(b"\n", start, end)
        self.dropped_bytes += end - start

    def draw(self, owner: object, text: bytes) -> None:
        with self.lock:
            self.live = _Live(owner, text)

    def end_live(self) -> None:
        """A bar still drawn at the end is left on a line of its own."""
        with self.lock:
            if self.live is not None:
                self.pending += b"\n" if self.live.drawn else b""
                self.live = None

    def _redraw(self) -> bool:
        """Once all else is written: the live line, if it is not on screen as it is now."""
        if self.live is None or self.live.drawn:
            return False
        self.pending += b"\r" + fit(self.live.text, self._columns()) + ERASE_REST
        self.live.drawn = True
        return True

    def _columns(self) -> int:
        try:
            return os.get_terminal_size(self.fd).columns
        except OSError:
            return 0

    def push(self) -> None:
        """Write what is pending, as far as it goes without waiting. A stream lost is said after
        its lock is let go (the note goes to another stream, maybe from another thread)."""
        with self.lock:
            lost = self._push()
        if lost is not None:
            self.on_lost(self, lost)

    def _push(self) -> Optional[OSError]:
        while not self.closed and (self.pending or self._redraw()):
            try:
                n = self._write(memoryview(self.pending))
            except (BlockingIOError, InterruptedError):
                return None
            except OSError as e:  # a closed pipe (| head), a hung-up terminal, a full disk
                return self._lose(e)
            if n == 0:
                return None
            self.mid_line = self.pending[n - 1] != 0x0A
            del self.pending[:n]
        return None

    def _lose(self, e: OSError) -> OSError:
        """The console is a view: one that cannot be written any more is dropped, and the job goes on."""
        self.closed = True
        self.error = e
        self.discard()
        return e

    def _write(self, data) -> int:
        if self.sock is not None:
            import socket

            return self.sock.send(data, socket.MSG_DONTWAIT)
        if self.gated:
            if not select.select([], [self.out], [], 0)[1]:
                return 0
            return os.write(self.out, data[:select.PIPE_BUF])
        return os.write(self.out, data)

    @property
    def waiting(self) -> bool:
        return bool(self.pending) and not self.closed


_CSI = re.compile(r"\x1b\[[0-?]*[ -/]*[@-~]")  # a colour or cursor sequence: no column


def fit(text: bytes, columns: int) -> bytes:
    """``text`` cut to fill fewer than ``columns`` columns of a terminal (0: width unknown), so
    that redrawing it never wraps onto a new row."""
    if columns <= 0 or len(text) < columns:
        return text
    chars, kept, used, at = text.decode(errors="surrogateescape"), [], 0, 0
    while at < len(chars):
        sequence = _CSI.match(chars, at)
        width = 0 if sequence else _width(chars[at])
        if used + width >= columns:
            break
        end = sequence.end() if sequence else at + 1
        kept.append(chars[at:end])
        used, at = used + width, end
    return "".join(kept).encode(errors="surrogateescape")


def _width(char: str) -> int:
    if unicodedata.combining(char):
        return 0
    return 2 if unicodedata.east_asian_width(char) in "WF" else 1
