"""``launcher logs -f``: the new lines of a job's logs as they are written, each log read only when
it changed (its folder watched through ``launcher.host.changes``), new logs from their start,
until the job has ended.

Order: each log's lines are shown whole and in the order of its file. Lines of different logs are
shown in the order their changes were reported: the kernel reports each write as it happens
(inotify), and every log changed meanwhile is read at once; so two lines of different ranks are in
their order in time unless they were written within the same few milliseconds (the time of one
such read). When the changes are found by polling instead (see ``watch``), the logs changed
between two looks are read in the order of their last writes: the same holds, give or take the
time between two looks (0.2 s, more with many thousands of logs).
"""

from __future__ import annotations

import os
import time
from contextlib import suppress
from dataclasses import dataclass, field
from typing import Callable, Iterable, Optional

from launcher.errors import LaunchError
from launcher.host import changes as host_changes
from launcher.host import files as host_files
from launcher.output import lines as output_lines
from launcher.output import state_file as state
from launcher.output.messages import log
from launcher.tools.log_dir import job_over, read_states

STATE_EVERY = 1.0  # how often -f looks whether the job has ended (also whenever a state file changes)
PACE = 0.2  # the longest one wait for the console's reader lasts
READ_LIMIT = 16 << 20  # the most -f reads of one log at a time; the rest comes right after
MARK = 64  # how many bytes before its offset are read again with a log's new ones, to see it was not rewritten


def shown(prefix: bytes, lines: bytes, grep) -> bytes:
    """Whole ``lines`` (those that match ``grep``), each with ``prefix``."""
    if not lines:
        return b""
    if grep is not None:
        lines = b"".join(line for line in lines.splitlines(keepends=True) if grep.search(line))
        if not lines:
            return b""
    return output_lines.prefixed(prefix, lines)


def watch(log_dir: str, wanted: Callable[[str], bool]) -> host_changes.FolderChanges:
    """The changes of ``log_dir``: from the kernel (inotify), else by polling the ``wanted`` files,
    where inotify cannot be had or would miss what other machines write (a network file system)."""
    kind = host_changes.mount_type(log_dir)
    if host_changes.is_remote(kind):
        log.debug(f"logs -f: {log_dir} is on {kind}, whose other writers this machine is not told of: polling it.")
        return host_changes.PollingChanges(log_dir, wanted)
    try:
        return host_changes.InotifyChanges(log_dir)
    except host_changes.Unwatchable as e:
        if e.limit:
            log.warning(f"logs -f: cannot watch {log_dir} for changes ({e}); following it by polling, which costs "
                        f"more CPU with many logs (raise that limit to avoid it).")
        else:
            log.debug(f"logs -f: cannot watch {log_dir} for changes ({e}); polling it.")
        return host_changes.PollingChanges(log_dir, wanted)


@dataclass
class Tail:
    """How far one log has been shown."""

    log: object  # a launcher.tools.logs.LogFile: its path, name and prefix
    offset: int
    identity: Optional[tuple] = None  # (device, inode) of the file shown so far; None before the first look
    mark: bytes = b""  # its last MARK bytes before ``offset``: still there, or the file was rewritten
    buffer: output_lines.LineBuffer = field(default_factory=output_lines.LineBuffer)
    detached: bool = False  # its name was deleted or renamed away: the next file of that name is another one


def tail_at(logfile, offset: int) -> Tail:
    """The Tail of ``logfile`` shown up to ``offset``, with the identity and mark of its file now."""
    tail = Tail(logfile, offset)
    with suppress(OSError, host_files.NotReadable), host_files.open_regular(logfile.path) as fh:
        facts = os.fstat(fh.fileno())
        fh.seek(max(0, offset - MARK))
        tail.identity, tail.mark = (facts.st_dev, facts.st_ino), fh.read(min(offset, MARK))
    return tail


