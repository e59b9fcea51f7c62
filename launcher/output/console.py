"""The launcher's stdout and stderr: written without ever blocking, in whole lines, a progress bar
as the live last line of a terminal, a console that cannot be written any more dropped; the
launcher's own messages (``messages.log``) and its one-sentence user errors are written there.

The console is a view: it holds at most HOLD bytes a stream (the oldest lines go first; each stream
is a ``launcher.output.console_stream.Stream``), and at the end it is given END_STALL seconds
without taking output, END_LIMIT in all, before what it still holds is dropped; what was dropped
is counted and said once (``Console.note``)."""

from __future__ import annotations

import logging
import os
import select
import threading
import time
from typing import Optional

from launcher.output.console_stream import Stream
from launcher.output.messages import MessageFormat, log

CONSOLE_BUFFER = 4 << 20  # output the console may hold before a worker's output waits
END_STALL = 0.5  # at the end, a console that has taken nothing for this long is not waited for
END_LIMIT = 3.0  # nor one still behind after this long: the job's end is never held longer


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

    def stream(self, fd: int) -> Stream:
        if fd not in self._streams:
            with self._making:
                if fd not in self._streams:
                    self._streams[fd] = self._twin(fd) or Stream(fd, self._lost)
        return self._streams[fd]

    def _lost(self, stream: Stream, e: OSError) -> None:
        """One note on stderr, if stderr still works (it is another stream)."""
        if self.say_lost and stream is not self.stream(2):
            log.warning("%s cannot be written any more (%s): what would go there is dropped from now on; "
                        "the job goes on", self._names(stream), e.strerror or e)

    def _names(self, stream: Stream) -> str:
        names = " and ".join(n for fd, n in ((1, "stdout"), (2, "stderr")) if self._streams.get(fd) is stream)
        return names or f"descriptor {stream.fd}"

    def _twin(self, fd: int) -> Optional[Stream]:
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
