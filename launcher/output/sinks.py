"""Where a worker's output goes: its log file (followed onto the console) or pipes relayed to the
console, both behind one written interface, ``WorkerOutput``."""

from __future__ import annotations

import collections
import os
import time
from typing import Optional, Protocol, runtime_checkable

from launcher.output.console import console
from launcher.output.lines import CHUNK, TAIL_BYTES, TAIL_LINES, LineBuffer, last_lines_of, prefixed
from launcher.output.messages import log

FOLLOW_CHUNKS = 16  # at most this many chunks of a log file are echoed before the next event
ECHO_MAX_LAG = 64 << 20  # how far the console echo of a log file may fall behind the file


@runtime_checkable
class WorkerOutput(Protocol):
    """Where one worker's stdout and stderr go: what the supervisor asks of it, and all it asks.

    A new sink (a socket, a log collector) is a class with these members; ``FileOutput`` and
    ``PipeOutput`` are the two there are.
    """

    @property
    def follows(self) -> bool:
        """Whether ``follow`` copies output to the console (so that the event loop calls it)."""

    def child_fds(self) -> tuple:
        """The (stdout, stderr) descriptors the worker is started with."""

    def spawned(self) -> None:
        """The worker has started: the launcher closes its copies of the worker's descriptors."""

    def pipes(self) -> tuple:
        """The descriptors the event loop reads for this worker (none for a log file)."""

    def wants(self, fd: int) -> bool:
        """Whether to read ``fd`` of ``pipes`` now (not while the console it goes to is behind)."""

    def read_pipe(self, fd: int) -> bool:
        """Relay what is waiting on ``fd``; False at its end."""

    def follow(self) -> bool:
        """Copy new output to the console; True when there was some."""

    def last_written(self) -> Optional[float]:
        """When the worker last wrote (time.time()), None before it wrote anything."""

    def finish(self) -> None:
        """The worker is gone: what is left goes to the console's buffer, and the descriptors are closed."""

    def catch_up(self) -> None:
        """Relay what the worker wrote and the launcher has not read yet, without waiting (before its last lines are
        taken for a failure: its last words are often written just before it exits)."""

    def last_lines(self, n: int = TAIL_LINES) -> list:
        """The worker's last lines of this run, for the failure summary."""

    def bytes_written(self) -> int:
        """How many bytes the worker wrote in this run (the monitor's launcher_log_bytes_total)."""


class FileOutput:
    """--log_dir: the worker writes its log file itself; the launcher may follow it onto the console."""

    def __init__(self, path: str, fd: int, echo: bool, prefix: bytes = b"") -> None:
        self.path = path
        self._prefix = prefix  # before each echoed line (torchrun's --tee: the rank's label)
        self.start = os.lseek(fd, 0, os.SEEK_END)
        self._child_fd: Optional[int] = fd
        self._follow_fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK) if echo else None
        if self._follow_fd is not None:
            os.lseek(self._follow_fd, self.start, os.SEEK_SET)
        self._lines = LineBuffer()
        self._chunk = bytearray(CHUNK) if echo else None  # read into, chunk after chunk

    @property
    def follows(self) -> bool:
        return self._follow_fd is not None

    def child_fds(self):
        return self._child_fd, self._child_fd

    def spawned(self) -> None:
        if self._child_fd is not None:
            os.close(self._child_fd)
            self._child_fd = None

    def pipes(self):
        return ()

    def last_written(self) -> Optional[float]:
        try:
            st = os.stat(self.path)
        except OSError:
            return None
        return st.st_mtime if st.st_size > self.start else None

    def bytes_written(self) -> int:
        try:
            return max(0, os.stat(self.path).st_size - self.start)
        except OSError:
            return 0

    def wants(self, fd: int) -> bool:
        return False

    def read_pipe(self, fd: int) -> bool:
        raise AssertionError("a log file has no pipe")

    def follow(self) -> bool:
        if self._follow_fd is None:
            return False
        if console.stream(1).closed:  # nobody sees the echo any more: no more reading for it
            os.close(self._follow_fd)
            self._follow_fd = None
            return False
        self._catch_up()
        moved = False
        for _ in range(FOLLOW_CHUNKS):  # then back to the event loop, even if the worker writes on
            if not console.has_room(1):
                break  # the console is slow: the echo falls behind (see _catch_up)
            size = os.readv(self._follow_fd, [self._chunk])
            if size:
                lines, again = self._lines.take(self._chunk, size)
                if again:  # an unfinished line: read again once the worker has ended it
                    os.lseek(self._follow_fd, -again, os.SEEK_CUR)
                self._echo(lines)  # copied into the console's buffer at once
                moved = True
            if size < CHUNK:
                break
        return moved

    def _catch_up(self) -> None:
        """Keep the echo on the file: start over when the file was truncated in place (logrotate's
        copytruncate), and jump near the end when the echo fell far behind a worker that writes
        faster than the console takes (or the launcher would echo for minutes after the job)."""
        at = os.lseek(self._follow_fd, 0, os.SEEK_CUR)
        size = os.fstat(self._follow_fd).st_size
        if size < at:
            os.lseek(self._follow_fd, 0, os.SEEK_SET)
            self._lines = LineBuffer()
            self.start = 0
            log.debug("%s was truncated: following it from its start", self.path)
            return
        if size - at <= ECHO_MAX_LAG:
            return
        target = size - ECHO_MAX_LAG // 4
        head = os.pread(self._follow_fd, CHUNK, target)
        newline = head.find(b"\n")
        if newline < 0:
            return
        os.lseek(self._follow_fd, target + newline + 1, os.SEEK_SET)
        self._lines = LineBuffer()
        log.warning("the console fell %d MB behind %s: skipping to its latest lines (the file has them all)",
                    (target + newline + 1 - at) >> 20, self.path)

    def finish(self) -> None:
        """The rest of the echo goes into the console's buffer now, without waiting for the
        console, where a stop signal is only noted: a console nobody reads cannot hold up the
        launcher here. The launcher writes the buffer out at its end (``Console.finish``, bounded:
        a reader that does not read loses what it did not take, counted and said). The echo is
        never more than ECHO_MAX_LAG behind (``_catch_up``), and what is written after this call
        is not echoed."""
        if self._follow_fd is not None:
            if not console.stream(1).closed:
                self._catch_up()
                at = os.lseek(self._follow_fd, 0, os.SEEK_CUR)
                end = os.fstat(self._follow_fd).st_size
                while at < end:
                    data = os.read(self._follow_fd, min(CHUNK, end - at))
                    if not data:
                        break
                    at += len(data)
                    self._echo(self._lines.feed(data))
                self._echo(self._lines.rest())
            os.close(self._follow_fd)
            self._follow_fd = None
        self.spawned()

    def _echo(self, lines: bytes) -> None:
        console.write(1, prefixed(self._prefix, bytes(lines)) if self._prefix and lines else lines, self._lines)
        bar = self._lines.progress()
        if bar:
            console.draw(1, self._lines, self._prefix + bar)

    def catch_up(self) -> None:
        return None  # the file holds every line already

    def last_lines(self, n: int = TAIL_LINES) -> list:
        """The log's last lines since this run's header; none if the file was removed meanwhile."""
        try:
            with open(self.path, "rb") as f:
                size = f.seek(0, os.SEEK_END)
                self.start = min(self.start, size)
                begin = max(self.start, size - TAIL_BYTES)
                f.seek(begin)
                return last_lines_of(f.read(), n, cut=begin > self.start)
        except OSError:
            return []


