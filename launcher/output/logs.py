"""Everything the launcher writes: worker logs, console echo, rank prefixes, its own messages."""

from __future__ import annotations

import collections
import errno
import logging
import os
import re
import select
import shlex
import stat
import time
import unicodedata
from dataclasses import dataclass
from typing import Callable, Optional

from launcher import envvars as ev
from launcher.output import error_file
from launcher.errors import LaunchError
from launcher.plan.policy import describe_exit

CHUNK = 1 << 20
FOLLOW_CHUNKS = 16  # at most this many chunks of a log file are echoed before the next event
ECHO_MAX_LAG = 64 << 20  # how far the console echo of a log file may fall behind the file
MAX_PARTIAL_LINE = 8 << 20  # a longer unterminated line is written out as it is
TAIL_LINES = 20
TAIL_BYTES = 64 * 1024  # how far back the failure summary looks for its last lines
CONSOLE_BUFFER = 4 << 20  # output the console may hold before a worker's output waits
ERASE_LINE = b"\r\x1b[K"  # a terminal's cursor back to the line's start, and the line erased
ERASE_REST = b"\x1b[K"

log = logging.getLogger("launcher")


# ---------------------------------------------------------------- the launcher's own messages


class _MessageFormat(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        level = "" if record.levelno == logging.INFO else record.levelname.lower() + ": "
        return f"launcher: {level}{record.getMessage()}"


def setup_messages(level: int) -> None:
    handler = _ConsoleHandler()
    handler.setFormatter(_MessageFormat())
    log.handlers[:] = [handler]
    log.setLevel(level)
    log.propagate = False


def error(message: str) -> None:
    """A one-sentence user error, whatever the log level."""
    console.write(2, f"launcher: error: {message}\n".encode(errors="replace"))


# ---------------------------------------------------------------- console


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
    """

    def __init__(self, fd: int, on_lost: Callable[["_Stream", OSError], None] = lambda s, e: None) -> None:
        self.fd = fd
        self.out = fd
        self.pending = bytearray()
        self.closed = False
        self.on_lost = on_lost  # told once when the stream cannot be written any more
        self.owned = False  # self.out was opened here
        self.sock = None
        self.gated = False  # fallback: write only what poll says fits
        self.live: Optional[_Live] = None
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
        if self.live is not None:
            data = ERASE_LINE + data
            if self.live.owner is owner:
                self.live = None
            else:
                self.live.drawn = False
        self.pending += data

    def draw(self, owner: object, text: bytes) -> None:
        self.live = _Live(owner, text)

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
        """Write what is pending, as far as it goes without waiting."""
        while not self.closed and (self.pending or self._redraw()):
            try:
                n = self._write(memoryview(self.pending))
            except (BlockingIOError, InterruptedError):
                return
            except OSError as e:  # a closed pipe (| head), a hung-up terminal, a full disk
                self._lose(e)
                return
            if n == 0:
                return
            del self.pending[:n]

    def _lose(self, e: OSError) -> None:
        """The console is a view: one that cannot be written any more is dropped, and the job goes on."""
        self.closed = True
        self.pending = bytearray()  # not .clear(): the error's traceback still holds a view of it
        self.on_lost(self, e)

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

    The launcher's own messages are always taken. Bulk output (a worker's lines) is offered only
    while ``has_room``: without --log_dir the launcher stops reading that worker's pipe until the
    console catches up (the worker then waits on its own write, as it would on a paused terminal);
    with --log_dir the echo of the log file falls behind, and skips ahead with a note if it falls
    too far (the file keeps every line).
    """

    def __init__(self, limit: int = CONSOLE_BUFFER) -> None:
        self.limit = limit
        self.abandoned = False
        self._streams: dict = {}

    def abandon(self) -> None:
        """The user asked the launcher to stop (a stop signal) while a console nobody reads holds
        output: ``finish`` then writes only what the console takes at once, and does not wait."""
        self.abandoned = True

    def stream(self, fd: int) -> _Stream:
        if fd not in self._streams:
            self._streams[fd] = self._twin(fd) or _Stream(fd, self._lost)
        return self._streams[fd]

    def _lost(self, stream: _Stream, e: OSError) -> None:
        """One note on stderr, if stderr still works (it is another stream)."""
        names = " and ".join(n for fd, n in ((1, "stdout"), (2, "stderr")) if self._streams.get(fd) is stream)
        if stream is not self.stream(2):
            log.warning("%s cannot be written any more (%s): what would go there is dropped from now on; "
                        "the job goes on", names or f"descriptor {stream.fd}", e.strerror or e)

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
        return {s.out: s for s in self._streams.values() if s.waiting}

    def finish(self) -> None:
        """Write everything pending, waiting for the reader as long as it takes (a stop signal
        interrupts this in the caller), unless ``abandon`` was called. A bar still drawn (its
        worker never ended its line, the launcher stopped on an error) is left on a line of its own."""
        for s in self._streams.values():
            if s.live is not None:
                s.pending += b"\n" if s.live.drawn else b""
                s.live = None
        while True:
            waiting = self.waiting()
            if not waiting or self.abandoned:
                return
            select.select([], list(waiting), [], 0.2)
            for s in waiting.values():
                s.push()

    def reset(self) -> None:
        for s in {id(s): s for s in self._streams.values()}.values():
            if s.owned:
                os.close(s.out)
            if s.sock is not None:
                s.sock.close()
        self._streams.clear()


console = Console()


class _ConsoleHandler(logging.Handler):
    def emit(self, record: logging.LogRecord) -> None:
        try:
            console.write(2, (self.format(record) + "\n").encode(errors="replace"))
        except Exception:
            self.handleError(record)


def prefixed(prefix: bytes, lines: bytes) -> bytes:
    """``lines`` (ending in a newline) with ``prefix`` before each."""
    return prefix + lines[:-1].replace(b"\n", b"\n" + prefix) + b"\n"


class LineBuffer:
    """Cuts a byte stream into whole lines; keeps the unfinished last one for later. A line
    redrawn in place (``\r``: a progress bar) counts as its last state, as a terminal shows it:
    only that is kept, and given."""

    def __init__(self) -> None:
        self.partial = b""

    def feed(self, data: bytes) -> bytes:
        data = self.partial + data
        cut = data.rfind(b"\n") + 1
        if cut == 0 and len(data) > MAX_PARTIAL_LINE:
            cut, data = len(data) + 1, data + b"\n"
        self.partial = _unfinished(data[cut:])
        return last_states(data[:cut])

    def progress(self) -> Optional[bytes]:
        """The latest state of the unfinished line when it is being redrawn; else None."""
        if b"\r" not in self.partial:
            return None
        return _last_state(self.partial).rstrip(b"\r") or None

    def rest(self) -> bytes:
        rest, self.partial = self.partial, b""
        return last_states(rest + b"\n") if rest else b""


def _last_state(line: bytes) -> bytes:
    """What follows the last ``\r`` of ``line`` (trailing ones aside: ``\r\n`` stays as it is)."""
    return line[line.rstrip(b"\r").rfind(b"\r") + 1:]


def last_states(lines: bytes) -> bytes:
    """Each of ``lines`` as a terminal would leave it: its last state."""
    if b"\r" not in lines:
        return lines
    return b"\n".join(_last_state(line) for line in lines.split(b"\n"))


def _unfinished(partial: bytes) -> bytes:
    """An unfinished line without the states it has drawn over (its last ``\r`` kept, as a mark)."""
    at = partial.rstrip(b"\r").rfind(b"\r")
    return partial[at:] if at > 0 else partial


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


# ---------------------------------------------------------------- worker output


def header(label: str, cmd, attempt: int = 0) -> bytes:
    """The line that opens each run in a log; ``label`` names the process ("rank 3", "server 0")."""
    when = time.strftime("%Y-%m-%d %H:%M:%S")
    again = f" (attempt {attempt + 1}, restart {attempt})" if attempt else ""
    return f"===== {when} launcher: {label} starts{again}: {shlex.join(cmd)}\n".encode()


def open_log(path: str, log_dir: str, label: str, cmd, attempt: int = 0) -> int:
    """Open a worker's log file for appending and write this run's header; the descriptor.

    Checked by doing, not by asking (``os.access`` says yes to root): whatever would keep the
    file from taking the worker's output is refused here, before any worker starts.
    """
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC | os.O_NOCTTY | os.O_NONBLOCK, 0o644)
    except OSError as e:
        raise LaunchError(_log_problem(log_dir, path, e)) from None
    size = None
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            raise LaunchError(f"--log_dir {log_dir}: {path} is {_file_kind(mode)}, not a regular file; "
                              f"remove it or choose another --log_dir.")
        os.set_blocking(fd, True)
        size = os.fstat(fd).st_size
        glue = size > 0 and os.pread(fd, 1, size - 1) != b"\n"  # the last run ended mid-line
        _write_all(fd, (b"\n" if glue else b"") + header(label, cmd, attempt))
    except OSError as e:
        if size is not None:  # a full disk took part of the header: the old log is left as it was
            try:
                os.ftruncate(fd, size)
            except OSError:
                pass
        os.close(fd)
        raise LaunchError(_log_problem(log_dir, path, e)) from None
    except LaunchError:
        os.close(fd)
        raise
    return fd


