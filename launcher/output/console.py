"""The launcher's stdout and stderr: written without ever blocking, in whole lines, a progress bar
as the live last line of a terminal, a console that cannot be written any more dropped; the
launcher's own messages (``messages.log``) and its one-sentence user errors are written there.

The console is a view: it holds at most HOLD bytes a stream (the oldest lines go first), and at
the end it is given END_STALL seconds without taking output, END_LIMIT in all, before what it still
holds is dropped; what was dropped is counted and said once (``Console.note``)."""

from __future__ import annotations

import logging
import os
import re
import select
import stat
import threading
import time
import unicodedata
from dataclasses import dataclass
from typing import Callable, Optional

from launcher.output.messages import MessageFormat, log

CONSOLE_BUFFER = 4 << 20  # output the console may hold before a worker's output waits
HOLD = 80 << 20  # the most one stream holds, its oldest lines dropped beyond: more than the echo of a log file
# may be behind at the end (sinks.ECHO_MAX_LAG, 64 MB) with one piece of a long line (8 MB)
END_STALL = 0.5  # at the end, a console that has taken nothing for this long is not waited for
END_LIMIT = 3.0  # nor one still behind after this long: the job's end is never held longer
ERASE_LINE = b"\r\x1b[K"  # a terminal's cursor back to the line's start, and the line erased
ERASE_REST = b"\x1b[K"


@dataclass
class _Live:
    """The live last line of a terminal: a progress bar's latest state, and whose bar it is."""

    owner: object
    text: bytes
    drawn: bool = False


class _Stream:
    """One of the launcher's standard streams, written without ever blocking.

    A terminal, pipe or FIFO is reopened through /proc/self/fd with O_NONBLOCK: a description of
    our own, so the flag never reaches the shell or the other programs sharing the terminal. A
    socket is written with MSG_DONTWAIT. A regular file (or /dev/null) cannot make a writer wait
    for a reader, and is written as it is. What cannot be written now waits in ``pending``.
    The launcher's links log from threads of their own: ``lock`` makes each change of ``pending``
    whole (a write in flight holds a view of it, which a resize from another thread breaks).
    """

    def __init__(self, fd: int, on_lost: Callable[["_Stream", OSError], None] = lambda s, e: None) -> None:
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


