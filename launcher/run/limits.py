"""The launcher's own resource limits: enough file descriptors for its workers, checked before anything starts."""

from __future__ import annotations

import os
import resource

from launcher.errors import LaunchError

FD_MARGIN = 32  # descriptors a launch needs besides its workers'


def check_limits(workers: int, log_dir: bool, nodes: int = 1, extra: int = 0) -> None:
    """Refuse, before anything starts, a launch that would run out of file descriptors (its workers'
    pipes and logs; on node 0, a connection per node and as many waiting for their hello; ``extra``:
    any more, such as the copies of filtered lines); raise the soft limit up to the hard one where that is enough."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    need = _open_fds() + FD_MARGIN + workers * (1 if log_dir else 2) + 4 + (2 * nodes if nodes > 1 else 0) + extra
    what = f"{workers} worker(s)" + (f" and the connections of {nodes} nodes" if nodes > 1 else "")
    if soft != resource.RLIM_INFINITY and soft < need:
        if hard == resource.RLIM_INFINITY or hard >= need:
            resource.setrlimit(resource.RLIMIT_NOFILE, (need if hard == resource.RLIM_INFINITY else hard, hard))
            return
        raise LaunchError(f"{what} need about {need} open files in the launcher, but the limit "
                          f"is {hard} (ulimit -n); raise it (ulimit -n {need}) or start fewer workers.")


def _open_fds() -> int:
    try:
        return len(os.listdir("/proc/self/fd"))
    except OSError:
        return 16


def store_connections(expected: int, keep_free: int) -> int:
    """How many client connections node 0's rendezvous store may hold: the soft limit on open files
    raised (up to the hard one) so that twice ``expected`` fit, less ``keep_free`` for the rest of
    the launch and the descriptors open now."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    need = _open_fds() + keep_free + 2 * expected
    if soft != resource.RLIM_INFINITY and soft < need and (hard == resource.RLIM_INFINITY or hard > soft):
        soft = need if hard == resource.RLIM_INFINITY else min(need, hard)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    if soft == resource.RLIM_INFINITY:
        return 2 * expected + 1024
    return max(0, soft - _open_fds() - keep_free)
