"""Every side effect of running a job: spawn the workers, watch them, pass signals on, stop them.

One event loop on one selector. The signal wakeup pipe tells of signals, SIGCHLD among them, so
a worker's exit is known as it happens (on any Linux kernel; no polling loop); pipes carry console
output. Nothing wakes on a timer except the console echo of a log file, and only while it has
something to follow.
"""

from __future__ import annotations

import ctypes
import os
import selectors
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from typing import Optional

import psutil

from launcher import envvars as ev
from launcher import logs
from launcher.errors import LaunchError
from launcher.logs import log
from launcher.plan import Plan, WorkerSpec

STOPPING_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT)
PASSED_ON_SIGNALS = (signal.SIGUSR1, signal.SIGUSR2)
HANDLED_SIGNALS = STOPPING_SIGNALS + PASSED_ON_SIGNALS + (signal.SIGCHLD,)
DRAIN_SECONDS = 5.0  # how long output may still come after every process is gone
PR_SET_PDEATHSIG = 1
PR_SET_CHILD_SUBREAPER = 36
_libc = ctypes.CDLL(None, use_errno=True)


@dataclass(frozen=True)
class Failure:
    rank: int
    local_rank: int
    pid: int
    returncode: int
    run_time: float
    log_file: Optional[str]
    last_lines: tuple


@dataclass
class Worker:
    spec: WorkerSpec
    proc: subprocess.Popen
    output: object  # logs.FileOutput or logs.PipeOutput
    started: float
    returncode: Optional[int] = None
    ended: Optional[float] = None

    @property
    def alive(self) -> bool:
        return self.returncode is None


def exit_code(returncode: int) -> int:
    """A worker's return code as a shell would report it: 128 + N for signal N."""
    return 128 - returncode if returncode < 0 else returncode


def run(plan: Plan) -> int:
    """Start the plan's workers, supervise them to the end, and return the launcher's exit code."""
    job = Job(plan)
    try:
        job.start()
        return job.supervise()
    finally:
        job.close()


