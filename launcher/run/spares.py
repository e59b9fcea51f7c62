"""Spares for a restart: each Python worker of the next attempt started ahead, up to the end of
its interpreter's start-up (``launcher.run.spare``), and woken as that attempt's worker."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Callable, Optional

from launcher.output import sinks
from launcher.output.lines import write_all
from launcher.output.messages import log
from launcher.plan.model import WorkerSpec
from launcher.run import spare as spare_module
from launcher.run.starter import Process, ProcessStarter


@dataclass
class Spare:
    """A worker of the next attempt, waiting at the end of its interpreter's start-up (``launcher.run.spare``)."""

    proc: Process
    go: Optional[int]  # the launcher's end of the pipe it waits on
    output: object  # its PipeOutput without --log_dir; None with (its output goes to the log file)
    env: dict  # the environment it will have (it was started with this, plus the hook's two variables)
    log_id: Optional[tuple] = None  # with --log_dir: (st_dev, st_ino) of the log file its output goes to

    def close(self) -> None:
        if self.go is not None:
            os.close(self.go)
            self.go = None


class Spares:
    """The spares of a launch, by rank."""

    def __init__(self, starter: ProcessStarter) -> None:
        self.starter = starter
        self.by_rank: dict = {}  # rank -> Spare

    def make(self, specs, env_for: Callable[[WorkerSpec], dict], fds_for: Callable[[WorkerSpec], tuple] = lambda spec: ()) -> None:
        """With restarts left, start each Python worker of the next attempt up to the end of its
        interpreter's start-up, so that a restart does not wait for that (``fds_for``: the descriptors it inherits
        beside its output, as the worker would)."""
        for spec in specs:
            if spec.rank in self.by_rank or not spare_module.can_wait(spec.cmd):
                continue
            if (spec.route is not None and not spec.route.one_place) or spec.duplicated:
                continue  # its streams go to different places, or through the launcher: the restart starts it afresh
            try:
                self.by_rank[spec.rank] = start_spare(self.starter, spec, env_for(spec), fds_for(spec))
            except OSError as e:
                log.debug("no spare interpreter for rank %d: %s", spec.rank, e)
                return

    def pop(self, rank: int) -> Optional[Spare]:
        return self.by_rank.pop(rank, None)

    def pids(self) -> set:
        return {s.proc.pid for s in self.by_rank.values()}

    def keep_matching(self, wanted: dict) -> None:
        """Keep only the spares whose rank and environment are those of ``wanted`` (rank -> env): an elastic
        job's next round may give a rank another world."""
        for rank in [r for r, spare in self.by_rank.items() if wanted.get(r) != spare.env]:
            spare = self.by_rank.pop(rank)
            spare.close()
            spare.proc.kill()
            if spare.output is not None:
                spare.output.finish()

    def drop(self) -> None:
        for spare in self.by_rank.values():
            spare.close()
        self.by_rank.clear()


def start_spare(starter: ProcessStarter, spec: WorkerSpec, env: dict, fds: tuple = ()) -> Spare:
    """The worker's own command, started with the environment it will have: outside the job's
    cgroup until it is woken (``wake``), its output where the worker's goes."""
    output = None if spec.log_file else sinks.PipeOutput(spec.label)
    r, w = os.pipe2(os.O_CLOEXEC)
    out = None
    try:
        out = os.open(spec.log_file, os.O_RDWR | os.O_APPEND | os.O_CLOEXEC | os.O_NOCTTY) if spec.log_file else None
        log_id = file_id(os.fstat(out)) if out is not None else None
        stdout, stderr = output.child_fds() if output else (out, out)
        proc = starter.start(spec.cmd, spare_module.waiting_env(env, r), stdout, stderr, pass_fds=(r, *fds),
                             cpus=spec.cpus)
    except OSError:
        os.close(w)
        if output:
            output.spawned()
            output.finish()
        raise
    finally:
        os.close(r)
        if out is not None:
            os.close(out)
    if output:
        output.spawned()
    return Spare(proc, w, output, env, log_id)


def wake(spare: Spare, spec: WorkerSpec, env: dict, cgroup_fd: Optional[int]) -> bool:
    """Make ``spare`` the worker of ``spec`` with ``env``; False if it cannot be (then it is gone
    and the worker is started afresh). It enters the job's cgroup first (it waited outside, where a
    stop's cgroup.kill does not reach), so that nothing the worker starts can be outside."""
    try:
        if env != spare.env:  # left over from an attempt that did not start it
            raise OSError("it was started for another attempt")
        if spare.log_id is not None and spare.log_id != file_id(os.stat(spec.log_file)):
            raise OSError("its log file was replaced since")
        if cgroup_fd is not None:
            os.write(cgroup_fd, str(spare.proc.pid).encode())
        write_all(spare.go, spare_module.message(env))
    except OSError as e:
        log.debug("spare for rank %d not used (%s); starting the worker afresh", spec.rank, e)
        spare.close()
        spare.proc.kill()
        if spare.output is not None:  # its pipes: the fresh worker gets its own
            spare.output.finish()
        return False
    spare.close()
    return True


def file_id(st: os.stat_result) -> tuple:
    return st.st_dev, st.st_ino
