"""``launcher.runtime.report(step=..., **scalars)``: a worker tells its launcher how far it got, for ``--hang_timeout``
(a rank that writes lines but makes no step is found), the monitor (``launcher_worker_step``), ``--report_log``
(what ``launcher tune`` measures a trial's rate from) and the straggler's search (``launcher.plan.stragglers``: each
step's own work, its compute time, against the fastest rank's).

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
from contextlib import suppress
from typing import Optional

from launcher import envvars as ev
from launcher import progress_page
from launcher.runtime import timing


class _Page:
    def __init__(self) -> None:
        self.memory: Optional[mmap.mmap] = None
        self.sequence = 0
        self.lock = threading.Lock()
        self.opened = False  # looked for the launcher's page (once)
        self.last: Optional[tuple] = None  # (perf_counter, step) of the last report that named a step

    def open(self) -> None:
        self.opened = True
        try:
            fd = int(os.environ.get(ev.PROGRESS_FD, ""))
            self.memory = mmap.mmap(fd, progress_page.SIZE, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        except (ValueError, OSError):
            self.memory = None


_page = _Page()


def report(step: Optional[int] = None, compute: Optional[float] = None, **scalars) -> None:
    """This worker's progress: ``step`` (a whole number) and any numbers by name (``loss=0.41``); the launcher reads
    the last one. Numbers that are not finite, and names past the 32nd, are left out. Never raises.

    ``compute``: the seconds of this step's own work, without its waits for the other ranks, for a program that
    measures it. Without it, where fleet's gradient sync or ``timed_allreduce_hook`` counted the waits, it is the
    time since the last report less the waits counted meanwhile, per step."""
    page = _page
    if not page.opened:
        page.open()
    if page.memory is None:
        return
    with suppress(Exception):  # a report never fails the step
        step = int(step) if step is not None else None
        compute = _compute(page, step, compute)
        body = progress_page.encode(step, time.time(), scalars, compute)
        with page.lock:
            page.sequence = progress_page.write(page.memory, page.sequence, body)


def _compute(page: _Page, step: Optional[int], given) -> Optional[float]:
    """The step's compute time: ``given``, else the time since the last report less the waits counted, per step."""
    if step is None:  # a report of no step: the waits go on adding up for the next one that names one
        return given
    now, waited = time.perf_counter(), timing.waits.take()
    last, page.last = page.last, (now, step)
    if given is not None:
        return given
    if waited is None or last is None or step <= last[1]:
        return None
    return max(0.0, now - last[0] - waited) / (step - last[1])