def make_log_dir(log_dir: str) -> None:
    try:
        os.makedirs(log_dir, exist_ok=True)
    except OSError as e:
        if os.path.islink(log_dir) and not os.path.exists(log_dir):
            raise LaunchError(_log_problem(log_dir, log_dir, e)) from None
        why = "a part of its path is a file" if e.errno == errno.ENOTDIR else e.strerror
        raise LaunchError(f"--log_dir {log_dir} cannot be created ({why}); choose a folder you can write to.") from None
    if not os.path.isdir(log_dir):
        raise LaunchError(f"--log_dir {log_dir} is not a folder; choose another --log_dir.")


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


def _log_problem(log_dir: str, path: str, e: OSError) -> str:
    if e.errno == errno.ENXIO:
        return f"--log_dir {log_dir}: {path} is a FIFO nobody reads, not a regular file; remove it or choose another --log_dir."
    if e.errno == errno.EISDIR:
        return f"--log_dir {log_dir}: {path} is a folder, not a file; remove it or choose another --log_dir."
    if e.errno in (errno.ENOSPC, errno.EDQUOT):
        return f"--log_dir {log_dir}: cannot write {path} ({e.strerror}); free some space or choose another --log_dir."
    if os.path.islink(log_dir) and not os.path.exists(log_dir):
        return f"--log_dir {log_dir} is a symbolic link to {os.readlink(log_dir)}, which does not exist; fix the link or choose another --log_dir."
    return f"--log_dir {log_dir}: cannot write {path} ({e.strerror}); choose a folder you can write to."


