"""``launcher.runtime.report(step=..., **scalars)``: a worker tells its launcher how far it got, for ``--hang_timeout``
(a rank that writes lines but makes no step is found) and the monitor (``launcher_worker_step``).

    from launcher.runtime import report
    for step, batch in enumerate(loader):
        ...
        report(step=step, loss=loss.item())

It copies the report into the worker's progress page (``launcher.progress_page``), memory the launcher shares with
it: no system call, no lock held across the step, never blocking, never raising. Where the launcher gave no page
(no monitor, no --hang_timeout, or not under the launcher) it returns at once. Imports no torch."""

from __future__ import annotations

import mmap
import os
import threading
import time
from typing import Optional

from launcher import envvars as ev
from launcher import progress_page


class _Page:
    def __init__(self) -> None:
        self.memory: Optional[mmap.mmap] = None
        self.sequence = 0
        self.lock = threading.Lock()
        self.opened = False  # looked for the launcher's page (once)

    def open(self) -> None:
        self.opened = True
        try:
            fd = int(os.environ.get(ev.PROGRESS_FD, ""))
            self.memory = mmap.mmap(fd, progress_page.SIZE, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        except (ValueError, OSError):
            self.memory = None


_page = _Page()


def report(step: Optional[int] = None, **scalars) -> None:
    """This worker's progress: ``step`` (a whole number) and any numbers by name (``loss=0.41``); the launcher reads
    the last one. Numbers that are not finite, and names past the 32nd, are left out. Never raises."""
    page = _page
    if not page.opened:
        page.open()
    if page.memory is None:
        return
    try:
        body = progress_page.encode(int(step) if step is not None else None, time.time(), scalars)
        with page.lock:
            page.sequence = progress_page.write(page.memory, page.sequence, body)
    except Exception:  # noqa: BLE001 - a report never fails the step
        pass
