"""Every side effect of running a job: spawn the workers, watch them, pass signals on, stop them.

Three parts:

- ``Launch``, once per launch: signal handling through the wakeup pipe, the selector, the
  watchdog, the job's cgroup, files written for the workers, the reserved master port.
- ``WorkerGroup``: the workers of one run of the plan. It starts them, learns of their exits,
  signals and kills them, and finds what they left running.
- ``supervise``: the event loop. What an event means is decided by ``launcher.plan.policy`` (pure);
  this loop only turns happenings into events and carries out the actions.

One selector. SIGCHLD and every other signal arrive through the wakeup pipe, so an exit is known
as it happens (no polling). Nothing wakes on a timer except the console echo of a log file while
it has something to follow, and the deadlines of a stop.

Never touching what is not ours: a worker is its own process group leader, and the launcher does
not reap a worker until it forgets the worker's group, so the group's id cannot be given to anyone
else while the launcher may still signal it. Every other process of the job (leftovers) is pinned
through a pidfd and checked before it is signalled (``launcher.run.processes``). Orphans that come
back to the launcher (it is their child subreaper) are reaped as they end.
"""

from __future__ import annotations

import ctypes
import json
import os
import resource
import selectors
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from typing import Optional

from launcher import envvars as ev
from launcher.nodes import job as job_module
from launcher.output import error_file
from launcher.output import logs
from launcher.output import routes
from launcher.plan import policy
from launcher.run import processes
from launcher.run import spare as spare_module
from launcher.output import state_file
from launcher.errors import LaunchError
from launcher.output.logs import log
from launcher.plan.collective import Plan, WorkerSpec

STOPPING_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT)
# Ignored when the launcher starts (nohup, a shell's background job): left ignored, as every program
# does, so the workers inherit that too. SIGTERM, a scheduler's way to stop a job, is always handled.
KEPT_IGNORED = (signal.SIGINT, signal.SIGHUP, signal.SIGQUIT)
PASSED_ON_SIGNALS = (signal.SIGUSR1, signal.SIGUSR2)
HANDLED_SIGNALS = STOPPING_SIGNALS + PASSED_ON_SIGNALS + (signal.SIGCHLD,)
DRAIN_SECONDS = 5.0  # how long output may still come after every process is gone
HELPERS_SECONDS = 2.0  # how long Python's multiprocessing helpers (resource_tracker) get to end by themselves
STACK_TIMEOUT = 10.0  # how long taking the workers' stacks may hold up a stop
WATCHDOG_QUIT_WAIT = 2.0
STATE_INTERVAL = 0.2  # the state file is rewritten at most this often while a stop ends workers
FD_MARGIN = 32  # descriptors a launch needs besides its workers'
PR_SET_PDEATHSIG = 1
PR_SET_CHILD_SUBREAPER = 36
PR_SET_PTRACER = 0x59616D61
_libc = ctypes.CDLL(None, use_errno=True)


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
    proc: subprocess.Popen
    output: object  # logs.FileOutput or logs.PipeOutput
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


def exit_code(returncode: int) -> int:
    return policy.shell_code(returncode)


def run(plan: Plan, reserved: tuple = ()) -> int:
    """Start the plan's workers, supervise them to the end (and again after a failure, up to
    ``plan.max_restarts`` times), and return the launcher's exit code.

    ``reserved``: sockets holding ports for the workers (rank 0's store), kept until the end.
    """
    launch = Launch(plan, reserved)
    job = None
    try:
        launch.open()
        job = job_module.for_plan(plan)
        launch.job_label = job.node_label()
        launch.start_watchdog()
        while True:
            started = _run_attempt(launch, job)
            what, code = job.finish_attempt(_Loop(launch, job).turn)
            if what == "end":
                launch.record("ended", code)
                _tell_the_end(job, code, started)
                return code
            launch.record("restarting")
    finally:
        if job is not None:
            job.close()
        launch.close()


def _run_attempt(launch: Launch, job) -> tuple:
    """One attempt of the job on this node; (when it started, how many workers)."""
    group = WorkerGroup(launch.plan, launch, job.attempt)
    try:
        group.open_logs()
        try:
            group.start()
            launch.record_group(group)
            if job.attempt < launch.plan.max_restarts:
                launch.make_spares(group)
        except StartFailed as e:
            supervise(launch, group, job, start_failure=e)
        else:
            supervise(launch, group, job)
        return group.started_at, len(group.workers)
    finally:
        group.close()


