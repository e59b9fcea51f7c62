"""torchrun's --duplicate-stdout-filters and --duplicate-stderr-filters: a worker's teed stream reaches its log file
through a pipe the launcher reads, which writes it on to the log file and copies each line that contains one of the
filters, after the worker's label, to the log dir's filtered_stdout.log or filtered_stderr.log (``FilteredOutput``)."""

from __future__ import annotations

import os
from typing import Optional

from launcher.output.lines import CHUNK, TAIL_LINES, LineBuffer, write_all
from launcher.output.messages import log
from launcher.output.sinks import WorkerOutput, left_in
from launcher.plan.streams import ERR, OUT



class LineFilter:
    """Whole lines out of a stream (as ``lines.LineBuffer`` cuts them), and those that contain one of ``filters``
    (each byte string) with ``prefix``."""

    def __init__(self, filters, prefix: bytes) -> None:
        self.filters = tuple(f.encode(errors="surrogateescape") for f in filters)
        self.prefix = prefix
        self.lines = LineBuffer()

    def feed(self, data: bytes) -> bytes:
        """The matching whole lines of what came so far (a line longer than MAX_PARTIAL_LINE is taken as it is)."""
        return self._matching(self.lines.feed(data))

    def rest(self) -> bytes:
        """The unfinished last line, if it matches, ended with a newline."""
        rest, self.lines.partial = self.lines.partial, b""
        return self._matching(rest + b"\n") if rest else b""

    def _matching(self, lines: bytes) -> bytes:
        if not lines:
            return b""
        kept = [self.prefix + line + b"\n" for line in lines[:-1].split(b"\n") if any(f in line for f in self.filters)]
        return b"".join(kept)


class _Copy:
    """One duplicated stream: the pipe the worker writes it to, the log file it goes on to, the filtered file."""

    def __init__(self, dest: int, path: str, filters, prefix: bytes) -> None:
        self.dest = os.dup(dest)  # the log file, opened for appending (the worker's own descriptor is closed)
        self.path = path
        self.read_fd, self.write_fd = os.pipe2(os.O_CLOEXEC)
        self.lines = LineFilter(filters, prefix)
        self.copy_fd: Optional[int] = None
        self.failed = False

    def take(self, data: bytes) -> None:
        write_all(self.dest, data)
        self._copy(self.lines.feed(data))

    def end(self) -> None:
        self._copy(self.lines.rest())

    def _copy(self, lines: bytes) -> None:
        """Matching lines appended in one write (every rank's copy shares the file: whole lines never mix)."""
        if not lines or self.failed:
            return
        try:
            if self.copy_fd is None:
                self.copy_fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o644)
            write_all(self.copy_fd, lines)
        except OSError as e:
            self.failed = True
            log.warning("could not write %s (%s); its lines are not copied from here on", self.path, e.strerror or e)

    def close(self) -> None:
        for fd in (self.write_fd, self.read_fd, self.dest, self.copy_fd):
            if fd is not None:
                os.close(fd)
        self.write_fd = self.read_fd = self.dest = self.copy_fd = None


class FilteredOutput:
    """A worker's output (``inner``, whose log file takes the streams in ``duplicates``) with each of those streams
    through a pipe of the launcher's: written on to the log file as it comes, whole lines that match copied to the
    filtered file. Everything else is ``inner``'s: the console's echo of the log file, its last lines, its size."""

    def __init__(self, inner: WorkerOutput, label: str, duplicates) -> None:
        """``duplicates``: launcher.plan.streams.Duplicate, one per stream to filter."""
        self.inner = inner
        self.path = getattr(inner, "path", None)
        prefix = f"[{label}] ".encode()
        fds = inner.child_fds()
        self._copies: dict = {}  # OUT or ERR -> _Copy
        try:
            for d in duplicates:
                self._copies[d.stream] = _Copy(fds[0 if d.stream == OUT else 1], d.path, d.filters, prefix)
        except OSError:
            self._close_copies()
            raise
        self._by_fd = {c.read_fd: c for c in self._copies.values()}

    @property
    def follows(self) -> bool:
        return self.inner.follows

    def child_fds(self):
        out, err = self.inner.child_fds()
        copies = self._copies
        return (copies[OUT].write_fd if OUT in copies else out), (copies[ERR].write_fd if ERR in copies else err)

    def spawned(self) -> None:
        self.inner.spawned()
        for c in self._copies.values():
            if c.write_fd is not None:
                os.close(c.write_fd)
                c.write_fd = None

    def pipes(self):
        return tuple(self.inner.pipes()) + tuple(self._by_fd)

    def wants(self, fd: int) -> bool:
        return True if fd in self._by_fd else self.inner.wants(fd)

    def read_pipe(self, fd: int) -> bool:
        copy = self._by_fd.get(fd)
        if copy is None:
            return self.inner.read_pipe(fd)
        data = os.read(fd, CHUNK)
        if not data:
            copy.end()
            return False
        self._take(copy, data)
        return True

    def _take(self, copy: _Copy, data: bytes) -> None:
        try:
            copy.take(data)
        except OSError as e:  # the log file is full or gone: lost there, as the worker's own writes would be
            log.warning("could not write %s (%s)", self.path, e.strerror or e)

    def follow(self) -> bool:
        return self.inner.follow()

    def last_written(self) -> Optional[float]:
        return self.inner.last_written()

    def finish(self) -> None:
        """What the pipes still hold goes to the log file (and its copy) first, then ``inner`` ends its echo."""
        for copy in self._copies.values():
            if copy.read_fd is not None:
                self._take(copy, left_in(copy.read_fd))
                copy.end()
        self._close_copies()
        self.inner.finish()

    def _close_copies(self) -> None:
        for copy in self._copies.values():
            copy.close()
        self._by_fd = {}

    def catch_up(self) -> None:
        self.inner.catch_up()

    def last_lines(self, n: int = TAIL_LINES) -> list:
        return self.inner.last_lines(n)

    def bytes_written(self) -> int:
        return self.inner.bytes_written()