def _file_kind(mode: int) -> str:
    if stat.S_ISFIFO(mode):
        return "a FIFO"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device"
    if stat.S_ISSOCK(mode):
        return "a socket"
    return "not a regular file"


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
        """When the worker last wrote to its log (time.time()), None before it wrote anything."""
        try:
            st = os.stat(self.path)
        except OSError:
            return None
        return st.st_mtime if st.st_size > self.start else None

    def wants(self, fd: int) -> bool:
        return False

    def read_pipe(self, fd: int) -> bool:
        raise AssertionError("a log file has no pipe")

    def follow(self) -> bool:
        """Copy what the worker wrote since last time to the console; True when there was some."""
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
            data = os.read(self._follow_fd, CHUNK)
            if data:
                self._echo(self._lines.feed(data))
                moved = True
            if len(data) < CHUNK:
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
        console: a worker's last lines are never lost, and a console nobody reads cannot hold up
        the launcher here, where a stop signal is only noted. The launcher writes the buffer out at
        its very end (``cli._finish_output``), where Ctrl-C ends the wait. Bounded: the echo is
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
        console.write(1, prefixed(self._prefix, lines) if self._prefix and lines else lines, self._lines)
        bar = self._lines.progress()
        if bar:
            console.draw(1, self._lines, self._prefix + bar)

    def last_lines(self, n: int = TAIL_LINES) -> list:
        """The log's last lines since this run's header; none if the file was removed meanwhile."""
        try:
            with open(self.path, "rb") as f:
                size = f.seek(0, os.SEEK_END)
                self.start = min(self.start, size)
                begin = max(self.start, size - TAIL_BYTES)
                f.seek(begin)
                return _last_lines(f.read(), n, cut=begin > self.start)
        except OSError:
            return []