def _tell_the_end(job, code: int, started: tuple) -> None:
    """Every node shows the same root cause: the one node 0 decided on."""
    cause = job.final_cause()
    if cause is None:
        if code == 0:
            what = "process(es)" if job.plan.parameter_server else "worker(s)"
            log.info("all %d %s finished in %.1f s", started[1], what, time.monotonic() - started[0])
        return
    if job.plan.error_file:
        _write_root_cause(job.plan.error_file, cause, code)
    lines = []
    if job.node_label():
        lines.append(f"launcher: the job stopped: {cause.text}; exit code {code}")
    if cause.summary:
        lines.append(cause.summary)
    if lines:
        logs.console.write(2, ("\n".join(lines) + "\n").encode(errors="replace"))


def _write_root_cause(path: str, cause: policy.Cause, code: int) -> None:
    """For whoever gave the launcher TORCHELASTIC_ERROR_FILE (a scheduler, as to torchrun): the failing
    worker's own @record, else the cause in the same format."""
    data = error_file.loads(cause.error) or error_file.of_cause(cause.text, cause.summary, code, time.time())
    problem = error_file.write(path, error_file.for_parent(data, code))
    if problem:
        log.warning("could not write the root cause to %s=%s (%s)", ev.ERROR_FILE, path, problem)


# ---------------------------------------------------------------- once per launch


