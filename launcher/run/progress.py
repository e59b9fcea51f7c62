"""This node's workers' progress pages (``launcher.progress_page``): made when something reads them (``--hang_timeout``,
the monitor, the straggler's search on a node of several workers), one memory file per local rank for the whole
launch, passed to each worker of that local rank (and to its spare) as an inherited descriptor; read when the
event loop turns. A page the kernel cannot make is one warning, and that worker reports nothing."""

from __future__ import annotations

import mmap
import os
from dataclasses import dataclass
from typing import Iterable, Optional

from launcher import envvars as ev
from launcher import progress_page
from launcher.output.messages import log


@dataclass
class Seen:
    """What the launcher knows of one page: its last report, and when it last changed (or the worker started)."""

    sequence: int
    report: Optional[dict]  # the last whole report of this worker; None: none yet
    changed: float  # monotonic
    step_seconds: Optional[float] = None  # seconds per step between its last two reports of different steps


class ProgressPages:
    def __init__(self, wanted: bool) -> None:
        self.wanted = wanted
        self.pages: dict = {}  # local rank -> (fd, mmap)
        self.seen: dict = {}  # local rank -> Seen
        self.failed = False

    def fds(self, local_rank: int) -> tuple:
        """The descriptor a worker of ``local_rank`` inherits (made on first use), or none."""
        page = self._page(local_rank)
        return (page[0],) if page is not None else ()

    def env(self, local_rank: int) -> dict:
        page = self._page(local_rank)
        return {ev.PROGRESS_FD: str(page[0])} if page is not None else {}

    def started(self, local_rank: int, now: float, fresh: bool = True) -> None:
        """A worker of ``local_rank`` starts (``fresh``: a new process, its page emptied first; else a worker kept from
        the round before, whose reports go on): no report of it is taken as older than ``now``."""
        page = self._page(local_rank)
        if page is None:
            return
        if fresh:
            page[1][:] = bytes(progress_page.SIZE)
        self.seen[local_rank] = Seen(progress_page.read(page[1])[0], None, now)

    def poll(self, now: float) -> list:
        """Note each page whose report changed since the last look; the local ranks of the new reports."""
        changed = []
        for local_rank, (_, memory) in self.pages.items():
            seen = self.seen.get(local_rank)
            sequence, body = progress_page.read(memory)
            if seen is None or body is None or sequence == seen.sequence:
                continue
            report = progress_page.decode(body)
            seen.sequence, seen.changed = sequence, now
            if report is not None:
                seen.step_seconds = _per_step(seen.report, report) or seen.step_seconds
                seen.report = report
                changed.append(local_rank)
        return changed

    def stalled(self, local_ranks: Iterable[int], limit: float, now: float) -> Optional[tuple]:
        """(local rank, its last report) of the first worker that reported and has not reported again for ``limit``."""
        for local_rank in sorted(local_ranks):
            seen = self.seen.get(local_rank)
            if seen is not None and seen.report is not None and now - seen.changed >= limit:
                return local_rank, seen.report
        return None

    def last(self, local_rank: int) -> Optional[dict]:
        seen = self.seen.get(local_rank)
        return seen.report if seen is not None else None

    def pace(self, local_rank: int) -> Optional[float]:
        seen = self.seen.get(local_rank)
        return seen.step_seconds if seen is not None else None

    def close(self) -> None:
        for fd, memory in self.pages.values():
            memory.close()
            os.close(fd)
        self.pages.clear()

    def _page(self, local_rank: int):
        if not self.wanted or self.failed:
            return None
        if local_rank not in self.pages:
            fd = None
            try:
                fd = os.memfd_create(f"launcher-progress-{local_rank}", os.MFD_CLOEXEC)
                os.ftruncate(fd, progress_page.SIZE)
                self.pages[local_rank] = (fd, mmap.mmap(fd, progress_page.SIZE, mmap.MAP_SHARED))
            except (OSError, AttributeError) as e:  # no memfd here (an old kernel), or no memory
                if fd is not None:
                    os.close(fd)
                self.failed = True
                log.warning("no progress page for the workers (%s): their reports are not read", e)
                return None
        return self.pages[local_rank]


def _per_step(before: Optional[dict], after: dict) -> Optional[float]:
    """Seconds per step from two reports (by the worker's clock), when both name a step and the step moved on."""
    if before is None or before["step"] is None or after["step"] is None or after["step"] <= before["step"]:
        return None
    seconds = (after["t"] - before["t"]) / (after["step"] - before["step"])
    return seconds if seconds >= 0 else None
