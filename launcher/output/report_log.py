"""``--report_log``: the workers' reports (``launcher.runtime.report``: the step and the numbers by name) kept in
``LOG_DIR/reports.nodeN.jsonl``, a line ``{"rank": R, "world": W, "step": S, "t": T, "scalars": {...}}`` each time a worker's
report changed, at most one line per worker every EVERY seconds (``t``: the worker's own clock at its report, so that
a rate read from two lines is the worker's, whenever the launcher looked). What ``launcher tune`` measures a trial's
rate from. Keeping it never fails the job: a write that fails is one warning, then no more writes."""

from __future__ import annotations

import json
import os
from typing import Optional

from launcher.output.messages import log
from launcher.output.state_file import is_node_file
from launcher.untrusted import json_object

EVERY = 0.1  # seconds between two lines of one worker
PREFIX, SUFFIX = "reports.node", ".jsonl"
RELAYED = ".relayed.jsonl"  # another machine's report log, its lines sent here (``launcher tune`` across nodes)


def path_for(log_dir: str, node: int, suffix: str = SUFFIX) -> str:
    return os.path.join(log_dir, f"{PREFIX}{node}{suffix}")


def is_report_log(name: str, suffix: str = SUFFIX) -> bool:
    return is_node_file(name, PREFIX, suffix)


class ReportLog:
    def __init__(self, log_dir: str, node: int, suffix: str = SUFFIX, world: Optional[int] = None) -> None:
        self.path = path_for(log_dir, node, suffix)
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
                                    separators=(",", ":")).encode() + b"\n"
                         for rank in sorted(due))
        self.written.update((rank, now) for rank in due)
        self.write(lines)

    def write(self, lines: bytes) -> None:
        """Whole lines at the end of the file; a write that fails is said once, and no more is written."""
        if self.failed:
            return
        try:
            if self.fd is None:
                self.fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o644)
            os.write(self.fd, lines)
        except OSError as e:
            self.failed = True
            log.warning("cannot write the reports to %s (%s); the job goes on", self.path, e.strerror or e)

    def close(self, now: float) -> None:
        """The last reports written, whatever their time."""
        self.flush(now, every=0.0)
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None


class GrowingFile:
    """The complete lines of a file that grows, each read once (a line cut short is read once it is whole)."""

    def __init__(self, path: str) -> None:
        self.path, self.offset, self.rest = path, 0, b""

    def new_lines(self) -> list:
        try:
            with open(self.path, "rb") as f:
                f.seek(self.offset)
                data = f.read()
        except OSError:
            return []
        self.offset += len(data)
        *lines, self.rest = (self.rest + data).split(b"\n")
        return lines


class FolderLines:
    """The new lines of every node's report log in ``folder`` (and, with ``relayed``, of those sent from other
    machines), as text by node."""

    def __init__(self, folder: str, relayed: bool = False) -> None:
        self.folder, self.files = folder, {}
        self.suffixes = (SUFFIX, RELAYED) if relayed else (SUFFIX,)

    def new_lines(self) -> dict:
        out: dict = {}
        try:
            names = sorted(os.listdir(self.folder))
        except OSError:
            return out
        for name in names:
            suffix = next((s for s in self.suffixes if is_report_log(name, s)), None)
            if suffix is not None:
                lines = self.files.setdefault(name, GrowingFile(os.path.join(self.folder, name))).new_lines()
                if lines:
                    node = int(name[len(PREFIX):-len(suffix)])
                    out.setdefault(node, []).extend(x.decode(errors="replace") for x in lines)
        return out


class RelayedLogs:
    """The report lines other machines send, each node's in ``reports.nodeN.relayed.jsonl`` of ``folder``: only lines
    that are one JSON object each."""

    def __init__(self, folder: str) -> None:
        self.folder, self.logs = folder, {}

    def write(self, node: int, lines: list) -> None:
        kept = [line for line in lines if json_object(line.encode(errors="replace")) is not None]
        if kept and type(node) is int and 0 <= node < 1 << 31:
            log_file = self.logs.setdefault(node, ReportLog(self.folder, node, RELAYED))
            log_file.write("".join(line.replace("\n", " ") + "\n" for line in kept).encode(errors="replace"))

    def close(self) -> None:
        for log_file in self.logs.values():
            log_file.close(0.0)