class Follower:
    """The new lines of each log, from the offsets already shown; ``discover`` turns names of the
    log dir into the new logs to follow (those wanted, from their start)."""

    def __init__(self, files: list, offsets: list, grep=None,
                 discover: Callable[[Iterable[str]], list] = lambda names: []) -> None:
        self.tails = {f.name: tail_at(f, offset) for f, offset in zip(files, offsets)}
        self.grep = grep
        self.discover = discover
        self.pending: dict = {}  # names with more to read than READ_LIMIT, in order

    def apply(self, changed: host_changes.Changed) -> bytes:
        """What ``changed`` brought: changed logs read in the order reported, new ones from their start."""
        for name in changed.removed & self.tails.keys():
            self.tails[name].detached = True
        self._adopt(changed.names)
        return self.read(None if changed.everything else changed.names)

    def add(self, names: Iterable[str]) -> bytes:
        """Follow the new logs among ``names``, from their start, and show what they hold."""
        return self.read(self._adopt(names))

    def _adopt(self, names: Iterable[str]) -> list:
        """The names of the new logs among ``names``, followed from now on from their start."""
        unknown = [name for name in names if name not in self.tails]
        new = [f for f in self.discover(unknown) if f.name not in self.tails] if unknown else []
        for f in new:
            self.tails[f.name] = Tail(f, 0)
        return [f.name for f in new]

    def read(self, names: Optional[Iterable[str]] = None, final: bool = False) -> bytes:
        """The new whole lines of ``names`` (every log when None) and of the logs left to finish;
        with ``final``, every log's unfinished last line too."""
        chosen = dict.fromkeys(self.tails if names is None else (n for n in names if n in self.tails))
        chosen.update(self.pending)
        self.pending = {}
        out = [self._read(self.tails[name]) for name in chosen]
        if final:
            out += [shown(t.log.prefix, t.buffer.rest(), self.grep) for t in self.tails.values()]
        return b"".join(out)

    def _read(self, tail: Tail) -> bytes:
        try:
            with host_files.open_regular(tail.log.path) as fh:
                facts = os.fstat(fh.fileno())
                data, before = _new_data(tail, fh, facts), b""
                if data is None:  # another file, or this one rewritten: shown from its start
                    before = self._restart(tail, facts)
                    data = _new_data(tail, fh, facts)
        except (OSError, host_files.NotReadable):
            return b""
        tail.offset += len(data)
        tail.mark = (tail.mark + data)[-MARK:]
        if tail.offset < facts.st_size:
            self.pending[tail.log.name] = None
        return before + shown(tail.log.prefix, tail.buffer.feed(data), self.grep)

    def _restart(self, tail: Tail, facts: os.stat_result) -> bytes:
        """The unfinished last line of the file shown so far, which nothing will finish now; then
        the file there now, from its start."""
        rest = shown(tail.log.prefix, tail.buffer.rest(), self.grep)
        tail.offset, tail.mark, tail.identity, tail.detached = 0, b"", (facts.st_dev, facts.st_ino), False
        return rest


def _new_data(tail: Tail, fh, facts: os.stat_result) -> Optional[bytes]:
    """What the file of ``tail`` holds past its offset (READ_LIMIT at most); None when it is
    another file (renamed over, deleted and made anew) or was truncated or rewritten since."""
    if tail.detached or tail.identity not in (None, (facts.st_dev, facts.st_ino)) or facts.st_size < tail.offset:
        return None
    fh.seek(tail.offset - len(tail.mark))
    data = fh.read(len(tail.mark) + min(facts.st_size - tail.offset, READ_LIMIT))
    if not data.startswith(tail.mark):
        return None
    tail.identity = (facts.st_dev, facts.st_ino)
    return data[len(tail.mark):]


def job_running(log_dir: str) -> bool:
    """Whether the job of ``log_dir`` may still write: True without a readable state file (no way
    to tell: follow until Ctrl-C)."""
    try:
        states = read_states(log_dir)
    except LaunchError:
        return True
    host = state.this_host()
    return not states or not all(job_over(s, state.launcher_status(s, host)) for s in states)


def follow(log_dir: str, follower: Follower, changes: host_changes.FolderChanges, write,
           clock=time.monotonic) -> Optional[str]:
    """Show new lines until the job has ended (then its last lines), its log dir is gone, or Ctrl-C;
    the reason when the dir is gone (None otherwise). ``changes`` must have been watching since
    before the offsets of ``follower`` were taken."""
    write(follower.add(_names(log_dir)))  # the logs made since the log dir was listed
    checked = clock() - STATE_EVERY  # at once: a job that has ended is not followed
    while True:
        timeout = 0.0 if follower.pending else max(0.0, checked + STATE_EVERY - clock())
        changed = changes.wait(timeout)
        if changed.everything:  # the kernel dropped reports: any log may be new
            write(follower.add(_names(log_dir)))
        write(follower.apply(changed))
        if changed.gone or clock() - checked >= STATE_EVERY or any(map(state.is_state_file, changed.names)):
            checked = clock()
            gone = changed.gone or not os.path.isdir(log_dir)
            if gone or not job_running(log_dir):
                write(follower.read(final=True))
                return f"{log_dir} is gone (deleted or moved): nothing more can be written to its logs; stopped following." \
                    if gone else None


class Paced:
    """``logs -f``'s writes while its job runs: each waits until the console has room (``room()``;
    ``wait(seconds)`` until the reader takes some), so that the reader sets the pace; whether the
    job still runs is looked at every STATE_EVERY meanwhile, and once it has ended no write waits:
    what the reader has not taken is then the console's to bound, and a reader that does not read
    never holds the tool past the job's end."""

    def __init__(self, log_dir: str, write: Callable[[bytes], None], room: Callable[[], bool],
                 wait: Callable[[float], None], clock=time.monotonic) -> None:
        self.log_dir, self.write, self.room, self.wait, self.clock = log_dir, write, room, wait, clock
        self.running, self.checked = True, None

    def __call__(self, data: bytes, flush: bool = False) -> None:
        while self.running and not self.room():
            if self.checked is None or self.clock() - self.checked >= STATE_EVERY:
                self.checked, self.running = self.clock(), job_running(self.log_dir)
            self.wait(PACE)
        self.write(data)


def _names(log_dir: str) -> list:
    try:
        return os.listdir(log_dir)
    except OSError:
        return []
