"""Everything the launcher writes: worker logs, console echo, rank prefixes, its own messages."""

from __future__ import annotations

import collections
import logging
import os
import select
import shlex
import signal
import sys
import time
from typing import Optional

CHUNK = 1 << 20
FOLLOW_CHUNKS = 16  # at most this many chunks of a log file are echoed before the next event
ECHO_MAX_LAG = 64 << 20  # how far the console echo of a log file may fall behind the file
MAX_PARTIAL_LINE = 8 << 20  # a longer unterminated line is written out as it is
TAIL_LINES = 20
TAIL_BYTES = 64 * 1024  # how far back the failure summary looks for its last lines

log = logging.getLogger("launcher")


# ---------------------------------------------------------------- the launcher's own messages


class _MessageFormat(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        level = "" if record.levelno == logging.INFO else record.levelname.lower() + ": "
        return f"launcher: {level}{record.getMessage()}"


def setup_messages(level: int) -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(_MessageFormat())
    log.handlers[:] = [handler]
    log.setLevel(level)
    log.propagate = False


def error(message: str) -> None:
    """A one-sentence user error, whatever the log level."""
    sys.stderr.write(f"launcher: error: {message}\n")
    sys.stderr.flush()


# ---------------------------------------------------------------- console


class Console:
    """Raw writes to stdout/stderr that survive a closed pipe (``| head``) without losing the job."""

    def __init__(self) -> None:
        self.closed = set()

    def write(self, fd: int, data: bytes) -> None:
        view = memoryview(data)
        while view and fd not in self.closed:
            try:
                n = os.write(fd, view)
                view = view[n:]
            except BlockingIOError:
                select.select([], [fd], [])
            except (BrokenPipeError, OSError):
                self.closed.add(fd)


console = Console()


def prefixed(prefix: bytes, lines: bytes) -> bytes:
    """``lines`` (ending in a newline) with ``prefix`` before each."""
    return prefix + lines[:-1].replace(b"\n", b"\n" + prefix) + b"\n"


class LineBuffer:
    """Cuts a byte stream into whole lines; keeps the unfinished last one for later."""

    def __init__(self) -> None:
        self.partial = b""

    def feed(self, data: bytes) -> bytes:
        data = self.partial + data
        cut = data.rfind(b"\n") + 1
        if cut == 0 and len(data) > MAX_PARTIAL_LINE:
            cut, data = len(data) + 1, data + b"\n"
        self.partial = data[cut:]
        return data[:cut]

    def rest(self) -> bytes:
        rest, self.partial = self.partial, b""
        return rest + b"\n" if rest else b""


# ---------------------------------------------------------------- worker output


def header(rank: int, cmd) -> bytes:
    when = time.strftime("%Y-%m-%d %H:%M:%S")
    return f"===== {when} launcher: rank {rank} starts: {shlex.join(cmd)}\n".encode()


class FileOutput:
    """--log_dir: the worker writes its log file itself; the launcher may follow it onto the console."""

    def __init__(self, path: str, rank: int, cmd, echo: bool) -> None:
        self.path = path
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, 0o644)
        os.write(fd, header(rank, cmd))
        self.start = os.lseek(fd, 0, os.SEEK_END)
        self._child_fd: Optional[int] = fd
        self._follow_fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC) if echo else None
        if self._follow_fd is not None:
            os.lseek(self._follow_fd, self.start, os.SEEK_SET)
        self._lines = LineBuffer()

    @property
    def follows(self) -> bool:
        return self._follow_fd is not None

    def child_fds(self):
        return self._child_fd, self._child_fd

    def spawned(self) -> None:
        os.close(self._child_fd)
        self._child_fd = None

    def pipes(self):
        return ()

    def read_pipe(self, fd: int) -> bool:
        raise AssertionError("a log file has no pipe")

    def follow(self) -> bool:
        """Copy what the worker wrote since last time to the console; True when there was some."""
        if self._follow_fd is None:
            return False
        self._skip_if_far_behind()
        moved = False
        for _ in range(FOLLOW_CHUNKS):  # then back to the event loop, even if the worker writes on
            data = os.read(self._follow_fd, CHUNK)
            if data:
                console.write(1, self._lines.feed(data))
                moved = True
            if len(data) < CHUNK:
                break
        return moved

    def _skip_if_far_behind(self) -> None:
        """A worker that writes faster than the console takes would leave the echo ever further
        behind (and the launcher echoing for minutes after the job ended): jump to a line start
        near the end. The log file itself always has every line."""
        at = os.lseek(self._follow_fd, 0, os.SEEK_CUR)
        size = os.fstat(self._follow_fd).st_size
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
        while self.follow():
            pass
        if self._follow_fd is not None:
            console.write(1, self._lines.rest())
            os.close(self._follow_fd)
            self._follow_fd = None
        if self._child_fd is not None:
            os.close(self._child_fd)
            self._child_fd = None

    def last_lines(self, n: int = TAIL_LINES) -> list:
        with open(self.path, "rb") as f:
            size = f.seek(0, os.SEEK_END)
            begin = max(self.start, size - TAIL_BYTES)
            f.seek(begin)
            return _last_lines(f.read(), n, cut=begin > self.start)