class Console:
    """The launcher's stdout (1) and stderr (2). Writes never block the event loop.

    The launcher's own messages are always taken (up to HOLD). Bulk output (a worker's lines) is
    offered only while ``has_room``: without --log_dir the launcher stops reading that worker's
    pipe until the console catches up (the worker then waits on its own write, as it would on a
    paused terminal); with --log_dir the echo of the log file falls behind, and skips ahead with a
    note if it falls too far (the file keeps every line). ``finish`` ends it, bounded.
    """

    def __init__(self, limit: int = CONSOLE_BUFFER) -> None:
        self.limit = limit
        self.abandoned = False
        self.say_lost = True  # a stream lost is said on stderr (a tool ends instead: it checks ``closed``)
        self.note: Optional[str] = None  # what the console dropped unread, once said
        self._streams: dict = {}
        self._making = threading.Lock()  # one stream a descriptor, whichever thread writes first

    def abandon(self) -> None:
        """The user asked the launcher to stop (a stop signal) while a console nobody reads holds
        output: ``finish`` then writes only what the console takes at once, and does not wait."""
        self.abandoned = True

    def stream(self, fd: int) -> _Stream:
        if fd not in self._streams:
            with self._making:
                if fd not in self._streams:
                    self._streams[fd] = self._twin(fd) or _Stream(fd, self._lost)
        return self._streams[fd]

    def _lost(self, stream: _Stream, e: OSError) -> None:
        """One note on stderr, if stderr still works (it is another stream)."""
        if self.say_lost and stream is not self.stream(2):
            log.warning("%s cannot be written any more (%s): what would go there is dropped from now on; "
                        "the job goes on", self._names(stream), e.strerror or e)

    def _names(self, stream: _Stream) -> str:
        names = " and ".join(n for fd, n in ((1, "stdout"), (2, "stderr")) if self._streams.get(fd) is stream)
        return names or f"descriptor {stream.fd}"

    def _twin(self, fd: int) -> Optional[_Stream]:
        """The stream already made for the same file, when stdout and stderr are one (``2>&1 |
        tee``, a terminal): they share one buffer, so that a write to one never lands in the
        middle of a line the other could only write in part."""
        try:
            st = os.fstat(fd)
        except OSError:
            return None
        for other, s in self._streams.items():
            try:
                o = os.fstat(other)
            except OSError:
                continue
            if (o.st_dev, o.st_ino) == (st.st_dev, st.st_ino):
                return s
        return None

    def _unique(self) -> list:
        return list({id(s): s for s in self._made()}.values())

    def _made(self) -> list:
        """The streams made so far (another thread may make one meanwhile)."""
        with self._making:
            return list(self._streams.values())

    def write(self, fd: int, data: bytes, owner: object = None) -> None:
        """Whole lines; ``owner`` is the source of a live line they may end (see ``draw``)."""
        s = self.stream(fd)
        if data and not s.closed:
            s.add(data, owner)
            s.push()

    def draw(self, fd: int, owner: object, text: bytes) -> None:
        """On a terminal, ``text`` (a progress bar's latest state) becomes the live last line: drawn
        over the one before, erased by any other line and drawn again below it, ended by its
        owner's next line. Elsewhere nothing: the bar shows when its line ends."""
        s = self.stream(fd)
        if s.tty and not s.closed:
            s.draw(owner, text)
            s.push()

    def has_room(self, fd: int) -> bool:
        return len(self.stream(fd).pending) < self.limit

    def waiting(self) -> dict:
        """{descriptor to wait on for writing: stream} for the streams with output pending."""
        return {s.out: s for s in self._made() if s.waiting}

    def wait(self, seconds: float) -> None:
        """Until a stream with output pending can take some of it, at most ``seconds``; then write."""
        waiting = self.waiting()
        if not waiting:
            time.sleep(seconds)
            return
        select.select([], list(waiting), [], seconds)
        for s in waiting.values():
            s.push()

    def discard(self, fd: int) -> None:
        """What ``fd``'s stream holds, dropped without a word (after Ctrl-C: it may be on screen already)."""
        self.stream(fd).discard()

    def finish(self, stall: float = END_STALL, limit: float = END_LIMIT) -> None:
        """Write what is pending while the reader keeps taking it: not once it has taken nothing
        for ``stall`` seconds, nor after ``limit`` seconds in all, nor after ``abandon`` (then only
        what the console takes at once). What is left is dropped, counted, and said once. A bar
        still drawn (its worker never ended its line) is left on a line of its own."""
        for s in self._unique():
            s.end_live()
        started = moved = time.monotonic()
        while not self.abandoned:
            waiting = {fd: s for fd, s in self.waiting().items() if not s.stalled}
            now = time.monotonic()
            left = min(stall - (now - moved), limit - (now - started))
            if not waiting or left <= 0:
                break
            select.select([], list(waiting), [], min(left, 0.1))
            for s in waiting.values():
                before = len(s.pending)
                s.push()
                moved = time.monotonic() if len(s.pending) < before else moved
        for s in self._unique():
            s.push()
            if s.waiting:
                s.stalled = True
                s.drop_pending()
        self._say_dropped()

    def _say_dropped(self) -> None:
        """Once: what the console dropped unread, on stderr if it takes it now (and in ``note``,
        for the state file)."""
        dropped = [s for s in self._unique() if s.dropped_bytes]
        if self.note is not None or not dropped:
            return
        lines, size = sum(s.dropped_lines for s in dropped), sum(s.dropped_bytes for s in dropped)
        self.note = (f"the console dropped {lines} line(s) ({_size(size)}) of {' and '.join(map(self._names, dropped))} "
                     "that were not read in time (the console is a view: with --log_dir the workers' log files "
                     "have every line)")
        log.warning(self.note)
        err = self.stream(2)
        if err.stalled:
            err.discard()  # not read in time: the note is not waited for either

    def reset(self) -> None:
        """The console as new: the streams it made are closed and forgotten (the descriptors they
        stand for are looked at again on the next write), and it is no longer abandoned."""
        self.abandoned = False
        for s in self._unique():
            if s.owned:
                os.close(s.out)
            if s.sock is not None:
                s.sock.close()
        self._streams.clear()
        self.note = None
        self.abandoned = False


def _size(n: int) -> str:
    return f"{n / 1e6:.1f} MB" if n >= 100_000 else f"{n} bytes"


console = Console()


class ConsoleHandler(logging.Handler):
    def emit(self, record: logging.LogRecord) -> None:
        try:
            console.write(2, (self.format(record) + "\n").encode(errors="replace"))
        except Exception:
            self.handleError(record)


def setup_messages(level: int) -> None:
    handler = ConsoleHandler()
    handler.setFormatter(MessageFormat())
    log.handlers[:] = [handler]
    log.setLevel(level)
    log.propagate = False


def error(message: str) -> None:
    """A one-sentence user error, whatever the log level."""
    console.write(2, f"launcher: error: {message}\n".encode(errors="replace"))


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