class PipeOutput:
    """No --log_dir: the worker writes to pipes; whole lines reach the console, prefixed with its label."""

    def __init__(self, label: str) -> None:
        self.path = None
        self._prefix = f"[{label}] ".encode()
        self._out_r, self._out_w = os.pipe2(os.O_CLOEXEC)
        self._err_r, self._err_w = os.pipe2(os.O_CLOEXEC)
        self._streams = {self._out_r: (1, LineBuffer()), self._err_r: (2, LineBuffer())}
        self._tail = collections.deque(maxlen=TAIL_LINES)
        self._last_read: Optional[float] = None
        self._bytes = 0

    follows = False

    def child_fds(self):
        return self._out_w, self._err_w

    def spawned(self) -> None:
        for fd in (self._out_w, self._err_w):
            if fd is not None:
                os.close(fd)
        self._out_w = self._err_w = None

    def pipes(self):
        return tuple(self._streams)

    def wants(self, fd: int) -> bool:
        return console.has_room(self._streams[fd][0])

    def read_pipe(self, fd: int) -> bool:
        data = os.read(fd, CHUNK)
        self._last_read = time.time()
        self._bytes += len(data)
        dest, lines = self._streams[fd]
        if not data:
            self._emit(dest, lines, lines.rest())
            return False
        self._emit(dest, lines, lines.feed(data))
        return True

    def _emit(self, dest: int, source: LineBuffer, lines: bytes) -> None:
        if lines:
            console.write(dest, prefixed(self._prefix, lines), source)
            self._tail.extend(last_lines_of(lines, TAIL_LINES))
        bar = source.progress()
        if bar:
            console.draw(dest, source, self._prefix + bar)

    def follow(self) -> bool:
        return False

    def last_written(self) -> Optional[float]:
        return self._last_read

    def finish(self) -> None:
        for fd, (dest, lines) in list(self._streams.items()):
            self._emit(dest, lines, lines.feed(left_in(fd)))
            self._emit(dest, lines, lines.rest())
            os.close(fd)
        self._streams.clear()

    def catch_up(self) -> None:
        for fd, (dest, lines) in self._streams.items():
            data = left_in(fd)
            self._bytes += len(data)
            self._emit(dest, lines, lines.feed(data))

    def last_lines(self, n: int = TAIL_LINES) -> list:
        return list(self._tail)[-n:]

    def bytes_written(self) -> int:
        return self._bytes


def left_in(fd: int) -> bytes:
    """What a worker's pipe still holds at the end: the launcher stops reading a pipe while the
    console is behind, and that output goes to the console's buffer now rather than being lost
    (the console is written out at the launcher's end, bounded). Never waits: a process outside the
    job may still hold the pipe open; at most FOLLOW_CHUNKS reads."""
    data = bytearray()
    try:
        os.set_blocking(fd, False)
        for _ in range(FOLLOW_CHUNKS):
            chunk = os.read(fd, CHUNK)
            if not chunk:
                break
            data += chunk
    except OSError:  # BlockingIOError: nothing more for now
        pass
    return bytes(data)
