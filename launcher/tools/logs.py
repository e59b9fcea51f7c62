"""``launcher logs``: every log of a job merged, whole lines prefixed with their process, and ``-f``
to follow them; read from the job's log dir alone, no worker touched.

The order of ``logs``: a worker's lines carry no time, and the launcher stays out of their way
(each worker writes its log file itself), so no tool can know when each line was written. What is
known: the time each run of each process started (its header line, to the second). ``logs`` shows
the runs in that order (ties by rank), each run's lines in the order of its file, whole; the lines
of two ranks of the same run are not interleaved. ``-f`` then shows new lines as they arrive,
looked for every POLL seconds: lines of different ranks are in the order they were found, which
is their order in time give or take POLL.
"""

from __future__ import annotations

import os
import re
import time
from dataclasses import dataclass
from typing import Iterator, Optional

from launcher.errors import LaunchError
from launcher.host import files
from launcher.output import lines as output_lines
from launcher.output import state_file as state
from launcher.tools.log_dir import job_over, listing, read_states

LOG_NAME = re.compile(r"^(workerlog|serverlog)\.(\d+)$")
HEADER = re.compile(rb"===== (\d{4}-\d\d-\d\d \d\d:\d\d:\d\d) launcher: ")
POLL = 0.2  # how often -f looks for new lines
STATE_EVERY = 1.0  # how often -f looks whether the job has ended
READ_LIMIT = 16 << 20  # the most -f reads of one log at a poll


@dataclass(frozen=True)
class LogFile:
    path: str
    name: str  # workerlog.3
    label: str  # how its lines are prefixed: rank 3, trainer 3, server 0
    prefix: bytes


def log_files(log_dir: str, wanted: Optional[set] = None) -> list:
    """The logs of the job in ``log_dir`` (those named in ``wanted`` only), servers first, by number;
    a link that leads out of ``log_dir`` is left out."""
    names = listing(log_dir)
    try:  # the state file names trainers and servers; without it, the file names do
        labels = {p.log: p.label for s in read_states(log_dir) for p in s.processes if p.log}
    except LaunchError:
        labels = {}
    found = sorted((m.group(1) != "serverlog", int(m.group(2)), m.group(0))
                   for m in map(LOG_NAME.match, names) if m and _is_log(log_dir, m.group(0)))
    if not found:
        raise LaunchError(f"no workerlog.N or serverlog.N in {log_dir}; give the --log_dir of the job.")
    missing = sorted((wanted or set()) - {name for _, _, name in found})
    if missing:
        raise LaunchError(f"--ranks: no {', '.join(missing)} in {log_dir}.")
    files = []
    for server, number, name in found:
        if wanted is None or name in wanted:
            label = labels.get(name) or (f"rank {number}" if server else f"server {number}")
            files.append(LogFile(os.path.join(log_dir, name), name, label, f"[{label}] ".encode()))
    return files


def _is_log(log_dir: str, name: str) -> bool:
    """A regular file of ``log_dir`` itself (a FIFO would block the reader, a link may lead anywhere)."""
    path = files.inside(log_dir, name)
    return path is not None and os.path.isfile(path)


def parse_ranks(text: Optional[str]) -> Optional[set]:
    """``0,3,s1`` -> {workerlog.0, workerlog.3, serverlog.1}; None for every log."""
    if not text:
        return None
    wanted = set()
    for item in (i.strip() for i in text.split(",")):
        m = re.fullmatch(r"(s|server)?(\d+)", item)
        if not m:
            raise LaunchError(f"--ranks: {item!r} is not a rank; give numbers (workerlog.N) or sN (serverlog.N), "
                              f"comma-separated, such as 0,3 or s0.")
        wanted.add(f"{'serverlog' if m.group(1) else 'workerlog'}.{int(m.group(2))}")
    return wanted


def compile_grep(pattern: Optional[str]):
    if pattern is None:
        return None
    try:
        return re.compile(pattern.encode())
    except re.error as e:
        raise LaunchError(f"--grep {pattern!r} is not a regular expression ({e}).") from None


@dataclass(frozen=True)
class Section:
    """One run of one process in its log: from its header to the next one."""

    when: bytes  # the header's time; b"" for lines before any header
    index: int  # of its LogFile, which breaks ties
    start: int
    end: int


def sections(path: str, index: int, end: int) -> list:
    """The runs in the first ``end`` bytes of a log (read as lines: a file truncated meanwhile
    only ends the scan early)."""
    heads, at, line_start = [], 0, True
    with open(path, "rb") as f:
        while at < end:
            piece = f.readline(output_lines.CHUNK)  # a line of 512 MB is read a megabyte at a time
            if not piece:
                break
            m = HEADER.match(piece) if line_start else None
            if m:
                heads.append((at, m.group(1)))
            at += len(piece)
            line_start = piece.endswith(b"\n")
    if end and (not heads or heads[0][0] > 0):
        heads.insert(0, (0, b""))
    bounds = [start for start, _ in heads[1:]] + [end]
    return [Section(when, index, start, stop) for (start, when), stop in zip(heads, bounds)]


