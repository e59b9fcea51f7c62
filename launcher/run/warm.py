"""Warm workers (``--warm_start``): an elastic job's workers started before their launcher joins the job, each run up to
``launcher.runtime.elastic.run`` (its imports, its model), where it waits for its first round; woken as that round's
worker when the round begins. The others then wait for a joiner's re-form only, not for its start-up (``import torch``
and the model: seconds), and a standby's workers are ready when it takes a lost member's place.

A warm worker is started with the variables that do not depend on the round (``warm_env``: the user's, its local rank,
its GPUs, its threads) and LAUNCHER_WARM_FD, its end of a socket pair. ``elastic.run`` says ``READY`` there and waits;
once the launcher's round began, it sends the worker its whole environment and its output's descriptors (``wake``), as
it does for a worker kept in place from one round to the next. A worker that ends, or has not said ready within the
wait, is not used: its round starts one afresh. A program that does not call ``elastic.run`` never says ready.
Until woken, a warm worker is outside the job's cgroup and writes to the launcher's own standard output and error;
when the launcher ends without waking it (``close``), or its socket closes, it ends.
"""

from __future__ import annotations

import selectors
import signal
import socket
from dataclasses import dataclass
from typing import Optional

from launcher import envvars as ev
from launcher import local_channel as lc
from launcher.output.messages import log
from launcher.plan.model import Plan, WorkerSpec
from launcher.run.starter import Clock, Process, ProcessStarter, SystemClock

LOOK_EVERY = 0.2  # seconds between two looks for a warm worker that ended, while waiting for them to be ready
ENDING = 2.0  # seconds a warm worker whose socket closed has to end, for its exit code to be told
EXIT_LOOK = 0.02  # seconds between two looks for that end

# the variables of a worker that are the same in every round: its place on this node, not in the job
LOCAL_VARIABLES = (ev.LOCAL_RANK, ev.LOCAL_WORLD_SIZE, ev.OMP_NUM_THREADS, ev.GLOO_SOCKET_IFNAME, ev.SELECTED_GPUS,
                   ev.SELECTED_ACCELERATORS, ev.LOCAL_DEVICE_IDS, "CUDA_VISIBLE_DEVICES", "MKL_NUM_THREADS")


@dataclass
class Warm:
    """One warm worker: its process and the launcher's end of its socket."""

    spec: WorkerSpec  # the trial plan's, for its local rank and its label
    proc: Process
    sock: Optional[socket.socket]
    ready: bool = False
    heard: bytes = b""  # what it said so far


def warm_env(plan: Plan, spec: WorkerSpec, fd: int) -> dict:
    """What a warm worker starts with: the job's environment, its local variables, the descriptor of its socket."""
    local = {name: spec.env[name] for name in LOCAL_VARIABLES if name in spec.env}
    return {**plan.base_env, **local, ev.WARM_FD: str(fd)}


