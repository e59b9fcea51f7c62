"""``launcher logs``: every log of a job merged, whole lines prefixed with their process, and ``-f``
to follow them; read from the job's log dir alone, no worker touched.

The order of ``logs``: a worker's lines carry no time, and the launcher stays out of their way
(each worker writes its log file itself), so no tool can know when each line was written. What is
known: the time each run of each process started (its header line, to the second). ``logs`` shows
the runs in that order (ties by rank), each run's lines in the order of its file, whole; the lines
of two ranks of the same run are not interleaved. ``-f`` then shows new lines as they are written
(``launcher.tools.follow``, which says in what order).
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from typing import Iterable, Iterator, Optional

from launcher.errors import LaunchError
from launcher.host import files
from launcher.output import lines as output_lines
from launcher.tools import follow as follower
from launcher.tools.log_dir import listing, read_states

LOG_NAME = re.compile(r"^(workerlog|serverlog)\.(\d+)$")
HEADER = re.compile(rb"===== (\d{4}-\d\d-\d\d \d\d:\d\d:\d\d) launcher: ")


@dataclass(frozen=True)
class LogFile:
    path: str
    name: str  # workerlog.3
    label: str  # how its lines are prefixed: rank 3, trainer 3, server 0
    prefix: bytes


def show(log_dir: str, follow: bool, ranks: Optional[str], grep: Optional[str], write) -> Optional[str]:
    """``launcher logs``: the logs merged, then (``follow``) their new lines until the job has ended,
    each piece given to ``write(data, flush)``; why following stopped early (its log dir gone), or None."""
    pattern, wanted = compile_grep(grep), parse_ranks(ranks)
    files = log_files(log_dir, wanted)
    changes = follower.watch(log_dir, lambda name: is_wanted(name, wanted)) if follow else None
    try:
        ends = sizes(files, whole_lines=follow)  # taken once the watch is on: no change is missed
        for chunk in merged(files, ends, pattern):
            write(chunk, False)
        write(b"", True)
        if changes is None:
            return None
        tails = follower.Follower(files, ends, pattern, lambda names: new_logs(log_dir, names, wanted))
        return follower.follow(log_dir, tails, changes, lambda data: write(data, True))
    finally:
        if changes is not None:
            changes.close()


def is_wanted(name: str, wanted: Optional[set]) -> bool:
    """Whether ``name`` is a log that ``--ranks`` asks for (every log without it)."""
    return LOG_NAME.match(name) is not None and (wanted is None or name in wanted)


def log_files(log_dir: str, wanted: Optional[set] = None) -> list:
    """The logs of the job in ``log_dir`` (those named in ``wanted`` only), servers first, by number;
    a link that leads out of ``log_dir`` is left out."""
    names = listing(log_dir)
    present = {name for name in names if LOG_NAME.match(name) and _is_log(log_dir, name)}
    if not present:
        raise LaunchError(f"no workerlog.N or serverlog.N in {log_dir}; give the --log_dir of the job.")
    missing = sorted((wanted or set()) - present)
    if missing:
        raise LaunchError(f"--ranks: no {', '.join(missing)} in {log_dir}.")
    return _logs(log_dir, [name for name in present if wanted is None or name in wanted])


def new_logs(log_dir: str, names: Iterable[str], wanted: Optional[set]) -> list:
    """The logs among ``names`` of ``log_dir`` that ``--ranks`` asks for, as ``log_files`` has them."""
    chosen = [name for name in names if is_wanted(name, wanted) and _is_log(log_dir, name)]
    return _logs(log_dir, chosen) if chosen else []


def _logs(log_dir: str, names: list) -> list:
    """The LogFile of each of ``names``, servers first, by number, labelled as the state files say."""
    try:  # the state file names trainers and servers; without it, the file names do
        labels = {p.log: p.label for s in read_states(log_dir) for p in s.processes if p.log}
    except LaunchError:
        labels = {}
    files = []
    for server, number, name in sorted((m.group(1) != "serverlog", int(m.group(2)), m.group(0))
                                       for m in map(LOG_NAME.match, names)):
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
            yield follower.shown(f.prefix, lines, grep)


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
