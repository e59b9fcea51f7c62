"""The workers of one attempt on this node: start them (afresh, from spares, or kept from the round before),
learn of their exits, signal and kill them, keep them for the next round, find what they left running, and say
how they ended.

Never touching what is not ours: a worker is its own process group leader, and the launcher does
not reap a worker until it forgets the worker's group, so the group's id cannot be given to anyone
else while the launcher may still signal it. Every other process of the job (leftovers) is pinned
through a pidfd and checked before it is signalled (``launcher.run.processes``).
"""

from __future__ import annotations

import os
import signal
from contextlib import suppress
from dataclasses import dataclass
from typing import Optional

from launcher import envvars as ev, local_channel as lc
from launcher.errors import LaunchError
from launcher.output import error_file
from launcher.output import log_files
from launcher.output import sinks
from launcher.output import state_file
from launcher.output.messages import log
from launcher.plan import policy
from launcher.plan.model import WorkerSpec
from launcher.run import processes
from launcher.run import spares as spares_module
from launcher.run import warm as warm_module
from launcher.run.session import Launch
from launcher.run.spares import Spare
from launcher.run.starter import Process
from launcher.output import routes


class StartFailed(Exception):
    """A worker could not be started for want of a resource (descriptors, processes, memory)."""

    def __init__(self, spec: WorkerSpec, reason: str) -> None:
        super().__init__(f"could not start {spec.label}: {reason}")
        self.rank = spec.rank


@dataclass(frozen=True)
class Failure:
    rank: int
    local_rank: int
    pid: int
    returncode: int
    run_time: float
    log_file: Optional[str]
    last_lines: tuple
    label: str = ""  # parameter-server mode: "server 0", "trainer 1"
    error: Optional[dict] = None  # what its @record wrote to its TORCHELASTIC_ERROR_FILE (launcher.output.error_file)


@dataclass
class Worker:
    spec: WorkerSpec
    proc: Process
    output: sinks.WorkerOutput
    started: float
    returncode: Optional[int] = None
    ended: Optional[float] = None
    reaped: bool = False

    @property
    def alive(self) -> bool:
        return self.returncode is None

    @property
    def pid(self) -> int:
        return self.proc.pid


