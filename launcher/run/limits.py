"""The launcher's own resource limits: enough file descriptors for its workers, checked before anything starts."""

from __future__ import annotations

import os
import resource

from launcher.errors import LaunchError

FD_MARGIN = 32  # descriptors a launch needs besides its workers'


def check_limits(workers: int, log_dir: bool) -> None:
    """Refuse, before anything starts, a launch that would run out of file descriptors; raise the
    soft limit up to the hard one where that is enough."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    need = _open_fds() + FD_MARGIN + workers * (1 if log_dir else 2) + 4
    if soft != resource.RLIM_INFINITY and soft < need:
        if hard == resource.RLIM_INFINITY or hard >= need:
            resource.setrlimit(resource.RLIMIT_NOFILE, (need if hard == resource.RLIM_INFINITY else hard, hard))
            return
        raise LaunchError(f"{workers} worker(s) need about {need} open files in the launcher, but the limit "
                          f"is {hard} (ulimit -n); raise it (ulimit -n {need}) or start fewer workers.")


def _open_fds() -> int:
    try:
        return len(os.listdir("/proc/self/fd"))
    except OSError:
        return 16
