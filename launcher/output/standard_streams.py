"""The launcher's standard streams as Python sees them: descriptors 0-2 always open, sys.stdout
for the operator tools and --help (its write errors told apart: ``StdoutLost``), sys.stderr
written through the console (never blocking), and the bounded end of all output.

sys.stdout blocks: what is written there (--help, --version, ``status``, ``logs`` without -f) is
a dump whose reader decides how fast it goes, and no job waits on it. Everything of a running job
goes through ``console`` instead, which never blocks and is bounded at the end.
"""

from __future__ import annotations

import errno
import io
import os
import sys
from contextlib import suppress

from launcher.output.console import console, error


class StdoutLost(Exception):
    """Writing sys.stdout (--help, --version, status, logs) failed: ``| head`` has what it wanted,
    or the disk is full. Told apart from any other OSError of the launcher."""

    def __init__(self, error: OSError) -> None:
        super().__init__(str(error))
        self.error = error


class _Stdout(io.FileIO):
    def write(self, data) -> int:
        try:
            return super().write(data)
        except OSError as e:
            raise StdoutLost(e) from None


class _Stderr(io.RawIOBase):
    """sys.stderr (Python's warnings, logging's last resort, a thread's traceback) goes to the
    console's stderr: never blocking, bounded, dropped when it cannot be written any more."""

    def writable(self) -> bool:
        return True

    def isatty(self) -> bool:
        return os.isatty(2)

    def fileno(self) -> int:
        return 2

    def write(self, data) -> int:
        console.write(2, bytes(data))
        return len(data)


def stdout_lost_code(e: OSError) -> int:
    """Nothing to say when the reader went away (``| head``): exit code 0; else one sentence, 1."""
    if e.errno == errno.EPIPE:
        return 0
    error(f"cannot write to stdout ({e.strerror or e}); send the output somewhere that takes it.")
    return 1


def open_standard_streams() -> None:
    """Started with stdin, stdout or stderr closed (``>&-``): put /dev/null there, so that no file
    the launcher opens takes descriptor 1 or 2 and receives its messages. sys.stdout is then made
    to tell its write errors apart (``StdoutLost``), and sys.stderr to write through the console."""
    for fd in (0, 1, 2):
        try:
            os.fstat(fd)
        except OSError:
            os.open(os.devnull, os.O_RDWR)  # the lowest free descriptor: this one
    sys.stdout = _text(_Stdout(1, "w", closefd=False), sys.stdout)
    sys.stderr = _text(_Stderr(), sys.stderr, line_buffering=True)


def _text(raw: io.RawIOBase, old, line_buffering: bool = False) -> io.TextIOWrapper:
    return io.TextIOWrapper(io.BufferedWriter(raw), encoding=getattr(old, "encoding", None) or "utf-8",
                            errors=getattr(old, "errors", None) or "backslashreplace",
                            line_buffering=line_buffering or raw.isatty(), write_through=False)


def show(data: bytes, flush: bool = False) -> None:
    """An operator tool's output, on stdout (blocking: nothing else waits on it)."""
    if data:
        sys.stdout.buffer.write(data)
    if flush:
        sys.stdout.buffer.flush()


def to_console(data: bytes) -> None:
    """An operator tool's output through the console's stdout (``logs -f``): never blocking, bounded
    at the end; ``StdoutLost`` once stdout cannot be written any more."""
    console.say_lost = False  # the tool ends instead (the launcher's note would say the job goes on)
    console.write(1, data)
    if console.stream(1).closed:
        raise StdoutLost(console.stream(1).error or OSError(errno.EPIPE, os.strerror(errno.EPIPE)))


_ABANDONED: list = []  # streams dropped after Ctrl-C, kept referenced: one collected would flush itself


def abandon_stdout() -> None:
    """After Ctrl-C, what stdout still holds may be on the screen already (the interrupt can come
    just as a write returns, leaving the written bytes in the buffer): it is dropped, never written
    twice. The console's stdout likewise; the console is then not waited for."""
    _ABANDONED.append(sys.stdout)
    sys.stdout = _text(_Stdout(1, "w", closefd=False), sys.stdout)
    console.discard(1)
    console.abandon()


def finish_output() -> None:
    """The end of all output: sys.stdout flushed (it may wait for its reader: a dump), then the
    console, bounded (``Console.finish``); Ctrl-C ends both."""
    with suppress(KeyboardInterrupt):
        for stream in (sys.stdout, sys.stderr):
            with suppress(OSError, ValueError, StdoutLost):
                stream.flush()
        console.finish()
