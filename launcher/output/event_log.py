"""The job's event log: ``LOG_DIR/events.jsonl``, one JSON object a line, for whoever wants what happened, in order,
without reading the logs: the job's start, each round of an elastic job and each member lost, silent, joined or
left, each worker's start, exit and restart, the stop and its cause, the end with the exit code, and each node found
slower than the others (``straggler``, its ``node`` the slow one) and no longer so.

Each line is ``{"time": <Unix seconds>, "event": <kind>, "node": <node rank>, ...}``, with ``round`` in an elastic job
and ``rank`` where the event is a worker's. A line is written in one ``write`` on a file opened for appending,
so that no two events ever share a line. A launcher killed while it writes one may leave that line cut short
(the kernel stops a write at a page's end for SIGKILL): a reader skips it, and the next writer begins on a new line.
Keeping it never fails the job: a write that fails is one warning, then no more writes. ``read`` takes any file
and never raises on what is in it; ``describe`` shows an event in one line (``launcher logs --events``).
With torchrun's ``--event-log-handler console`` each event is also written to the console's stderr, the same JSON
line, with or without a log dir (torch's console handler writes each event's JSON there).
"""

from __future__ import annotations

import collections
import json
import os
import time
from contextlib import suppress
from typing import Callable, Iterator, Optional

from launcher.output.console import console
from launcher.output.messages import log
from launcher.untrusted import json_object

NAME = "events.jsonl"
TEXT_LIMIT = 2000  # characters of one text field (a cause's), the rest cut
READ_LIMIT = 64 << 20  # bytes of the file ``read`` takes (the last ones)
RECENT = 20  # events kept in memory


def path_in(log_dir: str) -> str:
    return os.path.join(log_dir, NAME)


class EventLog:
    """The event log of this node's launcher (``log_dir`` None: none is kept, every write is a no-op)."""

    def __init__(self, log_dir: Optional[str], node: int, now: Callable[[], float] = time.time,
                 to_console: bool = False) -> None:
        self.path = path_in(log_dir) if log_dir else None
        self.to_console = to_console  # each event also a line on stderr (--event-log-handler console)
        self.node = node
        self.round: Optional[int] = None  # an elastic job's round, on every event from its start on
        self.now = now
        self.fd: Optional[int] = None
        self.failed = False
        self.counts: dict = {}  # event -> how many were written (also without a log dir: the monitor's counters)
        self.recent: collections.deque = collections.deque(maxlen=RECENT)  # the last events, for the live page

    def write(self, event: str, **fields) -> None:
        """One line for ``event``; fields of None left out. Never raises."""
        record = {"time": round(self.now(), 3), "event": event, "node": self.node}
        if self.round is not None:
            record["round"] = self.round
        record.update((k, _bounded(v)) for k, v in fields.items() if v is not None)
        self.counts[event] = self.counts.get(event, 0) + 1
        self.recent.append(record)
        if (self.path is None or self.failed) and not self.to_console:
            return
        line = (json.dumps(record, ensure_ascii=True, default=str) + "\n").encode()
        if self.to_console:
            console.write(2, line)
        if self.path is None or self.failed:
            return
        try:
            if self.fd is None:
                self.fd = os.open(self.path, os.O_RDWR | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o644)
                line = _after_a_cut_line(self.fd) + line
            written = os.write(self.fd, line)
            if written != len(line):
                raise OSError(28, "no space left for a whole line")
        except OSError as e:
            self.failed = True
            log.warning("could not write the event log %s (%s); it is not kept from here on", self.path,
                        e.strerror or e)

    def close(self) -> None:
        if self.fd is not None:
            with suppress(OSError):
                os.close(self.fd)
            self.fd = None


def _after_a_cut_line(fd: int) -> bytes:
    """A newline to write first when the file ends in the middle of a line (a launcher killed while it wrote one:
    the kernel may stop a write to a file at a page's end when the process gets SIGKILL), so that the cut line
    stays alone and the next one whole."""
    size = os.fstat(fd).st_size
    return b"\n" if size and os.pread(fd, 1, size - 1) != b"\n" else b""