class WarmWorkers:
    """The warm workers of this node, by local rank; every wait on ``clock``."""

    def __init__(self, starter: ProcessStarter, clock: Clock = SystemClock()) -> None:
        self.starter = starter
        self.clock = clock
        self.by_local: dict = {}  # local rank -> Warm

    def start(self, plan: Plan) -> None:
        """Each worker of ``plan`` (its places on this node: the trial plan's) started warm."""
        for spec in plan.workers:
            ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
            try:
                proc = self.starter.start(spec.cmd, warm_env(plan, spec, theirs.fileno()), None, None,
                                          pass_fds=(theirs.fileno(),), cpus=spec.cpus)
            except OSError as e:
                ours.close()
                log.warning("%s could not be started warm (%s): it starts with its round", spec.label, e.strerror or e)
                continue
            finally:
                theirs.close()
            self.by_local[spec.local_rank] = Warm(spec, proc, ours)

    def await_ready(self, timeout: float) -> None:
        """Wait until every warm worker said it is ready, up to ``timeout`` seconds; those that ended or did not are
        let go (their rounds start them afresh), saying why."""
        deadline = self.clock.monotonic() + timeout
        with selectors.DefaultSelector() as selector:
            for warm in self.by_local.values():
                selector.register(warm.sock, selectors.EVENT_READ, warm)
            while self._waiting() and self.clock.monotonic() < deadline:
                for key, _ in self.clock.select(selector, min(LOOK_EVERY, max(0.0, deadline - self.clock.monotonic()))):
                    self._heard(key.data, selector)
                for warm in self._waiting():
                    code = self.starter.exit_status(warm.proc.pid)
                    if code is not None:
                        selector.unregister(warm.sock)
                        self._let_go(warm, f"it ended (exit code {code}) before it waited in launcher.runtime.elastic.run")
        for warm in self._waiting():
            self._let_go(warm, f"it did not wait in launcher.runtime.elastic.run within {timeout:g} s")
        if self.by_local:
            log.info("%d worker(s) started warm: they wait for this node's first round", len(self.by_local))

    def take(self, local_rank: int) -> Optional[Warm]:
        """The warm worker of ``local_rank`` for its round, if it still waits (one that ended meanwhile: let go)."""
        warm = self.by_local.get(local_rank)
        if warm is None:
            return None
        code = self.starter.exit_status(warm.proc.pid)
        if code is not None:
            self._let_go(warm, f"it ended (exit code {code}) before its round")
            return None
        return self.by_local.pop(local_rank)

    def close(self) -> None:
        """The warm workers never woken (the job ended first, or the launcher failed): ended."""
        for warm in list(self.by_local.values()):
            self._end(warm)
        self.by_local.clear()

    # ------------------------------------------------------------ inside

    def _waiting(self) -> list:
        return [w for w in self.by_local.values() if not w.ready]

    def _heard(self, warm: Warm, selector) -> None:
        try:
            data = warm.sock.recv(len(lc.READY))
        except OSError:
            data = b""
        warm.heard += data
        if warm.heard == lc.READY:
            warm.ready = True
        elif data and lc.READY.startswith(warm.heard):
            return
        selector.unregister(warm.sock)
        if warm.ready:
            return
        if data:
            self._let_go(warm, "it said something else than ready")
            return
        code = self._exit_within(warm, ENDING)  # its socket closes as it ends: say how it ended
        self._let_go(warm, f"it ended (exit code {code}) before it waited in launcher.runtime.elastic.run"
                     if code is not None else "it closed its socket before it waited in launcher.runtime.elastic.run")

    def _exit_within(self, warm: Warm, seconds: float) -> Optional[int]:
        deadline = self.clock.monotonic() + seconds
        while True:
            code = self.starter.exit_status(warm.proc.pid)
            if code is not None or self.clock.monotonic() >= deadline:
                return code
            self.clock.sleep(EXIT_LOOK)

    def _let_go(self, warm: Warm, why: str) -> None:
        log.warning("%s not kept warm: %s; it starts with its round", warm.spec.label, why)
        del self.by_local[warm.spec.local_rank]
        self._end(warm)

    def _end(self, warm: Warm) -> None:
        if warm.sock is not None:
            warm.sock.close()
            warm.sock = None
        self.starter.signal_group(warm.proc.pid, signal.SIGKILL)
        self.starter.reap(warm.proc.pid, wait=True)


def wake(warm: Warm, env: dict, fds: tuple, progress: bool) -> Optional[str]:
    """Make ``warm`` a round's worker: told its environment, given its output's descriptors (and its progress page's,
    last, when ``progress``); None once done, else why it could not be. Its socket is closed either way."""
    sock, warm.sock = warm.sock, None
    data = lc.encode(lc.round_message(env, len(fds), progress))  # as a kept worker's round
    try:
        sent = lc.send_with_fds(sock, data, fds)
        if sent < len(data):  # never an empty send: the worker may have closed its end once it had it all
            sock.sendall(data[sent:])
    except OSError as e:
        return e.strerror or str(e)
    finally:
        sock.close()
    return None