class Launch:
    def __init__(self, plan: Plan, reserved: tuple = ()) -> None:
        self.plan = plan
        self.reserved = list(reserved)
        self.selector = selectors.DefaultSelector()
        self.cgroup: Optional[processes.JobCgroup] = None
        self.watchdog: Optional[subprocess.Popen] = None
        self.watchdog_lost = False
        self.watchdog_done = False  # told to quit: its exit is expected
        self.job_label = ""  # "node N (ip)" in a job of several nodes
        self.spares: dict = {}  # rank -> Spare: interpreters started ahead for the next attempt
        self._wake_r, self._wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        self._old_handlers: dict = {}
        self._files_written: list = []
        self._folders_made: list = []
        self.state = state_file.Writer(state_file.path_for(plan.log_dir, plan.node_rank)) if plan.log_dir else None
        self.started_wall = time.time()
        self._processes: tuple = ()  # the last attempt's, as the state file shows them
        self._attempt = 0
        self._phase = ""
        self._recorded = 0.0  # when the state file was last written (time.monotonic())
        self._me = (state_file.this_host(), os.getpid(), state_file.process_start(os.getpid())) if self.state else None

    def open(self) -> None:
        """Everything a launch needs before its first worker, checked and set up."""
        self._install_signal_handlers()
        check_limits(len(self.plan.workers), bool(self.plan.log_dir))
        _libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
        if self.plan.log_dir:
            logs.make_log_dir(self.plan.log_dir)
        self._write_files()
        self._make_error_folders()
        self.cgroup = processes.JobCgroup.create(self.run_id, self.plan.base_env)
        log.debug("job cgroup: %s", self.cgroup.path if self.cgroup else "none (sweep by process group and run id)")

    @property
    def run_id(self) -> str:
        return self.plan.workers[0].env[ev.RUN_ID]

    def _install_signal_handlers(self) -> None:
        signal.set_wakeup_fd(self._wake_w, warn_on_full_buffer=False)
        self.selector.register(self._wake_r, selectors.EVENT_READ, ("signal", None))
        for sig in HANDLED_SIGNALS:
            if sig in KEPT_IGNORED and signal.getsignal(sig) == signal.SIG_IGN:
                log.debug("%s was ignored when the launcher started: it stays ignored, for the workers too", sig.name)
                continue
            self._old_handlers[sig] = signal.signal(sig, _note_signal)

    def _write_files(self) -> None:
        for path, text in self.plan.files.items():
            try:
                os.makedirs(os.path.dirname(path), exist_ok=True)
                with open(path, "w") as f:
                    f.write(text)
            except OSError as e:
                raise LaunchError(f"cannot write {path} ({e.strerror}); set TMPDIR to a writable folder.") from None
            self._files_written.append(path)

    def _make_error_folders(self) -> None:
        """Where each worker's @record writes (its TORCHELASTIC_ERROR_FILE); removed at the end."""
        for folder in sorted({os.path.dirname(path) for path in _error_files(self.plan.workers)}):
            try:
                os.makedirs(folder, exist_ok=True)
            except OSError as e:
                raise LaunchError(f"cannot make {folder} ({e.strerror}); set TMPDIR to a writable folder.") from None
            self._folders_made.append(folder)

    def _remove_error_files(self) -> None:
        for path in _error_files(self.plan.workers):
            error_file.remove(path)
        for folder in self._folders_made:
            try:
                os.rmdir(folder)
            except OSError:
                log.debug("could not remove %s", folder)

    def signals(self) -> list:
        """Every signal received since the last call, in order (none is dropped)."""
        received = []
        while True:
            try:
                data = os.read(self._wake_r, 4096)
            except BlockingIOError:
                return received
            if not data:
                return received
            received += [signal.Signals(n) for n in data]

    # ------------------------------------------------------------ watchdog

    def start_watchdog(self) -> None:
        self.watchdog = _start_watchdog(self.run_id, self.plan.shutdown_timeout)
        if self.cgroup is not None:
            self.tell_watchdog(f"cgroup {self.cgroup.path}")

    def tell_watchdog(self, line: str) -> None:
        if self.watchdog is None or self.watchdog_lost:
            return
        try:
            self.watchdog.stdin.write(f"{line}\n".encode())
            self.watchdog.stdin.flush()
        except (OSError, ValueError):
            self._check_watchdog()

    def _check_watchdog(self) -> None:
        """Once the watchdog is gone, say so once and go on: the job is not its to lose."""
        if self.watchdog is None or self.watchdog_lost or self.watchdog_done:
            return
        try:
            info = os.waitid(os.P_PID, self.watchdog.pid, os.WEXITED | os.WNOHANG)
        except ChildProcessError:
            info = True
        if info is None:
            return
        self.watchdog_lost = True
        self.watchdog.returncode = 0
        log.warning("the watchdog (pid %d) died: protection against kill -9 of the launcher is gone; "
                    "the job goes on", self.watchdog.pid)

    def stop_watchdog(self) -> None:
        if self.watchdog is None:
            return
        if not self.watchdog_lost:
            self.tell_watchdog("quit")
        self.watchdog_done = True
        try:
            self.watchdog.stdin.close()
        except OSError:
            pass
        try:
            self.watchdog.wait(WATCHDOG_QUIT_WAIT)
        except subprocess.TimeoutExpired:
            self.watchdog.kill()
            self.watchdog.wait()
        except ChildProcessError:
            pass

    # ------------------------------------------------------------ spares for a restart

    def make_spares(self, group: "WorkerGroup") -> None:
        """With restarts left, start each Python worker of the next attempt up to the end of its
        interpreter's start-up (``launcher.run.spare``), so that a restart does not wait for that."""
        for spec in self.plan.workers:
            if spec.rank in self.spares or not spare_module.can_wait(spec.cmd):
                continue
            if spec.route is not None and not spec.route.one_place:
                continue  # its streams go to different places: the restart starts it afresh
            try:
                env = worker_env(self.plan, spec, group.attempt + 1)
                self.spares[spec.rank] = _start_spare(spec, env)
            except OSError as e:
                log.debug("no spare interpreter for rank %d: %s", spec.rank, e)
                return

    def spare_pids(self) -> set:
        return {s.proc.pid for s in self.spares.values()}

    def drop_spares(self) -> None:
        for spare in self.spares.values():
            spare.close()
        self.spares.clear()

    # ------------------------------------------------------------ children

    def reap_orphans(self, keep) -> None:
        """Collect every child that ended, except the workers (``keep``) and the watchdog."""
        keep = set(keep) | ({self.watchdog.pid} if self.watchdog else set())
        for pid in _children():
            if pid not in keep:
                try:
                    os.waitpid(pid, os.WNOHANG)
                except ChildProcessError:
                    pass
        self._check_watchdog()

    # ------------------------------------------------------------ the state file (launcher status)

    def record_group(self, group: "WorkerGroup") -> None:
        """The state file shows ``group``'s processes as they are now (started, exited)."""
        if self.state is not None:
            self._processes = group.snapshot()
            self.record("running", attempt=group.attempt)

    def record(self, phase: str, exit_code: Optional[int] = None, attempt: Optional[int] = None) -> None:
        """Rewrite the state file (--log_dir only): "running", "restarting" or "ended"; never fails."""
        if self.state is None:
            return
        self._attempt = self._attempt if attempt is None else attempt
        self._phase = phase
        self._recorded = time.monotonic()
        plan = self.plan
        host, pid, start = self._me
        self.state.write(state_file.NodeState(
            node=plan.node_rank, node_ip=plan.node_ip, nodes=len(plan.node_ips), host=host,
            run_id=self.run_id, launcher_pid=pid, launcher_start=start,
            attempt=self._attempt, max_restarts=plan.max_restarts, phase=phase, exit_code=exit_code,
            started=self.started_wall, updated=time.time(), processes=self._processes))

    def record_due(self) -> bool:
        return time.monotonic() - self._recorded >= STATE_INTERVAL

    def close(self) -> None:
        if self.state is not None and self.state.written and self._phase != "ended":
            self.record("ended")  # ended by an error: the launcher says which on its console
        self.drop_spares()
        self.stop_watchdog()
        self.reap_orphans(keep=())
        if self.cgroup is not None and not self.cgroup.remove():
            log.debug("could not remove %s", self.cgroup.path)
        for sig, handler in self._old_handlers.items():
            signal.signal(sig, handler)
        if self._old_handlers:
            signal.set_wakeup_fd(-1)
        for path in self._files_written:
            _remove(path)
        self._remove_error_files()
        for s in self.reserved:
            s.close()
        self.selector.close()
        os.close(self._wake_r)
        os.close(self._wake_w)