def _bounded(value):
    return value[:TEXT_LIMIT] if isinstance(value, str) else value


def read(path: str) -> Iterator[dict]:
    """The events of ``path``, in order: each line that is a JSON object with a text ``event`` and a number ``time``
    (any other line skipped; of a file over READ_LIMIT, its last READ_LIMIT bytes). OSError when it cannot be read."""
    with open(path, "rb") as f:
        f.seek(0, os.SEEK_END)
        size = f.tell()
        f.seek(max(0, size - READ_LIMIT))
        data = f.read(READ_LIMIT)
    if size > READ_LIMIT:
        data = data[data.find(b"\n") + 1:]  # the first line is cut
    for line in data.split(b"\n"):
        event = decode(line)
        if event is not None:
            yield event


def decode(line: bytes) -> Optional[dict]:
    """One line of the log as an event, or None (not a JSON object with a text ``event`` and a finite ``time``)."""
    event = json_object(line)
    if event is None or not isinstance(event.get("event"), str):
        return None
    t = event.get("time")
    if type(t) not in (int, float) or t != t or abs(t) == float("inf"):
        return None
    return event


WHAT = {  # event -> how it reads, from its fields
    "job_started": lambda e: f"job started: {e.get('workers', '?')} worker(s) here, world size {e.get('world_size', '?')}, "
                             f"{e.get('nodes', '?')} node(s)",
    "round": lambda e: f"round {e.get('round', '?')} ({e.get('why', '?')}): {e.get('nodes', '?')} node(s), "
                       f"world size {e.get('world_size', '?')}",
    **{f"member_{kind}": (lambda said: lambda e: f"member {e.get('member', '?')} {said}: {e.get('reason', '')}")(said)
       for kind, said in (("lost", "lost"), ("silent", "silent"), ("left", "left"), ("straggler", "left as a straggler"),
                          ("unhealthy", "left unhealthy"))},
    "member_joined": lambda e: f"member {e.get('member', '?')} joined",
    "worker_started": lambda e: f"started pid {e.get('pid', '?')}" + (" (kept from the round before)" if e.get("kept") else ""),
    "worker_exited": lambda e: f"pid {e.get('pid', '?')} exited: {e.get('exit', '?')}",
    "restart": lambda e: f"restart {e.get('attempt', '?')} of {e.get('max_restarts', '?')}",
    "stop": lambda e: f"stopping the job ({e.get('kind', '?')}): {e.get('cause', '')}",
    "job_ended": lambda e: f"job ended: exit code {e.get('code', '?')}",
    "straggler": lambda e: f"straggler: {e.get('reason', '')}",
    "straggler_cleared": lambda e: f"straggler no longer: node {e.get('node', '?')} ({e.get('host', '?')})",
    "straggler_leaves": lambda e: f"straggler: node {e.get('node', '?')} ({e.get('host', '?')}) leaves the job",
    "straggler_stays": lambda e: f"straggler: node {e.get('node', '?')} ({e.get('host', '?')}) stays: {e.get('why', '')}",
}


def describe(event: dict) -> str:
    """One event in a line: its time (local, to the millisecond), node, round and rank, and what happened."""
    t = event["time"]
    try:
        stamp = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(t)) + f".{int(t * 1000) % 1000:03d}"
    except (OverflowError, ValueError, OSError):
        stamp = str(t)
    where = [f"node {event['node']}" if _plain(event.get("node")) else "node ?"]
    where += [f"{key} {event[key]}" for key in ("round", "rank") if _plain(event.get(key))]
    shown = WHAT.get(event["event"])
    try:
        what = shown(event) if shown is not None else f"{event['event']} {json.dumps(event, default=str)[:300]}"
    except (TypeError, ValueError):
        what = event["event"]
    return f"{stamp} {' '.join(where)}: {_printable(what)}"


def _printable(text: str) -> str:
    """On one line, and no escape sequence reaches the terminal (the file may hold anything)."""
    return "".join(c if c.isprintable() else " " for c in " ".join(text.split()))


def _plain(value) -> bool:
    return type(value) is int