def _last_lines(data: bytes, n: int, cut: bool = False) -> list:
    """The last ``n`` lines of ``data`` (the end of a longer text when ``cut``), none of them cut."""
    if len(data) > TAIL_BYTES:
        data, cut = data[-TAIL_BYTES:], True
    if cut:
        data = data[data.find(b"\n") + 1:]
    return last_states(data).decode(errors="replace").splitlines()[-n:]


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
        """Whether to read ``fd`` now: not while the console it goes to is behind."""
        return console.has_room(self._streams[fd][0])

    def read_pipe(self, fd: int) -> bool:
        """Relay what is waiting on ``fd``; False at end of file."""
        data = os.read(fd, CHUNK)
        self._last_read = time.time()
        dest, lines = self._streams[fd]
        if not data:
            self._emit(dest, lines, lines.rest())
            return False
        self._emit(dest, lines, lines.feed(data))
        return True

    def _emit(self, dest: int, source: LineBuffer, lines: bytes) -> None:
        if lines:
            console.write(dest, prefixed(self._prefix, lines), source)
            self._tail.extend(_last_lines(lines, TAIL_LINES))
        bar = source.progress()
        if bar:
            console.draw(dest, source, self._prefix + bar)

    def follow(self) -> bool:
        return False

    def last_written(self) -> Optional[float]:
        return self._last_read

    def finish(self) -> None:
        for fd, (dest, lines) in list(self._streams.items()):
            self._emit(dest, lines, lines.feed(_left_in(fd)))
            self._emit(dest, lines, lines.rest())
            os.close(fd)
        self._streams.clear()

    def last_lines(self, n: int = TAIL_LINES) -> list:
        return list(self._tail)[-n:]


