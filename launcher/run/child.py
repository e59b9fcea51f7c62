"""The launcher's children as the kernel shows them: the set-up before a worker's exec, the
subreaper flag, listing, reaping and signalling them."""

from __future__ import annotations

import ctypes
import os
import signal
from contextlib import suppress
from typing import Optional

PR_SET_PDEATHSIG = 1
PR_SET_CHILD_SUBREAPER = 36
PR_SET_PTRACER = 0x59616D61
LIBC = ctypes.CDLL(None, use_errno=True)


def become_subreaper() -> None:
    """Orphans of the job come back to the launcher (and are reaped as they end)."""
    LIBC.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)


def child_setup(launcher_pid: int, cgroup_fd: Optional[int], cpus: Optional[frozenset] = None):
    def setup() -> None:
        """In the worker, before exec: enter the job's cgroup; its CPUs (every thread it starts inherits them);
        SIGTERM when the launcher dies."""
        if cpus is not None:
            os.sched_setaffinity(0, cpus)  # before anything of the worker runs; a failure fails the start
        if cgroup_fd is not None:
            with suppress(OSError):
                os.write(cgroup_fd, b"0")
        LIBC.prctl(PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
        # let the launcher's own helpers (py-spy, for stacks) trace the worker under Yama's ptrace_scope=1
        LIBC.prctl(PR_SET_PTRACER, launcher_pid, 0, 0, 0)
        if os.getppid() != launcher_pid:  # the launcher died before the line above
            os._exit(1)

    return setup


def children() -> list:
    """This process's children, from /proc (no psutil scan of the whole table where avoidable)."""
    pid = os.getpid()
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as f:
            return [int(p) for p in f.read().split()]
    except OSError:
        import psutil

        try:
            return [p.pid for p in psutil.Process(pid).children()]
        except psutil.Error:
            return []


def descendants() -> list:
    import psutil

    try:
        return [p.pid for p in psutil.Process().children(recursive=True)]
    except psutil.Error:
        return []


def exit_status(pid: int) -> Optional[int]:
    """The return code of ``pid`` if it ended (negative: killed by that signal), None while it runs.
    Not reaped: the caller decides when its process group id may go."""
    info = os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
    if info is None:
        return None
    return info.si_status if info.si_code == os.CLD_EXITED else -info.si_status


def reap(pid: int, wait: bool) -> bool:
    try:
        done, _ = os.waitpid(pid, 0 if wait else os.WNOHANG)
        return done == pid
    except ChildProcessError:
        return True


def killpg(pgid: int, sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass
