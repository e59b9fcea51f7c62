"""Finding and signalling the processes of one job without ever touching anyone else's.

A process id is only a number, and the kernel hands it out again once its process is reaped. So a
process of the job is *pinned* before it is signalled: a pidfd is opened on its id, then the
process behind the id is checked to still belong to the job (by its cgroup, its process group or
the job's run id in its environment); a signal sent through the pidfd reaches that process or
nobody. Where the kernel has no pidfds (before Linux 5.3) the check is made just before ``kill``.

Where it can, the launcher puts the job in a cgroup of its own (cgroup v2 with ``cgroup.kill``,
Linux 5.14+, and a cgroup the user may write to, e.g. as root or under a delegated systemd scope):
then every process the job ever starts, even one that left its session and cleared its
environment, is found by the kernel, and ``cgroup.kill`` ends them all at once, also those forking
while it runs.

Used by the launcher and by the watchdog, so: standard library and psutil only.
"""

from __future__ import annotations

import errno
import os
import signal
from contextlib import suppress
from dataclasses import dataclass
from typing import Iterable, Optional

RUN_ID_VAR = "LAUNCHER_RUN_ID"
NO_CGROUP_VAR = "LAUNCHER_NO_CGROUP"  # set to 1 to use the sweep only


# ---------------------------------------------------------------- the job's cgroup


@dataclass(frozen=True)
class JobCgroup:
    path: str  # the cgroup's folder under the cgroup2 mount
    name: str  # as /proc/PID/cgroup shows it

    @classmethod
    def create(cls, run_id: str, env=os.environ) -> Optional["JobCgroup"]:
        """A new cgroup below the launcher's own, or None where that cannot be had."""
        if env.get(NO_CGROUP_VAR, "") not in ("", "0"):
            return None
        found = own_cgroup_dir()
        if found is None:
            return None
        parent, rel = found
        leaf = f"launcher-{run_id}"
        path = os.path.join(parent, leaf)
        try:
            os.mkdir(path)
        except OSError:
            return None
        group = cls(path, rel.rstrip("/") + "/" + leaf)
        if not (os.path.exists(group.file("cgroup.kill")) and _writable(parent)):
            group.remove()
            return None
        return group

    @classmethod
    def at(cls, path: str) -> "JobCgroup":
        """The cgroup whose folder is ``path``."""
        rel = os.path.relpath(path, _cgroup2_mount() or "/")
        return cls(path, "/" if rel == "." else "/" + rel)

    def file(self, name: str) -> str:
        return os.path.join(self.path, name)

    def open_procs(self) -> int:
        """A descriptor on cgroup.procs that a new process writes "0" to, to enter the cgroup."""
        return os.open(self.file("cgroup.procs"), os.O_WRONLY | os.O_CLOEXEC)

    def pids(self) -> list:
        try:
            with open(self.file("cgroup.procs")) as f:
                return [int(line) for line in f if line.strip()]
        except OSError:
            return []

    def kill(self) -> None:
        with suppress(OSError), open(self.file("cgroup.kill"), "w") as f:
            f.write("1")

    def remove(self) -> bool:
        try:
            os.rmdir(self.path)
            return True
        except FileNotFoundError:
            return True
        except OSError:
            return False


def own_cgroup_dir() -> Optional[tuple]:
    """(folder, name) of this process's cgroup v2 (unified hierarchy), or None."""
    mount = _cgroup2_mount()
    rel = cgroup_of("self") if mount is not None else None
    if rel is None or rel.endswith("(deleted)"):
        return None
    path = os.path.join(mount, rel.lstrip("/"))
    return (path, rel) if os.path.isdir(path) else None


def _cgroup2_mount() -> Optional[str]:
    try:
        with open("/proc/self/mountinfo") as f:
            for line in f:
                left, _, right = line.partition(" - ")
                if right.split(" ", 1)[0] == "cgroup2":
                    return left.split()[4]
    except OSError:
        return None
    return None


def _writable(folder: str) -> bool:
    """Whether a process may be moved out of ``folder``'s cgroup: try the write that needs it."""
    try:
        fd = os.open(os.path.join(folder, "cgroup.procs"), os.O_WRONLY | os.O_CLOEXEC)
    except OSError:
        return False
    os.close(fd)
    return True


def cgroup_of(pid) -> Optional[str]:
    """The cgroup v2 of ``pid`` (a number, or "self") as /proc shows it, or None."""
    try:
        with open(f"/proc/{pid}/cgroup") as f:
            for line in f:
                if line.startswith("0::"):
                    return line[3:].strip()
    except OSError:
        return None
    return None