class Job:
    def __init__(self, plan: Plan) -> None:
        self.plan = plan
        self.workers: list = []
        self.selector = selectors.DefaultSelector()
        self.first_failed: Optional[Worker] = None
        self.stop_signal: Optional[int] = None  # the signal that stopped the job, if one did
        self.stop_deadline: Optional[float] = None
        self.killed = False
        self.follow_delay = 0.02
        self.watchdog: Optional[subprocess.Popen] = None
        self._wake_r, self._wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        self._old_handlers: dict = {}
        self._started_at = time.monotonic()

    # ------------------------------------------------------------ start

    def start(self) -> None:
        _libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
        self._install_signal_handlers()
        self._write_files()
        if self.plan.log_dir:
            os.makedirs(self.plan.log_dir, exist_ok=True)
        self.watchdog = _start_watchdog(self.plan)
        for spec in self.plan.workers:
            self._spawn(spec)
        log.debug("started %d worker(s)", len(self.workers))

    def _install_signal_handlers(self) -> None:
        signal.set_wakeup_fd(self._wake_w, warn_on_full_buffer=False)
        self.selector.register(self._wake_r, selectors.EVENT_READ, ("signal", None))
        for sig in HANDLED_SIGNALS:
            self._old_handlers[sig] = signal.signal(sig, _note_signal)

    def _write_files(self) -> None:
        for path, text in self.plan.files.items():
            os.makedirs(os.path.dirname(path), exist_ok=True)
            with open(path, "w") as f:
                f.write(text)

    def _spawn(self, spec: WorkerSpec) -> None:
        if spec.log_file:
            output = logs.FileOutput(spec.log_file, spec.rank, spec.cmd, echo=spec.local_rank == 0)
        else:
            output = logs.PipeOutput(spec.rank)
        stdout, stderr = output.child_fds()
        try:
            proc = subprocess.Popen(
                spec.cmd,
                env={**self.plan.base_env, **spec.env},
                stdin=subprocess.DEVNULL,
                stdout=stdout,
                stderr=stderr,
                start_new_session=True,
                preexec_fn=_stop_with_parent,
            )
        except OSError as e:
            output.finish()
            raise LaunchError(f"cannot start rank {spec.rank} ({spec.cmd[0]}): {e.strerror}; check the command.") from None
        finally:
            output.spawned()
        worker = Worker(spec, proc, output, time.monotonic())
        self.workers.append(worker)
        for fd in output.pipes():
            self.selector.register(fd, selectors.EVENT_READ, ("pipe", worker))
        self._tell_watchdog(f"pgid {proc.pid}")

    # ------------------------------------------------------------ supervise

    def supervise(self) -> int:
        while any(w.alive for w in self.workers):
            for key, _ in self.selector.select(self._next_timeout()):
                kind, worker = key.data
                if kind == "signal":
                    self._on_signals()
                elif not worker.output.read_pipe(key.fd):
                    self.selector.unregister(key.fd)
            self._follow_logs()
            if self.stop_deadline is not None and time.monotonic() >= self.stop_deadline:
                self._kill_all()
        self._stop_leftovers()
        self._drain_output()
        return self._result()

    def _next_timeout(self) -> Optional[float]:
        waits = []
        if any(w.output.follows for w in self.workers):
            waits.append(self.follow_delay)
        if self.stop_deadline is not None and not self.killed:
            waits.append(max(0.0, self.stop_deadline - time.monotonic()))
        return min(waits) if waits else None

    def _follow_logs(self) -> None:
        moved = any([w.output.follow() for w in self.workers])
        self.follow_delay = 0.02 if moved else min(self.follow_delay * 2, 0.25)

    def _on_signals(self) -> None:
        try:
            received = os.read(self._wake_r, 512)
        except BlockingIOError:
            return
        for signum in received:
            self._on_signal(signal.Signals(signum))

    def _on_signal(self, sig: signal.Signals) -> None:
        if sig == signal.SIGCHLD:
            for w in self.workers:
                if w.alive and w.proc.poll() is not None:
                    self._on_exit(w)
            return
        if sig in PASSED_ON_SIGNALS:
            log.info("passing %s on to the workers", sig.name)
            for w in self.workers:
                if w.alive:
                    _send(w.proc.pid, sig)
            return
        if self.stop_deadline is None:
            log.warning("received %s: passing it on and stopping the workers", sig.name)
            self.stop_signal = sig
            self._begin_stop(sig)
        else:
            log.warning("received %s again: killing the workers now", sig.name)
            self._kill_all()

    def _on_exit(self, worker: Worker) -> None:
        worker.returncode = worker.proc.returncode
        worker.ended = time.monotonic()
        if worker.returncode == 0 or self.stop_deadline is not None:
            log.debug("rank %d: %s", worker.spec.rank, logs.describe_exit(worker.returncode))
            return
        self.first_failed = worker
        others = sum(w.alive for w in self.workers)
        log.error("rank %d failed (%s)%s", worker.spec.rank, logs.describe_exit(worker.returncode),
                  f"; stopping the other {others} worker(s)" if others else "")
        self._begin_stop(signal.SIGTERM)

    # ------------------------------------------------------------ stop

    def _begin_stop(self, sig: signal.Signals) -> None:
        self.stop_deadline = time.monotonic() + self.plan.shutdown_timeout
        for w in self.workers:
            _send_group(w.proc.pid, sig)

    def _kill_all(self) -> None:
        if not self.killed:
            alive = [w.spec.rank for w in self.workers if w.alive]
            if alive:
                log.warning("rank(s) %s still running after %.1f s: sending SIGKILL",
                            ",".join(map(str, alive)), self.plan.shutdown_timeout)
        self.killed = True
        for w in self.workers:
            _send_group(w.proc.pid, signal.SIGKILL)
        for p in self._descendants():
            _send(p.pid, signal.SIGKILL)

    def _descendants(self) -> list:
        """Every process below the launcher but the watchdog: workers, their children, and orphans
        they left, which come back to the launcher because it is a child subreaper."""
        keep = {self.watchdog.pid} if self.watchdog else set()
        try:
            children = psutil.Process().children(recursive=True)
        except psutil.Error:
            return []
        return [p for p in children if p.pid not in keep and _running(p)]

    def _stop_leftovers(self) -> None:
        """Processes the workers started and left behind: SIGTERM, then SIGKILL after the grace."""
        leftovers = self._descendants()
        if not leftovers:
            return
        log.info("stopping %d process(es) the workers left running", len(leftovers))
        for w in self.workers:
            _send_group(w.proc.pid, signal.SIGTERM)
        for p in leftovers:
            _send(p.pid, signal.SIGTERM)
        _, survivors = psutil.wait_procs(leftovers, timeout=self.plan.shutdown_timeout)
        for p in survivors:
            _send(p.pid, signal.SIGKILL)
        psutil.wait_procs(survivors, timeout=1)

    def _drain_output(self) -> None:
        deadline = time.monotonic() + DRAIN_SECONDS
        while self._pipes_open() and time.monotonic() < deadline:
            for key, _ in self.selector.select(deadline - time.monotonic()):
                kind, worker = key.data
                if kind == "pipe" and not worker.output.read_pipe(key.fd):
                    self.selector.unregister(key.fd)
                elif kind == "signal":
                    os.read(self._wake_r, 512)
        for w in self.workers:
            w.output.finish()

    def _pipes_open(self) -> bool:
        return any(key.data[0] == "pipe" for key in self.selector.get_map().values())

    def _result(self) -> int:
        if self.stop_signal is not None:
            return 128 + self.stop_signal
        if self.first_failed is not None:
            w = self.first_failed
            failure = Failure(w.spec.rank, w.spec.local_rank, w.proc.pid, w.returncode,
                              w.ended - w.started, w.spec.log_file, tuple(w.output.last_lines()))
            logs.console.write(2, (logs.format_failure(failure) + "\n").encode())
            return exit_code(w.returncode)
        log.info("all %d worker(s) finished in %.1f s", len(self.workers), time.monotonic() - self._started_at)
        return 0

    # ------------------------------------------------------------ close

    def close(self) -> None:
        """Always runs: whatever is still alive is stopped, then the watchdog is released."""
        if any(w.alive for w in self.workers) or self._descendants():
            self._begin_stop(signal.SIGTERM)
            procs = [w.proc for w in self.workers if w.alive]
            deadline = time.monotonic() + self.plan.shutdown_timeout
            while any(p.poll() is None for p in procs) and time.monotonic() < deadline:
                time.sleep(0.02)
            self._kill_all()
            for p in procs:
                p.wait()
            for w in self.workers:
                w.output.finish()
        if self.watchdog is not None:
            self._tell_watchdog("quit")
            self.watchdog.stdin.close()
            self.watchdog.wait()
        _reap_orphans()
        for sig, handler in self._old_handlers.items():
            signal.signal(sig, handler)
        signal.set_wakeup_fd(-1)
        for path in self.plan.files:
            _remove(path)
        self.selector.close()
        os.close(self._wake_r)
        os.close(self._wake_w)

    def _tell_watchdog(self, line: str) -> None:
        try:
            self.watchdog.stdin.write(f"{line}\n".encode())
            self.watchdog.stdin.flush()
        except (OSError, ValueError):
            log.debug("the watchdog is gone; %r not delivered", line)


def _note_signal(signum, frame) -> None:
    """The work is done in the event loop, which the wakeup pipe tells of the signal."""


def _stop_with_parent() -> None:
    """In the worker, before exec: SIGTERM when the launcher dies (the watchdog does the rest)."""
    _libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)


def _start_watchdog(plan: Plan) -> subprocess.Popen:
    script = os.path.join(os.path.dirname(os.path.abspath(__file__)), "watchdog.py")
    run_id = plan.workers[0].env[ev.RUN_ID]
    return subprocess.Popen(
        [sys.executable, script, run_id, str(plan.shutdown_timeout)],
        stdin=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        start_new_session=True,
    )


def _running(p: psutil.Process) -> bool:
    try:
        return p.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def _reap_orphans() -> None:
    """Collect the exit status of orphans that came to the launcher as their subreaper."""
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


def _send_group(pgid: int, sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def _send(pid: int, sig: int) -> None:
    try:
        os.kill(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def _remove(path: str) -> None:
    try:
        os.remove(path)
        os.rmdir(os.path.dirname(path))
    except OSError:
        pass