def _left_in(fd: int) -> bytes:
    """What a worker's pipe still holds at the end: the launcher stops reading a pipe while the
    console is behind, and that output goes to the console's buffer now rather than being lost
    (the console is written out at the launcher's very end). Never waits: a process outside the
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


# ---------------------------------------------------------------- plan and summaries


def format_plan(plan) -> str:
    """The resolved plan as a small table (--print_config)."""
    if plan.parameter_server:
        return _format_ps_plan(plan)
    nodes = len(plan.node_ips)
    unverified = plan.gpus_not_found
    if plan.cpu_default:
        workers = "CPU worker(s) here (no GPU found: the default; --nproc_per_node sets it)"
    elif unverified:
        workers = ("worker(s) here, GPU ids passed on as given (no GPU detected on this machine; FLAGS_selected_gpus is set, "
                   "so a worker uses a GPU only if CUDA finds one)")
    else:
        workers = f"{plan.device.upper()} worker(s) here"
    lines = [
        f"launcher: node {plan.node_rank} of {nodes} ({plan.node_ip}), "
        f"{len(plan.workers)} {workers}, world size {plan.world_size}",
        f"  master (rank 0 store): {plan.workers[0].env['MASTER_ADDR']}:{plan.workers[0].env['MASTER_PORT']}",
    ]
    if plan.cluster:
        lines.append(f"  cluster: {plan.cluster}")
    if nodes > 1:
        shown = ",".join(plan.node_ips[:8]) + (f",... ({nodes} nodes)" if nodes > 8 else "")
        lines.append(f"  nodes: {shown}")
    rows = [("rank", "local", "endpoint", "device", "log")]
    for w in plan.workers:
        device = "cpu" if w.gpu is None else f"gpu {w.gpu} (not found)" if unverified else f"gpu {w.gpu}"
        rows.append((str(w.rank), str(w.local_rank), w.endpoint, device, w.log_file or "console"))
    lines += table(rows)
    return "\n".join(lines + _plan_footer(plan))


def _format_ps_plan(plan) -> str:
    nodes = len(plan.node_ips)
    here = {role: sum(w.role == role for w in plan.workers) for role in ("server", "trainer")}
    lines = [
        f"launcher: parameter-server job, node {plan.node_rank} of {nodes} ({plan.node_ip}): "
        f"{here['server']} server(s) and {here['trainer']} trainer(s) here, "
        f"{len(plan.servers)} and {len(plan.trainers)} in the job",
        f"  servers: {','.join(plan.servers)}",
        f"  trainers: {','.join(plan.trainers[:16])}" + (f",... ({len(plan.trainers)})" if len(plan.trainers) > 16 else ""),
    ]
    if nodes > 1:
        lines.append(f"  nodes: {','.join(plan.node_ips[:8])}" + (f",... ({nodes} nodes)" if nodes > 8 else ""))
    rows = [("role", "id", "endpoint", "log")]
    rows += [(w.role, str(w.role_index), w.endpoint, w.log_file or "console") for w in plan.workers]
    return "\n".join(lines + table(rows) + _plan_footer(plan))


def table(rows: list) -> list:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return ["  " + "  ".join(c.ljust(wd) for c, wd in zip(r, widths)).rstrip() for r in rows]


def _plan_footer(plan) -> list:
    lines = [f"  command: {shlex.join(plan.workers[0].cmd)}"]
    if plan.control is not None:
        lines.append(f"  control: node 0 ({plan.node_ips[0]}) listens on port {plan.control.port}, job {plan.control.job_id}, "
                     f"heartbeat timeout {plan.control.heartbeat_timeout:g} s, join timeout {plan.control.join_timeout:g} s"
                     f"{', token set' if plan.control.token else ''}")
    if plan.max_restarts:
        lines.append(f"  restarts: up to {plan.max_restarts} (the whole job)")
    return lines


def format_failure(failure) -> str:
    where = failure.log_file or "console (no --log_dir)"
    label = failure.label or f"rank {failure.rank}"
    local = "" if failure.label else f"local rank {failure.local_rank}, "
    lines = [
        f"launcher: {label} ({local}pid {failure.pid}) failed: "
        f"{describe_exit(failure.returncode)} after {failure.run_time:.1f} s; log: {where}",
    ]
    if failure.last_lines:
        lines.append(f"launcher: last lines of {label}:")
        lines += [f"  | {line}" for line in failure.last_lines]
    recorded = error_file.traceback_of(failure.error).rstrip("\n").split("\n")
    if recorded != [""]:
        lines.append(f"launcher: root cause, as {label}'s @record wrote it ({ev.ERROR_FILE}):")
        lines += [f"  | {line}" for line in recorded[-error_file.SHOWN_LINES:]]
    return "\n".join(lines)


# ---------------------------------------------------------------- stacks of a stopped or hung job


def format_stacks(stacks, node_label: str, names=None) -> str:
    """Where each rank was (``launcher.run.stacks.Stack``), one line per rank, for the console.

    When no rank has a stack and all for the same reason (py-spy not installed), that reason is given once.
    """
    notes = {s.note for s in stacks}
    if stacks and not any(s.text for s in stacks) and len(notes) == 1:
        return f"launcher: no stacks of the {len(stacks)} worker(s) of {node_label}: {notes.pop()}"
    lines = [f"launcher: where each rank of {node_label} was:"]
    lines += [f"  {_name(s.rank, names)} (pid {s.pid}): {_stack_summary(s)}" for s in stacks]
    return "\n".join(lines)


def format_dumps(stacks, header: str, names=None) -> str:
    """The full py-spy dump of each rank under one dated header (for log_dir/stacks.txt, or the console)."""
    when = time.strftime("%Y-%m-%d %H:%M:%S")
    parts = [f"===== {when} launcher: {header}\n"]
    for s in stacks:
        parts.append(f"--- {_name(s.rank, names)} (pid {s.pid}): {_stack_summary(s)}\n")
        if s.text:
            parts.append(s.text if s.text.endswith("\n") else s.text + "\n")
    return "".join(parts)


def _name(rank: int, names) -> str:
    return (names or {}).get(rank, f"rank {rank}")


def write_stacks(path: str, stacks, header: str, names=None) -> None:
    """Append the full dumps to ``path``; a file that cannot be written is a warning, not an error."""
    try:
        with open(path, "a", encoding="utf-8", errors="replace") as f:
            f.write(format_dumps(stacks, header, names))
    except OSError as e:
        log.warning("could not write the workers' stacks to %s (%s)", path, e.strerror or e)


def _stack_summary(stack) -> str:
    if stack.text is None:
        return f"no stack: {stack.note}"
    return stack.where or "no Python frame found in the dump"
