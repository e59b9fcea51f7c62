"""``--report_log``: the workers' reports (``launcher.runtime.report``: the step and the numbers by name) kept in
``LOG_DIR/reports.nodeN.jsonl``, a line ``{"rank": R, "step": S, "t": T, "scalars": {...}}`` each time a worker's
report changed, at most one line per worker every EVERY seconds (``t``: the worker's own clock at its report, so that
a rate read from two lines is the worker's, whenever the launcher looked). What ``launcher tune`` measures a trial's
rate from. Keeping it never fails the job: a write that fails is one warning, then no more writes."""

from __future__ import annotations

import json
import os
from typing import Optional

from launcher.output.messages import log
from launcher.output.state_file import is_node_file

EVERY = 0.1  # seconds between two lines of one worker
PREFIX, SUFFIX = "reports.node", ".jsonl"


def path_for(log_dir: str, node: int) -> str:
    return os.path.join(log_dir, f"{PREFIX}{node}{SUFFIX}")


def is_report_log(name: str) -> bool:
    return is_node_file(name, PREFIX, SUFFIX)


class ReportLog:
    def __init__(self, log_dir: str, node: int) -> None:
        self.path = path_for(log_dir, node)
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
        lines = b"".join(json.dumps({"rank": rank, **self.pending.pop(rank)}, separators=(",", ":")).encode() + b"\n"
                         for rank in sorted(due))
        self.written.update((rank, now) for rank in due)
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
