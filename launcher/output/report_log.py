"""``--report_log``: the workers' reports (``launcher.runtime.report``: the step and the numbers by name) kept in
``LOG_DIR/reports.nodeN.jsonl``, a line ``{"rank": R, "world": W, "step": S, "t": T, "scalars": {...}}`` each time a worker's
report changed, at most one line per worker every EVERY seconds (``t``: the worker's own clock at its report, so that
a rate read from two lines is the worker's, whenever the launcher looked). What ``launcher tune`` measures a trial's
rate from. Keeping it never fails the job: a write that fails is one warning, then no more writes.

Under ``--hostfile``, each host's lines are also relayed to the command's machine (``launcher.run.over_ssh``), which
keeps them in ``LOG_DIR/reports.nodeN.relayed.jsonl`` (N: the host's place in the hostfile, its node in a fixed
job): a name of its own, as on a shared file system the host's own file is in that folder too, and two writers never
share one file. The host relays the report logs its own launcher wrote (``OwnLines``: in an elastic job, one for each
node number its rounds gave it), never another host's in a shared folder. ``NewLines`` reads a growing file's lines
(the tuner, the relay)."""

from __future__ import annotations

import json
import os
from typing import Optional

from launcher.output.messages import log
from launcher.output.state_file import is_node_file
from launcher.plan import report_lines

EVERY = 0.1  # seconds between two lines of one worker
_WRITTEN: list = []  # the paths of the report logs (never a relayed one) this process has written, in order
PREFIX, SUFFIX, RELAYED_SUFFIX = "reports.node", ".jsonl", ".relayed.jsonl"


def path_for(log_dir: str, node: int, relayed: bool = False) -> str:
    return os.path.join(log_dir, f"{PREFIX}{node}{RELAYED_SUFFIX if relayed else SUFFIX}")


def is_report_log(name: str) -> bool:
    """Whether ``name`` is a node's report log, its own or relayed."""
    return node_of(name) is not None


def node_of(name: str) -> Optional[int]:
    """The node whose report log (its own or relayed) ``name`` is; None for any other file."""
    for suffix in (RELAYED_SUFFIX, SUFFIX):
        if is_node_file(name, PREFIX, suffix):
            return int(name[len(PREFIX):-len(suffix)])
    return None


class ReportLog:
    def __init__(self, log_dir: str, node: int, relayed: bool = False, world: Optional[int] = None) -> None:
        self.path = path_for(log_dir, node, relayed)
        self.relayed = relayed
        self.world = world  # the job's world size, in each line: a reader knows how many ranks to wait for
        self.written: dict = {}  # rank -> when its last line was written (the launcher's monotonic clock)
        self.pending: dict = {}  # rank -> its last report not written yet
        self.fd: Optional[int] = None
        self.failed = False

    def note(self, rank: int, report: dict, now: float) -> None:
        """A new report of ``rank``: written now, or when EVERY seconds have passed since its last line."""
        self.pending[rank] = report
        self.flush(now)

    def flush(self, now: float, every: float = EVERY) -> None:
        due = [rank for rank in self.pending if now - self.written.get(rank, float("-inf")) >= every]
        if not due or self.failed:
            return
        lines = b"".join(json.dumps({"rank": rank, "world": self.world, **self.pending.pop(rank)},
                                    separators=(",", ":")).encode() + b"\n" for rank in sorted(due))
        self.written.update((rank, now) for rank in due)
        self.write(lines)

    def write(self, lines: bytes) -> None:
        """Whole lines appended; a write that fails is one warning, then no more writes."""
        if not lines or self.failed:
            return
        try:
            if self.fd is None:
                self.fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o644)
                if not self.relayed and self.path not in _WRITTEN:
                    _WRITTEN.append(self.path)
            os.write(self.fd, lines)
        except OSError as e:
            self.failed = True
            log.warning("cannot write the reports to %s (%s); the job goes on", self.path, e.strerror or e)

    def relay(self, items) -> None:
        """Lines another machine sent (``report_lines.kept``: only those that are one JSON object each) appended."""
        self.write(report_lines.kept(items))

    def close(self, now: float) -> None:
        """The last reports written, whatever their time."""
        self.flush(now, every=0.0)
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None


class NewLines:
    """The complete lines (without their newline) that a growing file gained since the last look: a line cut short
    is read once whole; one longer than ``longest`` bytes is skipped; at most ``most`` bytes are read a look (the
    rest at the next). A file not there (yet) has none."""

    def __init__(self, path: str, longest: Optional[int] = None, most: int = -1) -> None:
        self.path, self.longest, self.most = path, longest, most
        self.offset, self.rest, self.skipping = 0, b"", False  # skipping: the rest of a line too long

    def read(self) -> list:
        try:
            with open(self.path, "rb") as f:
                f.seek(self.offset)
                data = f.read(self.most)
        except OSError:
            return []
        self.offset += len(data)
        *lines, rest = (self.rest + data).split(b"\n")
        if self.skipping and lines:
            lines, self.skipping = lines[1:], False
        if self.longest is not None and len(rest) > self.longest:
            self.skipping = True
        self.rest = b"" if self.skipping else rest
        return [line for line in lines if self.longest is None or len(line) <= self.longest]


class OwnLines:
    """The new lines of every report log this process has written (its launcher's node's; in an elastic job, one for
    each node number its rounds gave it), each file read as it grows (``NewLines``, with its bounds)."""

    def __init__(self, longest: Optional[int] = None, most: int = -1) -> None:
        self.longest, self.most = longest, most
        self.files: dict = {}  # path -> NewLines

    def read(self) -> list:
        for path in tuple(_WRITTEN):
            self.files.setdefault(path, NewLines(path, self.longest, self.most))
        return [line for lines in self.files.values() for line in lines.read()]

    @property
    def offset(self) -> tuple:
        """Where each file was read up to: the same after a look that found nothing new."""
        return tuple(lines.offset for lines in self.files.values())


class FolderLines:
    """The new lines of every node's report log in ``folder`` (its own and those relayed), by node, each file read as
    it grows (``NewLines``)."""

    def __init__(self, folder: str) -> None:
        self.folder, self.files = folder, {}

    def read(self) -> dict:
        out: dict = {}
        try:
            names = sorted(os.listdir(self.folder))
        except OSError:
            return out
        for name in names:
            node = node_of(name)
            if node is not None:
                lines = self.files.setdefault(name, NewLines(os.path.join(self.folder, name))).read()
                if lines:
                    out.setdefault(node, []).extend(lines)
        return out
