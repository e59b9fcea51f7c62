"""Stops a job's processes when its launcher dies without doing it (kill -9, OOM killer).

Started by the launcher in a session of its own, with the job's run id and the grace time as
arguments, it reads its standard input:

- ``pid N``: a worker started; it is pinned at once (a pidfd), while the launcher still holds it;
- ``cgroup PATH``: the job's cgroup, when the launcher could make one;
- ``quit``: the launcher cleaned up itself.

End of file without ``quit`` means the launcher is gone. Then every process of the job gets
SIGTERM, and whatever still runs after the grace time SIGKILL: with a cgroup, the kernel's
``cgroup.kill`` takes everything in it; without, the job is the workers, the processes in their
groups while the group's leader lives, and every process whose environment carries the run id
(see ``launcher.run.processes``). Needs only the standard library, psutil and that module.
"""

from __future__ import annotations

import os
import signal
import sys
import time

from launcher.output.console import console
from launcher.run import processes

POLL = 0.05
EMPTY_WAIT = 5.0  # after cgroup.kill, how long to wait for the cgroup to empty before removing it


class Watch:
    def __init__(self, run_id: str) -> None:
        self.run_id = run_id
        self.leaders: dict = {}  # pid -> processes.Pinned
        self.cgroup = None

    def take(self, line: str) -> bool:
        """Apply one line of the launcher; False for ``quit``."""
        word, _, arg = line.strip().partition(" ")
        if word == "quit":
            return False
        if word == "pid" and arg.isdigit():
            self.forget_ended()
            pinned = processes.pin(int(arg), processes.Job(self.run_id, groups=frozenset({int(arg)})))
            if pinned is not None:
                self.leaders[pinned.pid] = pinned
        elif word == "cgroup" and arg:
            self.cgroup = processes.JobCgroup.at(arg)
        return True

    def forget_ended(self) -> None:
        """Workers that have ended, dropped with their pidfds (over many restarts they would pile up)."""
        ended = [p for p in self.leaders.values() if not p.running()]
        for p in ended:
            del self.leaders[p.pid]
        processes.close_all(ended)

    def job(self) -> processes.Job:
        live = frozenset(pid for pid, p in self.leaders.items() if p.running())
        return processes.Job(self.run_id, groups=live, cgroup=self.cgroup, exclude=frozenset({os.getpid()}))

    def targets(self) -> list:
        job = self.job()
        found = processes.members(job)
        found += [p for pid, p in self.leaders.items() if p.running() and pid not in {f.pid for f in found}]
        return found

    def sweep(self, grace: float) -> int:
        """SIGTERM, grace, SIGKILL; the number of processes stopped."""
        targets = self.targets()
        processes.signal_members(targets, signal.SIGTERM)
        deadline = time.monotonic() + grace
        while time.monotonic() < deadline and any(p.running() for p in targets):
            time.sleep(POLL)
        if self.cgroup is not None:
            self.cgroup.kill()
        rest = self.targets()
        processes.signal_members(rest, signal.SIGKILL)
        processes.close_all(rest)
        processes.close_all(targets)
        self._remove_cgroup()
        return len(targets)

    def _remove_cgroup(self) -> None:
        if self.cgroup is None:
            return
        deadline = time.monotonic() + EMPTY_WAIT
        while not self.cgroup.remove() and time.monotonic() < deadline:
            time.sleep(POLL)


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    run_id, grace = argv[0], float(argv[1])
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    watch = Watch(run_id)
    for line in sys.stdin:
        if not watch.take(line):
            os._exit(0)  # the launcher waits for this exit: skip the interpreter's teardown
    stopped = watch.sweep(grace)
    if stopped:  # through the console: a stderr nobody reads does not keep this process either
        console.write(2, f"launcher: watchdog: the launcher died; stopped {stopped} leftover process(es)\n".encode())
        console.finish()
    os._exit(0)
