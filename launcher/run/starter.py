"""What a run needs of the operating system, as two interfaces (``ProcessStarter``, ``Clock``) and
their real implementations: the attempt driver takes both as arguments, so that tests replay
histories against fakes, without processes and without waiting."""

from __future__ import annotations

import errno
import os
import selectors
import subprocess
import sys
import time
from typing import Optional, Protocol, Sequence

from launcher.run import child
from launcher.run import processes


class Process(Protocol):
    """A started process, as ``subprocess.Popen`` gives it."""

    pid: int
    returncode: Optional[int]

    def kill(self) -> None: ...


class ProcessStarter(Protocol):
    """How the launcher starts its processes, sees them exit, signals and reaps them, and finds
    the rest of the job (orphans, the job's cgroup, the watchdog)."""

    def start(self, cmd: Sequence[str], env: dict, stdout: Optional[int], stderr: Optional[int],
              cgroup_fd: Optional[int] = None, pass_fds: tuple = (), cpus: Optional[frozenset] = None) -> Process:
        """A worker (or a spare) in its own session, bound to ``cpus`` when given; OSError when it cannot be started."""

    def exit_status(self, pid: int) -> Optional[int]:
        """Its return code once it ended (negative: killed by that signal), None while it runs; not reaped."""

    def signal_group(self, pgid: int, sig: int) -> None:
        """``sig`` to the process group; nothing if it is gone."""

    def reap(self, pid: int, wait: bool) -> bool:
        """Collect the ended child ``pid`` (waiting for it if ``wait``); True once it is collected."""

    def children(self) -> list:
        """The launcher's children (orphans come back to it)."""

    def descendants(self) -> list:
        """Every process below the launcher."""

    def adopt_orphans(self) -> None:
        """Make the launcher the subreaper of everything its workers start."""

    def make_cgroup(self, run_id: str, env: dict) -> Optional[processes.JobCgroup]:
        """The job's own cgroup where one can be made, else None."""

    def start_watchdog(self, run_id: str, grace: float) -> Optional[subprocess.Popen]:
        """The process that stops the job if the launcher is killed; it reads orders on its stdin."""


class Clock(Protocol):
    """Time as the attempt driver sees it, and its only way to wait."""

    def monotonic(self) -> float: ...

    def time(self) -> float: ...

    def sleep(self, seconds: float) -> None: ...

    def select(self, selector: selectors.BaseSelector, timeout: Optional[float]) -> list:
        """Wait up to ``timeout`` s (None: until something happens) for ``selector``'s descriptors."""


class SystemClock:
    def monotonic(self) -> float:
        return time.monotonic()

    def time(self) -> float:
        return time.time()

    def sleep(self, seconds: float) -> None:
        time.sleep(seconds)

    def select(self, selector: selectors.BaseSelector, timeout: Optional[float]) -> list:
        return selector.select(timeout)


class SubprocessStarter:
    """The real starter: ``subprocess.Popen``, ``waitid``, ``killpg``, /proc."""

    def start(self, cmd, env, stdout, stderr, cgroup_fd=None, pass_fds=(), cpus=None) -> subprocess.Popen:
        try:
            return subprocess.Popen(
                cmd,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=stdout,
                stderr=stderr,
                pass_fds=pass_fds,
                start_new_session=True,
                preexec_fn=child.child_setup(os.getpid(), cgroup_fd, cpus),
            )
        except subprocess.SubprocessError:  # only the CPUs can fail there: the plan checked them against the allowed
            from launcher.plan.topology import format_cpu_list

            raise OSError(errno.EINVAL, f"it could not be bound to CPUs {format_cpu_list(cpus or ())}") from None

    # the kernel's side, as launcher.run.child and processes do it
    exit_status = staticmethod(child.exit_status)
    signal_group = staticmethod(child.killpg)
    reap = staticmethod(child.reap)
    children = staticmethod(child.children)
    descendants = staticmethod(child.descendants)
    adopt_orphans = staticmethod(child.become_subreaper)
    make_cgroup = staticmethod(processes.JobCgroup.create)

    def start_watchdog(self, run_id: str, grace: float) -> subprocess.Popen:
        root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
        code = f"import sys; sys.path.insert(0, {root!r}); from launcher.run import watchdog; watchdog.main()"
        return subprocess.Popen(
            [sys.executable, "-c", code, run_id, repr(grace)],
            stdin=subprocess.PIPE,
            stdout=subprocess.DEVNULL,
            start_new_session=True,
        )