def merged(files: list, ends: list, grep=None) -> Iterator[bytes]:
    """Every line of ``files`` up to ``ends``, prefixed, in the order of the module doc."""
    runs = sorted((s for i, f in enumerate(files) for s in sections(f.path, i, ends[i])),
                  key=lambda s: (s.when, s.index, s.start))
    for run in runs:
        f = files[run.index]
        for lines in _chunks(f.path, run.start, run.end):
            yield _shown(f.prefix, lines, grep)


def _chunks(path: str, start: int, end: int) -> Iterator[bytes]:
    """Whole lines of ``path`` between two offsets, in pieces of about a megabyte."""
    buffer = output_lines.LineBuffer()
    with open(path, "rb") as f:
        f.seek(start)
        while start < end:
            data = f.read(min(output_lines.CHUNK, end - start))
            if not data:
                break
            start += len(data)
            yield buffer.feed(data)
    yield buffer.rest()


def _shown(prefix: bytes, lines: bytes, grep) -> bytes:
    if not lines:
        return b""
    if grep is not None:
        lines = b"".join(line for line in lines.splitlines(keepends=True) if grep.search(line))
        if not lines:
            return b""
    return output_lines.prefixed(prefix, lines)


def sizes(files: list, whole_lines: bool) -> list:
    """How far to show each file now: its size, or up to its last newline (``-f`` follows the rest)."""
    ends = []
    for f in files:
        try:
            size = os.path.getsize(f.path)
        except OSError:
            size = 0
        ends.append(_last_newline(f.path, size) if whole_lines else size)
    return ends


def _last_newline(path: str, size: int) -> int:
    with open(path, "rb") as f:
        at = size
        while at > 0:
            begin = max(0, at - output_lines.CHUNK)
            f.seek(begin)
            cut = f.read(at - begin).rfind(b"\n")
            if cut >= 0:
                return begin + cut + 1
            at = begin
    return 0


class Follower:
    """``logs -f``: new lines of each file, as they arrive, from the offsets already shown."""

    def __init__(self, files: list, offsets: list, grep=None) -> None:
        self.files = files
        self.offsets = list(offsets)
        self.buffers = [output_lines.LineBuffer() for _ in files]
        self.grep = grep

    def read(self, final: bool = False) -> bytes:
        """What was written since the last call, whole lines only (everything when ``final``)."""
        out = []
        for i, f in enumerate(self.files):
            out.append(self._read_one(i, f))
            if final:
                out.append(_shown(f.prefix, self.buffers[i].rest(), self.grep))
        return b"".join(out)

    def _read_one(self, i: int, f: LogFile) -> bytes:
        try:
            with open(f.path, "rb") as fh:
                size = fh.seek(0, os.SEEK_END)
                if size < self.offsets[i]:  # truncated in place (copytruncate): from its start
                    self.offsets[i], self.buffers[i] = 0, output_lines.LineBuffer()
                fh.seek(self.offsets[i])
                data = fh.read(min(size - self.offsets[i], READ_LIMIT))  # the rest at the next poll
        except OSError:
            return b""
        self.offsets[i] += len(data)
        return _shown(f.prefix, self.buffers[i].feed(data), self.grep)


def job_running(log_dir: str) -> bool:
    """Whether the job of ``log_dir`` may still write: True without a readable state file (no way
    to tell: follow until Ctrl-C)."""
    try:
        states = read_states(log_dir)
    except LaunchError:
        return True
    host = state.this_host()
    return not states or not all(job_over(s, state.launcher_status(s, host)) for s in states)


def follow(log_dir: str, follower: Follower, write, clock=time.monotonic, sleep=time.sleep,
           room=lambda: True) -> Optional[str]:
    """Show new lines until the job has ended (then its last lines), its log dir is gone, or Ctrl-C;
    the reason when the dir is gone (None otherwise). New lines are read only while ``room()``
    (the console has taken enough of what it was given)."""
    checked = clock() - STATE_EVERY
    while True:
        if room():
            write(follower.read())
        if clock() - checked >= STATE_EVERY:
            checked = clock()
            if not os.path.isdir(log_dir):
                write(follower.read(final=True))
                return f"{log_dir} is gone (deleted or moved): nothing more can be written to its logs; stopped following."
            if not job_running(log_dir):
                write(follower.read(final=True))
                return None
        sleep(POLL)


def follow_live(log_dir: str, files: list, grep, write, room, wait, clock=time.monotonic) -> Optional[str]:
    """``logs -f`` of a running job: what its logs hold, then ``follow``. Each write waits for
    ``room()`` (``wait``: until the reader takes some, at most the given seconds) while the job
    runs; once it has ended, not: what the reader has not taken is the console's to bound, so that a
    reader who does not read never holds the tool past the job's end."""
    ends = sizes(files, whole_lines=True)
    checked, running = None, True
    for chunk in merged(files, ends, grep):
        while running and not room():
            if checked is None or clock() - checked >= STATE_EVERY:
                checked, running = clock(), job_running(log_dir)
            wait(POLL)
        write(chunk)
    return follow(log_dir, Follower(files, ends, grep), write, clock, wait, room)