# ---------------------------------------------------------------- membership and pinning


@dataclass(frozen=True)
class Job:
    """How to recognise a process of the job."""

    run_id: str
    # process groups known to be the workers' own: their leader is alive or not yet reaped, so the
    # group's id cannot have been given to anyone else
    groups: frozenset = frozenset()
    cgroup: Optional[JobCgroup] = None
    exclude: frozenset = frozenset()  # e.g. the launcher and its watchdog

    def owns(self, pid: int) -> bool:
        if pid in self.exclude or pid == os.getpid():
            return False
        if self.cgroup is not None and cgroup_of(pid) == self.cgroup.name:
            return True
        try:
            if os.getpgid(pid) in self.groups:
                return True
        except OSError:
            return False
        return _environ_run_id(pid) == self.run_id

    def candidates(self) -> set:
        pids = set(self.cgroup.pids()) if self.cgroup is not None else set()
        import psutil

        for p in psutil.process_iter():
            pids.add(p.pid)
        return pids


def _environ_run_id(pid: int) -> Optional[str]:
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            data = f.read()
    except OSError:
        return None
    key = RUN_ID_VAR.encode() + b"="
    for item in data.split(b"\0"):
        if item.startswith(key):
            return item[len(key):].decode(errors="replace")
    return None


class Pinned:
    """One process held so that a signal cannot reach another one that later gets its id."""

    def __init__(self, pid: int, fd: Optional[int]) -> None:
        self.pid = pid
        self.fd = fd

    def send(self, sig: int) -> None:
        with suppress(OSError):
            if self.fd is not None:
                signal.pidfd_send_signal(self.fd, sig)
            else:
                os.kill(self.pid, sig)

    def running(self) -> bool:
        try:
            with open(f"/proc/{self.pid}/stat", "rb") as f:
                state = f.read().rsplit(b")", 1)[1].split()[0]
        except (OSError, IndexError):
            return False
        if state in (b"Z", b"X"):
            return False
        if self.fd is not None:
            try:  # the id may have been recycled: ask the pidfd itself
                signal.pidfd_send_signal(self.fd, 0)
            except ProcessLookupError:
                return False
            except OSError:
                pass
        return True

    def close(self) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None


def pin(pid: int, job: Job) -> Optional[Pinned]:
    """``pid`` pinned, if it is (still) a live process of ``job``; None otherwise."""
    fd = None
    if hasattr(os, "pidfd_open"):
        try:
            fd = os.pidfd_open(pid)
        except ProcessLookupError:
            return None
        except OSError as e:
            if e.errno not in (errno.ENOSYS, errno.EINVAL, errno.EPERM):
                return None
    # checked after the pidfd is open: the process it refers to is the one checked
    if not job.owns(pid):
        if fd is not None:
            os.close(fd)
        return None
    pinned = Pinned(pid, fd)
    if not pinned.running():
        pinned.close()
        return None
    return pinned


def members(job: Job, pids: Optional[Iterable[int]] = None) -> list:
    """Every live process of ``job``, pinned. The caller closes them."""
    pinned = (pin(pid, job) for pid in sorted(job.candidates() if pids is None else pids))
    return [p for p in pinned if p is not None]


# Python's own helpers of a multiprocessing "spawn" or "forkserver" context: each ends by itself once
# the last process that uses it has exited (its pipe closes), a moment after the worker.
PF_EXITING = 0x4  # a process's flag (/proc/PID/stat) while it exits
_SELF_ENDING = (b"from multiprocessing.resource_tracker import main", b"from multiprocessing.forkserver import main")


def is_self_ending(pid: int) -> bool:
    """Whether ``pid`` is a helper of Python's multiprocessing that ends by itself (resource_tracker,
    forkserver), or is ending (exiting or a zombie: it shows no command line any more)."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            cmdline = f.read()
        with open(f"/proc/{pid}/stat", "rb") as f:
            fields = f.read().rpartition(b")")[2].split()  # state, ppid, pgrp, session, tty, tpgid, flags, ...
    except OSError:
        return True  # gone already
    ending = fields[0] in (b"Z", b"X") or int(fields[6]) & PF_EXITING
    return bool(ending) or any(marker in cmdline for marker in _SELF_ENDING)


def signal_members(pinned: Iterable[Pinned], sig: int) -> None:
    for p in pinned:
        p.send(sig)


def close_all(pinned: Iterable[Pinned]) -> None:
    for p in pinned:
        p.close()