def _last_lines(data: bytes, n: int, cut: bool = False) -> list:
    """The last ``n`` lines of ``data`` (the end of a longer text when ``cut``), none of them cut."""
    if len(data) > TAIL_BYTES:
        data, cut = data[-TAIL_BYTES:], True
    if cut:
        data = data[data.find(b"\n") + 1:]
    return data.decode(errors="replace").splitlines()[-n:]


class PipeOutput:
    """No --log_dir: the worker writes to pipes; whole lines reach the console, prefixed with the rank."""

    def __init__(self, rank: int) -> None:
        self.path = None
        self._prefix = f"[rank {rank}] ".encode()
        self._out_r, self._out_w = os.pipe2(os.O_CLOEXEC)
        self._err_r, self._err_w = os.pipe2(os.O_CLOEXEC)
        self._streams = {self._out_r: (1, LineBuffer()), self._err_r: (2, LineBuffer())}
        self._tail = collections.deque(maxlen=TAIL_LINES)

    follows = False

    def child_fds(self):
        return self._out_w, self._err_w

    def spawned(self) -> None:
        os.close(self._out_w)
        os.close(self._err_w)

    def pipes(self):
        return tuple(self._streams)

    def read_pipe(self, fd: int) -> bool:
        """Relay what is waiting on ``fd``; False at end of file."""
        data = os.read(fd, CHUNK)
        dest, lines = self._streams[fd]
        if not data:
            self._emit(dest, lines.rest())
            return False
        self._emit(dest, lines.feed(data))
        return True

    def _emit(self, dest: int, lines: bytes) -> None:
        if lines:
            console.write(dest, prefixed(self._prefix, lines))
            self._tail.extend(_last_lines(lines, TAIL_LINES))

    def follow(self) -> bool:
        return False

    def finish(self) -> None:
        for fd, (dest, lines) in list(self._streams.items()):
            self._emit(dest, lines.rest())
            os.close(fd)
        self._streams.clear()

    def last_lines(self, n: int = TAIL_LINES) -> list:
        return list(self._tail)[-n:]


# ---------------------------------------------------------------- plan and summaries


def format_plan(plan) -> str:
    """The resolved plan as a small table (--print_config)."""
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
    if nodes > 1:
        shown = ",".join(plan.node_ips[:8]) + (f",... ({nodes} nodes)" if nodes > 8 else "")
        lines.append(f"  nodes: {shown}")
    rows = [("rank", "local", "endpoint", "device", "log")]
    for w in plan.workers:
        device = "cpu" if w.gpu is None else f"gpu {w.gpu} (not found)" if unverified else f"gpu {w.gpu}"
        rows.append((str(w.rank), str(w.local_rank), w.endpoint, device, w.log_file or "console"))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    for r in rows:
        lines.append("  " + "  ".join(c.ljust(wd) for c, wd in zip(r, widths)).rstrip())
    lines.append(f"  command: {shlex.join(plan.workers[0].cmd)}")
    return "\n".join(lines)


def describe_exit(returncode: int) -> str:
    if returncode < 0:
        try:
            name = signal.Signals(-returncode).name
        except ValueError:
            name = f"signal {-returncode}"
        return f"killed by {name}"
    return f"exit code {returncode}"


def format_failure(failure) -> str:
    where = failure.log_file or "console (no --log_dir)"
    lines = [
        f"launcher: rank {failure.rank} (local rank {failure.local_rank}, pid {failure.pid}) failed: "
        f"{describe_exit(failure.returncode)} after {failure.run_time:.1f} s; log: {where}",
    ]
    if failure.last_lines:
        lines.append(f"launcher: last lines of rank {failure.rank}:")
        lines += [f"  | {line}" for line in failure.last_lines]
    return "\n".join(lines)