# ---------------------------------------------------------------- the workers of one run


class WorkerGroup:
    def __init__(self, plan: Plan, launch: Launch, attempt: int = 0) -> None:
        self.plan = plan
        self.launch = launch
        self.attempt = attempt
        self.workers: dict = {}  # rank -> Worker
        self.outputs: dict = {}  # rank -> output, opened before any worker starts
        self.started_at = time.monotonic()
        self.started_wall = time.time()
        self._cgroup_fd: Optional[int] = None

    @property
    def ranks(self):
        return list(self.workers)

    def names(self) -> dict:
        """rank -> how messages name it, for the processes that are not plain ranks (servers, trainers)."""
        return {s.rank: s.label for s in self.plan.workers if s.role}

    def trainers(self):
        """Parameter-server mode: the keys of this node's trainers; None in collective mode."""
        return [s.rank for s in self.plan.workers if s.role == "trainer"] if self.plan.parameter_server else None

    def open_logs(self) -> None:
        """Every log file opened (and its header written) before the first worker starts."""
        for spec in self.plan.workers:
            if spec.log_file:
                fd = logs.open_log(spec.log_file, self.plan.log_dir, spec.label, spec.cmd, self.attempt)
                self.outputs[spec.rank] = routes.worker_output(spec, fd)

    def start(self) -> None:
        if self.launch.cgroup is not None:
            self._cgroup_fd = self.launch.cgroup.open_procs()
        self.started_at = time.monotonic()
        self.started_wall = time.time()
        for spec in self.plan.workers:
            error_file.remove(spec.env.get(ev.ERROR_FILE))  # an earlier attempt's
            self._spawn(spec)
        log.debug("started %d worker(s)", len(self.workers))

    def _spawn(self, spec: WorkerSpec) -> None:
        spare = self.launch.spares.pop(spec.rank, None)
        if spare is not None and self._wake(spec, spare):
            return
        try:
            output = self.outputs.get(spec.rank) or routes.worker_output(spec, None)
            stdout, stderr = output.child_fds()
        except OSError as e:
            raise StartFailed(spec, f"{e.strerror} while making its output pipes") from None
        self.outputs[spec.rank] = output
        try:
            proc = subprocess.Popen(
                spec.cmd,
                env=worker_env(self.plan, spec, self.attempt),
                stdin=subprocess.DEVNULL,
                stdout=stdout,
                stderr=stderr,
                start_new_session=True,
                preexec_fn=_child_setup(os.getpid(), self._cgroup_fd),
            )
        except OSError as e:
            if e.errno in (2, 8, 13, 20):  # ENOENT, ENOEXEC, EACCES, ENOTDIR: the command itself
                raise LaunchError(f"cannot start {spec.label} ({spec.cmd[0]}): {e.strerror}; check the command.") from None
            raise StartFailed(spec, e.strerror or str(e)) from None
        finally:
            output.spawned()
        self._add(spec, proc, output)

    def _add(self, spec: WorkerSpec, proc: subprocess.Popen, output) -> None:
        worker = Worker(spec, proc, output, time.monotonic())
        self.workers[spec.rank] = worker
        for fd in output.pipes():
            self.launch.selector.register(fd, selectors.EVENT_READ, ("pipe", worker))
        self.launch.tell_watchdog(f"pid {proc.pid}")

    def _wake(self, spec: WorkerSpec, spare: Spare) -> bool:
        """Make a spare this attempt's worker; False if it cannot be (then the worker is spawned).
        It enters the job's cgroup first (it waited outside, where a stop's cgroup.kill does not
        reach), so that nothing the worker starts can be outside."""
        output = self.outputs.get(spec.rank) or spare.output
        env = worker_env(self.plan, spec, self.attempt)
        try:
            if env != spare.env:  # left over from an attempt that did not start it
                raise OSError("it was started for another attempt")
            if spare.log_id is not None and spare.log_id != _file_id(os.stat(spec.log_file)):
                raise OSError("its log file was replaced since")
            if self._cgroup_fd is not None:
                os.write(self._cgroup_fd, str(spare.proc.pid).encode())
            _write_all(spare.go, spare_module.message(env))
        except OSError as e:
            log.debug("spare for rank %d not used (%s); starting the worker afresh", spec.rank, e)
            spare.close()
            spare.proc.kill()
            if spare.output is not None:  # its pipes: the fresh worker gets its own
                spare.output.finish()
            return False
        spare.close()
        if output is not spare.output and spare.output is not None:
            spare.output.finish()
        output.spawned()
        self.outputs[spec.rank] = output
        self._add(spec, spare.proc, output)
        return True

    # ------------------------------------------------------------ learning of exits

    def exits(self) -> list:
        """Workers that ended since the last call, as policy events. Not reaped: see the module doc."""
        events = []
        for w in self.workers.values():
            if not w.alive:
                continue
            info = os.waitid(os.P_PID, w.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
            if info is not None:
                w.returncode = info.si_status if info.si_code == os.CLD_EXITED else -info.si_status
                w.ended = time.monotonic()
                log.debug("rank %d: %s", w.spec.rank, logs.describe_exit(w.returncode))
                events.append(policy.WorkerExited(w.spec.rank, w.returncode))
        return events

    # ------------------------------------------------------------ signals

    def job(self) -> processes.Job:
        return processes.Job(
            run_id=self.launch.run_id,
            groups=frozenset(w.pid for w in self.workers.values() if not w.reaped),
            cgroup=self.launch.cgroup,
            exclude=frozenset({os.getpid()} | ({self.launch.watchdog.pid} if self.launch.watchdog else set())
                              | self.launch.spare_pids()),
        )

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
        return _descendants()

    def send(self, sig: int, leftovers: bool = True) -> None:
        for w in self.workers.values():
            if not w.reaped:
                _killpg(w.pid, sig)  # safe: the leader is not reaped, so the group id is still its
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
        return tuple(_process_state(spec, self.workers.get(spec.rank)) for spec in self.plan.workers)

    def failure(self, rank: int) -> Failure:
        w = self.workers[rank]
        return Failure(w.spec.rank, w.spec.local_rank, w.pid, w.returncode, (w.ended or time.monotonic()) - w.started,
                       w.spec.log_file, tuple(w.output.last_lines()), w.spec.role and w.spec.label,
                       error_file.read(w.spec.env.get(ev.ERROR_FILE)))

    # ------------------------------------------------------------ close

    def close(self) -> None:
        """Always runs. Whatever still lives (after an internal error) is stopped, bounded;
        then the leaders are reaped, which lets their group ids go."""
        if any(w.alive for w in self.workers.values()) or self.running_pids():
            emergency_stop(self, self.plan.shutdown_timeout)
        for w in self.workers.values():
            w.output.finish()
            if not w.reaped:
                w.reaped = _reap(w.pid, wait=not w.alive)
            w.proc.returncode = w.returncode  # Popen must not wait for it again
        for rank, output in self.outputs.items():
            if rank not in self.workers:  # opened, but its worker never started
                output.finish()
        for w in self.workers.values():
            for fd in w.output.pipes():
                if fd in self.launch.selector.get_map():
                    self.launch.selector.unregister(fd)
        if self._cgroup_fd is not None:
            os.close(self._cgroup_fd)
            self._cgroup_fd = None


# ---------------------------------------------------------------- the event loop


def supervise(launch: Launch, group: WorkerGroup, job, start_failure: Optional[StartFailed] = None) -> policy.State:
    """One attempt on this node, to the end of its last process; the policy's final state."""
    state = policy.start(group.ranks, launch.plan.shutdown_timeout, stacks=launch.plan.dump_stacks,
                         names=group.names(), trainers=group.trainers())
    loop = _Loop(launch, job, group)
    if start_failure is not None:
        event = policy.StartFailed(start_failure.rank, str(start_failure))
        state = _step(state, event, loop)
    trainers_told = False
    while True:
        events = loop.turn(state)
        for event in events + [policy.TimePassed()]:
            state = _step(state, event, loop)
        if any(isinstance(e, policy.WorkerExited) for e in events) and _record_now(state, launch):
            launch.record_group(group)
        if state.trainers_done and not state.stopping and not trainers_told:
            trainers_told = True
            for event in job.trainers_done():
                state = _step(state, event, loop)
        if policy.gave_up(state, time.monotonic()):
            log.warning("process(es) %s did not end after SIGKILL (uninterruptible sleep?); giving up on them",
                        ",".join(map(str, group.running_pids())) or "?")
            break
        if not state.running:  # the workers are done: what they left, and their last output
            found = group.leftovers()
            processes.close_all(found)
            helpers = all(processes.is_self_ending(p.pid) for p in found)
            if found and not (helpers and loop.helpers_may_end()):
                state = _step(state, policy.LeftoversRunning(len(found), helpers), loop)
            elif not found and loop.drained():
                break
    return state


def _record_now(state: policy.State, launch: Launch) -> bool:
    """After an exit: at once, except during a stop, when many end together (then at most every
    STATE_INTERVAL, and at the last one)."""
    return not state.stopping or not state.running or launch.record_due()


def _step(state: policy.State, event, loop: "_Loop") -> policy.State:
    """Decide, carry out, and tell the job when this node found a cause to stop."""
    if isinstance(event, policy.StopSignal) and (state.stopping or not state.running):
        loop.abandon()  # a stop signal on top of a stop: the console is not waited for either
    after, actions = policy.decide(state, event, time.monotonic())
    _carry_out(loop.group, actions)
    cause = _new_cause(state, after, loop)
    if cause is not None and cause.kind == "worker" and state.failure is not None:
        loop.job.revise_cause(cause)  # a server's failure came first (policy.SERVER_FIRST)
    elif cause is not None:
        loop.job.local_cause(cause)
    return after


def _new_cause(before: policy.State, after: policy.State, loop: "_Loop") -> Optional[policy.Cause]:
    job, group = loop.job, loop.group
    node, label = job.plan.node_rank, job.node_label()
    on = f" on {label}" if label else ""
    if after.failure is not None and after.failure != before.failure:
        rank, returncode = after.failure
        failure = group.failure(rank)
        text = f"{after.name(rank)}{on} failed ({logs.describe_exit(returncode)})"
        error = json.dumps(error_file.bounded(failure.error)) if failure.error else ""
        return policy.Cause(node, "worker", policy.shell_code(returncode), text, logs.format_failure(failure), error)
    if after.stop_signal is not None and before.stop_signal is None and after.failure is None:
        return job_module.signal_cause(job, after.stop_signal)
    if after.start_failure is not None and before.start_failure is None:
        return policy.Cause(node, "start", 1, f"{after.start_failure}{on}")
    if after.hung is not None and before.hung is None:
        return policy.Cause(node, "hang", 1, f"no worker{on} wrote a line for {after.hung:g} s (--hang_timeout)")
    return None


class _Loop:
    """One turn of the event loop: the wakeup pipe, pipes, the console, the control channel,
    deadlines. Without a worker group, it serves the time between two attempts."""

    def __init__(self, launch: Launch, job, group: Optional[WorkerGroup] = None) -> None:
        self.launch = launch
        self.job = job
        self.group = group
        self.selector = launch.selector
        self.follow_delay = 0.02
        self.quiet_since: Optional[float] = None  # when the last process of the job was gone
        self.helpers_since: Optional[float] = None  # when only multiprocessing helpers were left
        self.abandoned = False
        workers = group.workers.values() if group else ()
        self.pipes_open = {fd: w for w in workers for fd in w.output.pipes()}

    def turn(self, state: Optional[policy.State] = None) -> list:
        self._sync_registrations()
        events = []
        for key, mask in self.selector.select(self._timeout(state)):
            kind, obj = key.data
            if kind == "pipe" and not obj.output.read_pipe(key.fd):
                self.selector.unregister(key.fd)
                del self.pipes_open[key.fd]
            elif kind == "console":
                obj.push()
            elif kind == "control":
                events += self.job.on_events(obj.ready(key.fd, mask, time.monotonic()))
        if self.group is not None:
            moved = self.group.follow_logs()
            self.follow_delay = 0.02 if moved else min(self.follow_delay * 2, 0.25)
        if self.job.channel is not None:
            events += self.job.tick(time.monotonic())
        return self._signal_events() + events + self._hang_events(state)

    def _signal_events(self) -> list:
        events = []
        for sig in self.launch.signals():
            if sig == signal.SIGCHLD:
                continue
            if sig in PASSED_ON_SIGNALS:
                events.append(policy.UserSignal(sig))
            else:
                events.append(policy.StopSignal(sig))
        workers = []
        if self.group is not None:
            # exits are looked for on every turn: cheap, and no SIGCHLD can be missed
            events[:0] = self.group.exits()
            workers = [w.pid for w in self.group.workers.values()]
        self.launch.reap_orphans(keep=workers)
        return events

    def _hang_events(self, state) -> list:
        limit = self.launch.plan.hang_timeout
        if limit is None or self.group is None or state is None or state.stopping or not state.running:
            return []
        quiet = time.time() - self.group.last_output()
        return [policy.Hung(limit)] if quiet >= limit else []

    def _timeout(self, state) -> Optional[float]:
        now = time.monotonic()
        waits = []
        deadline = policy.next_deadline(state) if state is not None else None
        if deadline is not None:
            waits.append(max(0.0, deadline - now))
        if self.group is not None and self.group.follows():
            waits.append(self.follow_delay)
        if state is not None and not state.running:
            waits.append(0.05)  # leftovers and the drain: looked at while they last
        if self.job.channel is not None:
            t = self.job.channel.next_deadline()
            if t is not None:
                waits.append(max(0.0, t - now))
        if self.launch.plan.hang_timeout is not None and self.group is not None:
            waits.append(max(0.05, self.launch.plan.hang_timeout / 4))
        return min(waits) if waits else None

    def _sync_registrations(self) -> None:
        for fd, worker in self.pipes_open.items():
            self._register(fd, selectors.EVENT_READ, ("pipe", worker), worker.output.wants(fd))
        wanted = {}
        for fd, stream in logs.console.waiting().items():
            wanted[fd] = (selectors.EVENT_WRITE, ("console", stream))
        if self.job.channel is not None:
            for fd, events in self.job.channel.registrations().items():
                wanted[fd] = (events, ("control", self.job.channel))
        for key in list(self.selector.get_map().values()):
            if key.data[0] in ("console", "control") and key.fd not in wanted:
                self.selector.unregister(key.fd)
        for fd, (events, data) in wanted.items():
            key = self.selector.get_map().get(fd)
            if key is not None and (key.events != events or key.data is not data):
                try:
                    self.selector.modify(fd, events, data)
                    continue
                except (OSError, KeyError, ValueError):  # the number was closed and taken again
                    self.selector.unregister(fd)
                    key = None
            if key is None:
                self.selector.register(fd, events, data)

    def _register(self, fd, events, data, wanted: bool) -> None:
        known = fd in self.selector.get_map()
        if wanted and not known:
            self.selector.register(fd, events, data)
        elif known and not wanted:
            self.selector.unregister(fd)

    def abandon(self) -> None:
        self.abandoned = True
        logs.console.abandon()

    def helpers_may_end(self) -> bool:
        """Whether Python's multiprocessing helpers left by the workers still have time to end by themselves."""
        now = time.monotonic()
        if self.helpers_since is None:
            self.helpers_since = now
        return now - self.helpers_since < HELPERS_SECONDS

    def drained(self) -> bool:
        """All output read, or the drain time over (a process outside the job may hold a pipe),
        or the user asked twice to stop."""
        if not self.pipes_open or self.abandoned:
            return True
        now = time.monotonic()
        if self.quiet_since is None:
            self.quiet_since = now
        if now - self.quiet_since < DRAIN_SECONDS:
            return False
        log.debug("pipes still open after %.0f s: not waiting for them", DRAIN_SECONDS)
        return True


def _carry_out(group: WorkerGroup, actions) -> None:
    for action in actions:
        if isinstance(action, policy.Say):
            log.log(action.level, "%s", action.text)
        elif isinstance(action, policy.TakeStacks):
            dumps = _ask_flight_recorders(group)
            _show_stacks(group)
            _report_flight_records(dumps)
        elif isinstance(action, policy.Send):
            group.send(action.sig, action.leftovers)
        elif isinstance(action, policy.Kill):
            group.kill()


def _ask_flight_recorders(group: WorkerGroup) -> dict:
    """Ask each surviving worker's NCCL flight recorder for a dump; {rank: the file it will write}."""
    from launcher.run import flight

    alive = [w.spec for w in group.workers.values() if w.alive]
    base = group.plan.base_env
    return {rank: path for spec in alive for rank, path in flight.request([spec.rank], {**base, **spec.env}).items()}


def _report_flight_records(dumps: dict) -> None:
    from launcher.run import flight

    if dumps:
        written = flight.wait(dumps)
        for rank in sorted(dumps):
            log.info("rank %d: NCCL flight recorder %s", rank,
                     f"dump: {written[rank]}" if rank in written else f"wrote no dump within {flight.WAIT_SECONDS:g} s")


def _show_stacks(group: WorkerGroup) -> None:
    """Where each surviving worker was, before it is stopped (py-spy; a note where it cannot)."""
    try:
        from launcher.run import stacks
    except ImportError:
        return
    alive = {w.spec.rank: w.pid for w in group.workers.values() if w.alive}
    if not alive:
        return
    found = stacks.take(alive, timeout=STACK_TIMEOUT)
    label = group.launch.job_label or "this node"
    names = group.names()
    logs.console.write(2, (logs.format_stacks(found, label, names) + "\n").encode(errors="replace"))
    if group.plan.log_dir:
        path = os.path.join(group.plan.log_dir, "stacks.txt")
        logs.write_stacks(path, found, f"stacks of {label}, attempt {group.attempt + 1}", names)
        log.info("full stacks: %s", path)
    else:
        logs.console.write(2, logs.format_dumps(found, f"stacks of {label}", names).encode(errors="replace"))


def emergency_stop(group: WorkerGroup, grace: float) -> None:
    """After an internal error, when the loop cannot be trusted: SIGTERM, grace, SIGKILL, bounded.
    A stop signal arriving meanwhile kills at once."""
    group.send(signal.SIGTERM)
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline and group.running_pids():
        group.exits()
        if any(s in STOPPING_SIGNALS for s in group.launch.signals()):
            break
        time.sleep(0.02)
    group.kill()
    deadline = time.monotonic() + policy.KILL_WAIT
    while time.monotonic() < deadline:
        group.exits()
        if not any(w.alive for w in group.workers.values()):
            break
        time.sleep(0.02)


def _process_state(spec: WorkerSpec, worker: Optional[Worker]) -> state_file.ProcessState:
    log_name = os.path.basename(spec.log_file) if spec.log_file else None
    if worker is None:  # not started (a start that failed)
        return state_file.ProcessState(spec.label, spec.rank, None, log_name, None)
    ended = None if worker.ended is None else _wall(worker.ended)
    return state_file.ProcessState(spec.label, spec.rank, worker.pid, log_name, _wall(worker.started), ended,
                                   worker.returncode)


def _wall(monotonic: float) -> float:
    """A time.monotonic() of the past as a time.time()."""
    return time.time() - (time.monotonic() - monotonic)


# ---------------------------------------------------------------- limits


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


# ---------------------------------------------------------------- process helpers


@dataclass
class Spare:
    """A worker of the next attempt, waiting at the end of its interpreter's start-up (``launcher.run.spare``)."""

    proc: subprocess.Popen
    go: Optional[int]  # the launcher's end of the pipe it waits on
    output: object  # its PipeOutput without --log_dir; None with (its output goes to the log file)
    env: dict  # the environment it will have (it was started with this, plus the hook's two variables)
    log_id: Optional[tuple] = None  # with --log_dir: (st_dev, st_ino) of the log file its output goes to

    def close(self) -> None:
        if self.go is not None:
            os.close(self.go)
            self.go = None


def worker_env(plan: Plan, spec: WorkerSpec, attempt: int) -> dict:
    return {**plan.base_env, **spec.env, ev.RESTART_COUNT: str(attempt), ev.ELASTIC_RESTART_COUNT: str(attempt)}


def _start_spare(spec: WorkerSpec, env: dict) -> Spare:
    """The worker's own command, started with the environment it will have: outside the job's
    cgroup until it is woken (``WorkerGroup._wake``), its output where the worker's goes."""
    output = None if spec.log_file else logs.PipeOutput(spec.label)
    r, w = os.pipe2(os.O_CLOEXEC)
    out = None
    try:
        out = os.open(spec.log_file, os.O_RDWR | os.O_APPEND | os.O_CLOEXEC | os.O_NOCTTY) if spec.log_file else None
        log_id = _file_id(os.fstat(out)) if out is not None else None
        stdout, stderr = output.child_fds() if output else (out, out)
        proc = subprocess.Popen(
            spec.cmd,
            env=spare_module.waiting_env(env, r),
            stdin=subprocess.DEVNULL, stdout=stdout, stderr=stderr, pass_fds=(r,),
            start_new_session=True,
            preexec_fn=_child_setup(os.getpid(), None),
        )
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


def _file_id(st: os.stat_result) -> tuple:
    return st.st_dev, st.st_ino


def _write_all(fd: int, data: bytes) -> None:
    while data:
        data = data[os.write(fd, data):]


def _error_files(specs) -> list:
    return [s.env[ev.ERROR_FILE] for s in specs if s.env.get(ev.ERROR_FILE)]


def _note_signal(signum, frame) -> None:
    """The work is done in the event loop, which the wakeup pipe tells of the signal."""


def _child_setup(launcher_pid: int, cgroup_fd: Optional[int]):
    def setup() -> None:
        """In the worker, before exec: enter the job's cgroup; SIGTERM when the launcher dies."""
        if cgroup_fd is not None:
            try:
                os.write(cgroup_fd, b"0")
            except OSError:
                pass
        _libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
        # let the launcher's own helpers (py-spy, for stacks) trace the worker under Yama's ptrace_scope=1
        _libc.prctl(PR_SET_PTRACER, launcher_pid, 0, 0, 0)
        if os.getppid() != launcher_pid:  # the launcher died before the line above
            os._exit(1)

    return setup


def _start_watchdog(run_id: str, grace: float) -> subprocess.Popen:
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    code = f"import sys; sys.path.insert(0, {root!r}); from launcher.run import watchdog; watchdog.main()"
    return subprocess.Popen(
        [sys.executable, "-c", code, run_id, repr(grace)],
        stdin=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        start_new_session=True,
    )


def _children() -> list:
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


def _descendants() -> list:
    import psutil

    try:
        return [p.pid for p in psutil.Process().children(recursive=True)]
    except psutil.Error:
        return []


def _reap(pid: int, wait: bool) -> bool:
    try:
        done, _ = os.waitpid(pid, 0 if wait else os.WNOHANG)
        return done == pid
    except ChildProcessError:
        return True


def _killpg(pgid: int, sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def _remove(path: str) -> None:
    try:
        os.remove(path)
        os.rmdir(os.path.dirname(path))
    except OSError:
        pass