class WorkerGroup:
    """Uses the launch's starter, clock, cgroup, spares and watchdog; the launch knows nothing of it."""

    def __init__(self, launch: Launch, attempt: int = 0) -> None:
        self.plan = launch.plan
        self.launch = launch
        self.starter = launch.starter
        self.clock = launch.clock
        self.attempt = attempt
        self.workers: dict = {}  # rank -> Worker
        self.outputs: dict = {}  # rank -> output, opened before any worker starts
        self.started_at = self.clock.monotonic()
        self.started_wall = self.clock.time()
        self.cgroup_fd: Optional[int] = None  # the cgroup's procs file, open while workers start
        self.adopted: set = set()  # ranks whose worker was kept from the round before

    @property
    def ranks(self):
        return list(self.workers)

    def names(self) -> dict:
        """rank -> how messages name it, for the processes that are not plain ranks (servers, trainers)."""
        return {s.rank: s.label for s in self.plan.workers if not s.kind.by_rank}

    def trainers(self):
        """Parameter-server mode: the keys of this node's trainers; None in collective mode."""
        return [s.rank for s in self.plan.workers if s.kind.ends_job] if self.plan.parameter_server else None

    def open_logs(self) -> None:
        """Every log file opened (and its header written) before the first worker starts."""
        for spec in self.plan.workers:
            if spec.log_file:
                fd = log_files.open_log(spec.log_file, self.plan.log_dir, spec.label, spec.cmd, self.attempt,
                                        self.plan.elastic_round)
                self.outputs[spec.rank] = routes.worker_output(spec, fd, self.plan.duplicates)

    def start(self) -> None:
        if self.launch.cgroup is not None:
            self.cgroup_fd = self.launch.cgroup.open_procs()
        self.started_at = self.clock.monotonic()
        self.started_wall = self.clock.time()
        for spec in self.plan.workers:
            error_file.remove(spec.env.get(ev.ERROR_FILE))  # an earlier attempt's
            self._spawn(spec)
        log.debug("started %d worker(s)", len(self.workers))

    def env_of(self, spec: WorkerSpec) -> dict:
        return self.launch.worker_env(spec, self.attempt)

    def _spawn(self, spec: WorkerSpec) -> None:
        kept = self.launch.kept.pop(spec.local_rank, None)
        if kept is not None and self._adopt(spec, kept):
            return
        warm = self.launch.warm.take(spec.local_rank) if self.launch.warm is not None else None
        if warm is not None:
            self._wake_warm(spec, warm)
            return
        spare = self.launch.spares.pop(spec.rank)
        if spare is not None and self._wake(spec, spare):
            return
        output, (stdout, stderr) = self._output_of(spec)
        self.launch.progress.started(spec.local_rank, self.clock.monotonic())
        try:
            proc = self.starter.start(spec.cmd, self.env_of(spec), stdout, stderr,
                                      cgroup_fd=self.cgroup_fd, pass_fds=self.launch.progress.fds(spec.local_rank),
                                      cpus=spec.cpus)
        except OSError as e:
            if e.errno in (2, 8, 13, 20):  # ENOENT, ENOEXEC, EACCES, ENOTDIR: the command itself
                raise LaunchError(f"cannot start {spec.label} ({spec.cmd[0]}): {e.strerror}; check the command.") from None
            raise StartFailed(spec, e.strerror or str(e)) from None
        finally:
            self._given(spec, output)
        self._add(spec, proc, output)

    def _output_of(self, spec: WorkerSpec) -> tuple:
        """The worker's output (its log file, opened before, or new pipes) and the descriptors it writes to."""
        try:
            output = self.outputs.get(spec.rank) or routes.worker_output(spec, None)
            return output, output.child_fds()
        except OSError as e:
            raise StartFailed(spec, f"{e.strerror} while making its output pipes") from None

    def _given(self, spec: WorkerSpec, output) -> None:
        """The worker has its descriptors: the launcher's copies closed, the output kept as this round's."""
        output.spawned()
        self.outputs[spec.rank] = output

    def _add(self, spec: WorkerSpec, proc: Process, output, warm: bool = False) -> None:
        self.workers[spec.rank] = Worker(spec, proc, output, self.clock.monotonic())
        self.launch.watchdog.tell(f"pid {proc.pid}")
        self.launch.worker_pids.add(proc.pid)
        self._note_started(spec, proc.pid, warm=warm)

    # ------------------------------------------------------------ workers kept from one round to the next

    def keep(self, ranks, reason: str) -> None:
        """Tell these workers the round is over and keep them running for the next one (``launch.kept``): they
        leave this group (its stop, its exits, its leftovers and its close no longer concern them)."""
        channel = self.launch.worker_channel
        for rank in sorted(ranks):
            w = self.workers.pop(rank, None)
            if w is None:
                continue
            self.outputs.pop(rank, None)
            self.launch.parked.discard(w.pid)
            if channel is not None:
                channel.send(w.pid, {"t": lc.STOP, "reason": reason})
            self.launch.kept[w.spec.local_rank] = w

    def _adopt(self, spec: WorkerSpec, kept: Worker) -> bool:
        """A worker kept from the round before becomes this round's: told its new variables. False (then a
        worker is started afresh) when it ended meanwhile or its channel closed: it is killed and reaped first."""
        channel = self.launch.worker_channel
        returncode = self.starter.exit_status(kept.pid)
        if returncode is not None or channel is None or not channel.can_pass(kept.pid):
            why = policy.describe_exit(returncode) if returncode is not None else "its channel closed or is busy"
            log.warning("%s could not be kept for the next round (%s): starting it afresh", kept.spec.label, why)
            self.drop_kept(kept)
            return False
        # this round's output, as a new worker's: its log file (by its new rank) or pipes (with its new label)
        output, fds = self._output_of(spec)
        self.launch.parked.discard(kept.pid)
        told = channel.send(kept.pid, lc.round_message(self.env_of(spec), len(fds)), fds=fds)
        self._given(spec, output)
        if not told:  # its channel failed just now: this round cannot start as planned here
            self.drop_kept(kept)
            raise StartFailed(spec, "its channel to the launcher failed as it was given the new round")
        kept.output.finish()  # what it wrote in the round before, read to its end
        kept.output = output
        self.workers[spec.rank] = Worker(spec, kept.proc, output, kept.started)
        self.adopted.add(spec.rank)
        self.launch.progress.started(spec.local_rank, self.clock.monotonic(), fresh=False)
        self._note_started(spec, kept.pid, kept=True)
        return True

    def _wake_warm(self, spec: WorkerSpec, warm) -> None:
        """A worker started warm (``--warm_start``) becomes this round's: in the job's cgroup, told its variables and
        given its output."""
        try:
            if self.cgroup_fd is not None:
                os.write(self.cgroup_fd, str(warm.proc.pid).encode())
        except OSError as e:
            raise StartFailed(spec, f"{e.strerror} while waking it") from None
        output, fds = self._output_of(spec)
        progress = self.launch.progress.fds(spec.local_rank)
        self.launch.progress.started(spec.local_rank, self.clock.monotonic())
        failed = warm_module.wake(warm, self.env_of(spec), (*fds, *progress), bool(progress))
        self._given(spec, output)
        self._add(spec, warm.proc, output, warm=True)
        if failed:  # its socket failed just now: this round cannot start as planned here
            raise StartFailed(spec, f"its warm socket failed as it was given its round ({failed})")

    def _note_started(self, spec: WorkerSpec, pid: int, kept: Optional[bool] = None, warm: bool = False) -> None:
        self.launch.events.write("worker_started", rank=spec.rank, local_rank=spec.local_rank, label=spec.label, pid=pid,
                                 attempt=self.attempt, kept=kept, **({"warm": True} if warm else {}))  # --warm_start

    def unparked(self) -> list:
        """The kept workers that have not yet said they left their round."""
        return [w for w in self.launch.kept.values() if w.pid not in self.launch.parked]

    def drop_kept(self, kept: Worker) -> None:
        """A kept worker that cannot go on: its process group killed, its leader reaped, its output closed."""
        if self.launch.worker_channel is not None:
            self.launch.worker_channel.forget(kept.pid)
        self.starter.signal_group(kept.pid, signal.SIGKILL)
        kept.reaped = self.starter.reap(kept.pid, wait=True)
        self.launch.worker_pids.discard(kept.pid)
        kept.output.finish()

    def _wake(self, spec: WorkerSpec, spare: Spare) -> bool:
        """Make a spare this attempt's worker; False if it cannot be (then the worker is spawned)."""
        output = self.outputs.get(spec.rank) or spare.output
        self.launch.progress.started(spec.local_rank, self.clock.monotonic())
        if not spares_module.wake(spare, spec, self.env_of(spec), self.cgroup_fd):
            return False
        if output is not spare.output and spare.output is not None:
            spare.output.finish()
        self._given(spec, output)
        self._add(spec, spare.proc, output)
        return True

    # ------------------------------------------------------------ learning of exits

    def exits(self) -> list:
        """Workers that ended since the last call, as policy events. Not reaped: see the module doc."""
        events = []
        for w in self.workers.values():
            if not w.alive:
                continue
            returncode = self.starter.exit_status(w.pid)
            if returncode is not None:
                w.returncode = returncode
                w.ended = self.clock.monotonic()
                log.debug("rank %d: %s", w.spec.rank, policy.describe_exit(w.returncode))
                events.append(policy.WorkerExited(w.spec.rank, w.returncode))
        return events

    # ------------------------------------------------------------ signals

    def job(self) -> processes.Job:
        watchdog = self.launch.watchdog.pid
        return processes.Job(
            run_id=self.launch.run_id,
            groups=frozenset(w.pid for w in self.workers.values() if not w.reaped),
            cgroup=self.launch.cgroup,
            exclude=frozenset({os.getpid()} | ({watchdog} if watchdog is not None else set())
                              | self.launch.spares.pids() | self._kept_processes()),
        )

    def _kept_processes(self) -> set:
        """The workers kept for the next round and every process under them: none is a leftover of this round."""
        pids = {w.pid for w in self.launch.kept.values()}
        if pids:
            import psutil

            for pid in list(pids):
                with suppress(psutil.Error):
                    pids |= {child.pid for child in psutil.Process(pid).children(recursive=True)}
        return pids

    def leftovers(self) -> list:
        """Pinned processes of the job other than the workers themselves. The caller closes them."""
        found = processes.members(self.job(), self._candidates())
        leaders = {w.pid for w in self.workers.values()}
        processes.close_all(p for p in found if p.pid in leaders)
        return [p for p in found if p.pid not in leaders]

    def _candidates(self):
        """Where the job's processes may be: the cgroup's list (the kernel keeps it; nothing
        escapes it), else every descendant of the launcher (orphans come back to it)."""
        if self.launch.cgroup is not None:
            return self.launch.cgroup.pids()
        return self.starter.descendants()

    def send(self, sig: int, leftovers: bool = True) -> None:
        for w in self.workers.values():
            if not w.reaped:
                self.starter.signal_group(w.pid, sig)  # safe: the leader is not reaped, so the group id is still its
        if leftovers:
            found = self.leftovers()
            processes.signal_members(found, sig)
            processes.close_all(found)

    def kill(self) -> None:
        if self.launch.cgroup is not None:
            self.launch.cgroup.kill()
        self.send(signal.SIGKILL)

    def running_pids(self) -> list:
        found = self.leftovers()
        pids = [p.pid for p in found]
        processes.close_all(found)
        return sorted(pids + [w.pid for w in self.workers.values() if w.alive])

    def anything_runs(self) -> bool:
        return any(w.alive for w in self.workers.values()) or bool(self.running_pids())

    # ------------------------------------------------------------ output

    def follow_logs(self) -> bool:
        return any([w.output.follow() for w in self.workers.values()])

    def follows(self) -> bool:
        return any(w.output.follows and w.alive for w in self.workers.values())

    def last_output(self) -> float:
        """When (time.time()) a worker last wrote a line, or the group started if none has."""
        latest = [w.output.last_written() for w in self.workers.values()]
        return max([t for t in latest if t is not None], default=self.started_wall)

    def snapshot(self) -> tuple:
        """Every process of this attempt as the state file shows it."""
        return tuple(self._process_state(spec, self.workers.get(spec.rank)) for spec in self.plan.workers)

    def _process_state(self, spec: WorkerSpec, worker: Optional[Worker]) -> state_file.ProcessState:
        log_name = os.path.basename(spec.log_file) if spec.log_file else None
        cpus = spec.cpu_list
        if worker is None:  # not started (a start that failed)
            return state_file.ProcessState(spec.label, spec.rank, None, log_name, None, cpus=cpus)
        ended = None if worker.ended is None else self._wall(worker.ended)
        return state_file.ProcessState(spec.label, spec.rank, worker.pid, log_name, self._wall(worker.started), ended,
                                       worker.returncode, cpus)

    def _wall(self, monotonic: float) -> float:
        """A clock.monotonic() of the past as a clock.time()."""
        return self.clock.time() - (self.clock.monotonic() - monotonic)

    def failure(self, rank: int) -> Failure:
        w = self.workers[rank]
        w.output.catch_up()
        return Failure(w.spec.rank, w.spec.local_rank, w.pid, w.returncode,
                       (w.ended or self.clock.monotonic()) - w.started,
                       w.spec.log_file, tuple(w.output.last_lines()), "" if w.spec.kind.by_rank else w.spec.label,
                       error_file.read(w.spec.env.get(ev.ERROR_FILE)))

    # ------------------------------------------------------------ close

    def close(self) -> None:
        """Always runs, after whatever still lived was stopped (``launcher.run.stop``): the leaders
        are reaped, which lets their group ids go."""
        for w in self.workers.values():
            w.output.finish()
            if not w.reaped:
                w.reaped = self.starter.reap(w.pid, wait=not w.alive)
            if w.reaped:
                self.launch.worker_pids.discard(w.pid)
            w.proc.returncode = w.returncode  # Popen must not wait for it again
        for rank, output in self.outputs.items():
            if rank not in self.workers:  # opened, but its worker never started
                output.finish()
        if self.cgroup_fd is not None:
            os.close(self.cgroup_fd)
            self.cgroup_fd = None
