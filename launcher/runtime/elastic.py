"""Survive a membership change in place: the training function re-entered in the same process, with the new round's
rank and world size, and the state handed on by a survivor, not reloaded from a checkpoint.

    from launcher.runtime import elastic

    state = {"model": model, "optimizer": optimizer, "step": 0}   # state_dict() holders, or plain values

    def train(round_):                 # round_.rank, round_.world_size, round_.device, round_.number
        while state["step"] < steps:
            ...                        # forward, backward, all-reduce, optimizer step
            state["step"] += 1

    elastic.run(train, state)

Under an elastic launch (``--nnodes MIN:MAX``) the worker tells its launcher, over the launcher's local channel,
that it re-enters in place. When the membership changes, the launcher tells it the round is over instead of
stopping it: the process group is aborted at once (a collective blocked on a lost or frozen peer returns with
an error), the worker waits for the next round's variables, builds a new process group on that round's store,
and the state is broadcast from a rank that held it (the lowest such rank; rank 0 when none did, so the first
round, or a job restarted whole, starts from what rank 0 loaded) to every other rank. Then ``train`` is called
again. What a step had done when it was interrupted is lost; keep ``step`` in the state and move it with the
optimizer step.

Interrupting a blocked collective: gloo has no abort, so the sockets the process group opened are shut down
(the group's own, found as it is built; the store's and the process's others are left alone), which makes the
blocked call fail at once; NCCL is aborted through torch (``ProcessGroup.abort``, torch 2.7 and later, else the
older private calls). A backend that cannot be interrupted is not kept in place: the worker says so once, and
the launcher restarts it at each membership change, as it does any program that does not call ``run``.
Outside such a launch, ``run`` joins the job from the environment and calls ``train`` once.
"""

from __future__ import annotations

import contextlib
import ctypes
import gc
import hashlib
import logging
import os
import socket
import threading
import time
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, Callable, Optional

import torch
import torch.distributed as dist

from launcher import envvars as ev
from launcher.runtime.channel import Channel, await_first_round
from launcher.runtime.environment import gpu_index

log = logging.getLogger("launcher.runtime.elastic")

DEFAULT_TIMEOUT = timedelta(minutes=5)  # a round's rendezvous; collectives keep torch's own default
RETRY_FORM = 0.2  # seconds between two tries of a round's store and group
NETWORK_ERRORS = tuple(e for e in (getattr(dist, "DistNetworkError", None),) if e is not None)
SETTLE = 0.5  # seconds the training thread has to leave a round by itself before its collectives are broken


@dataclass(frozen=True)
class Round:
    """What ``train`` is given each time it is entered."""

    number: int  # 0 at this process's first round, then one more at each re-form
    rank: int
    world_size: int
    local_rank: int
    device: torch.device
    backend: str
    source: int  # the rank whose state every other rank took this round


class RoundOver(Exception):
    """Raised in the training thread when the launcher says the round is over (caught by ``run``)."""


# ---------------------------------------------------------------- one round's process group


def _sockets(before: Optional[dict] = None) -> dict:
    """This process's sockets (fd -> inode); where ``before`` is given, those not among its."""
    found = {}
    for name in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{name}")
        except OSError:
            continue
        if target.startswith("socket:[") and (before is None or before.get(int(name)) != target):
            found[int(name)] = target
    return found


class Group:
    """One round's store and process group, and how to interrupt them: made first (``Group()``, instant), then
    formed (``form``, which blocks on the other ranks), so that a round that ends meanwhile interrupts the
    forming as well as the collectives."""

    def __init__(self, backend: str) -> None:
        env = os.environ
        self.rank, self.world_size = int(env[ev.RANK]), int(env[ev.WORLD_SIZE])
        self.local_rank = int(env.get(ev.LOCAL_RANK, "0"))
        self.backend = backend
        self.store = self.pg = None
        self.before = _sockets()  # what this process had open before the round: never touched
        self.own: Optional[dict] = None  # the round's sockets, once formed (the train function's own are not)
        self.groups: list = []  # process groups made in the round (``round_owns``), aborted with its world
        self.interrupted = False
        self.trainer = threading.get_ident()  # the thread that forms the group and trains in it
        self.left = threading.Event()  # the training thread left the round (``run`` caught its end)
        self.lock = threading.Lock()  # an interrupt and the training thread's leaving: one before the other
        gpu = gpu_index(env.get(ev.SELECTED_GPUS))
        self.device = (torch.device("cuda", gpu if gpu is not None else torch.cuda.current_device())
                       if backend == "nccl" else torch.device("cpu"))

    def form(self, timeout: timedelta) -> None:
        """The round's store and process group. A store connection reset before the group formed is tried again
        (within ``timeout``): a worker kept in place is told of a round at once, and may reach node 0's store
        before node 0's launcher begins that round, which lets the round before's clients go."""
        deadline = time.monotonic() + timeout.total_seconds()
        while True:
            try:
                return self._form_once(timeout)
            except NETWORK_ERRORS:
                if self.interrupted or time.monotonic() >= deadline:
                    raise
                self.close()
                time.sleep(RETRY_FORM)

    def _form_once(self, timeout: timedelta) -> None:
        env = os.environ
        agent = env.get(ev.ELASTIC_USE_AGENT_STORE, "").lower() in ("1", "true")
        self.store = dist.TCPStore(env[ev.MASTER_ADDR], int(env[ev.MASTER_PORT]), self.world_size,
                                   is_master=self.rank == 0 and not agent, timeout=timeout, wait_for_workers=False)
        self._this_rounds_store(env.get(ev.ELASTIC_ROUND))
        dist.init_process_group(self.backend, store=self.store, rank=self.rank, world_size=self.world_size)
        self.pg = dist.group.WORLD
        self.own = _sockets(self.before)

    def _this_rounds_store(self, round_: Optional[str]) -> None:
        """Connected to this round's store, not the round before's: rank 0's store of that round may still take a
        connection as it closes, whose reset inside the group's forming would leave the others waiting for ever.
        Rank 0 marks its round in the store, the others wait for the mark: one reached the old store is reset
        here, before any group forms, and tries again (``form``)."""
        if round_ is None:
            return
        key = "launcher/round/" + hashlib.sha1(round_.encode()).hexdigest()
        if self.rank == 0:
            self.store.set(key, b"1")
        else:
            self.store.wait([key])

    def interrupt(self) -> None:
        """End the round in the training thread, from any thread: ``RoundOver`` raised there as soon as it runs Python
        (between two collectives, or at once in a world of one, where no collective blocks); where it is blocked in a
        collective, after SETTLE, every call of the round is made to fail: the sockets the round opened (the store's,
        gloo's) shut down, and an NCCL group aborted. The order matters for gloo: a send it queued on a socket shut
        down under it is never failed (only its timeout ends it), so its sockets are shut only where it waits."""
        with self.lock:
            if self.interrupted or self.left.is_set():
                return
            self.interrupted = True
            _raise_in(self.trainer, RoundOver)
        threading.Thread(target=self._break_blocked, name="launcher-round-over", daemon=True).start()

    def leave(self) -> None:
        """The training thread left the round: no ``RoundOver`` is raised in it from now on (one pending is dropped)."""
        with self.lock:
            self.left.set()
            _raise_in(self.trainer, None)

    def _break_blocked(self) -> None:
        """Under the lock ``leave`` takes: once the training thread left (it may be forming the next round, whose
        sockets are new too), nothing of this round is touched any more."""
        if self.left.wait(SETTLE):
            return
        with self.lock:
            if self.left.is_set():
                return
            if self.backend != "gloo" and self.pg is not None:
                for pg in (*self.groups, self.pg):
                    _abort(pg)
                return
            for fd, inode in (self.own if self.own is not None else _sockets(self.before)).items():
                _shut_down(fd, inode)

    def adopt(self, sockets: dict, groups: list) -> None:
        """``sockets`` and process groups made in the round after it formed are the round's: interrupted with it."""
        with self.lock:
            if self.own is not None:
                self.own.update(sockets)
            self.groups.extend(groups)

    def close(self) -> None:
        self.groups = []
        if dist.is_initialized():
            try:
                dist.destroy_process_group()
            except Exception as e:  # an aborted group may refuse to be destroyed cleanly: it is dropped all the same
                log.debug("destroy_process_group: %s", e)
        self.pg = None
        self.store = None


_current: Optional[Group] = None  # the round this process is in, while ``run`` runs one


@contextlib.contextmanager
def round_owns():
    """Process groups made in the block (the caller adds them to the list it is given) are the current round's:
    when the round ends under a collective blocked in one, it is interrupted as the round's own group is (gloo:
    the sockets made in the block are shut down; NCCL: the groups aborted). Outside ``run``, nothing is done.

        with elastic.round_owns() as made:
            made.append(dist.new_group(ranks))
    """
    group, before, made = _current, _sockets(), []
    try:
        yield made
    finally:
        if group is not None:
            group.adopt(_sockets(before), made)


def _shut_down(fd: int, inode: str) -> None:
    """Shut one connected socket of the group down, if ``fd`` is still that socket (never a listener: gloo's
    own listener must not fail its accept)."""
    try:
        if os.readlink(f"/proc/self/fd/{fd}") != inode:
            return
        sock = socket.socket(fileno=os.dup(fd))
    except OSError:
        return
    with sock, contextlib.suppress(OSError):
        if not sock.getsockopt(socket.SOL_SOCKET, socket.SO_ACCEPTCONN):
            sock.shutdown(socket.SHUT_RDWR)


def _raise_in(thread_id: int, exc: Optional[type]) -> None:
    """``exc`` raised in the thread ``thread_id`` the next time it runs Python code (None: the one pending dropped)."""
    ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(thread_id),
                                               ctypes.py_object(exc) if exc is not None else None)


def _abort(pg) -> None:
    if hasattr(pg, "abort"):  # torch 2.7 and later, every backend
        pg.abort()
        return
    abort = getattr(dist.distributed_c10d, "_abort_process_group", None)
    if abort is not None:
        abort(pg)
        return
    pg._get_backend(torch.device("cuda"))._shutdown()


def interruptible(backend: str) -> bool:
    """Whether a blocked collective of ``backend`` can be interrupted here."""
    if backend == "gloo":
        return os.path.isdir("/proc/self/fd")
    if backend == "nccl":
        return (hasattr(dist.ProcessGroup, "abort") or hasattr(dist.distributed_c10d, "_abort_process_group")
                or hasattr(getattr(dist, "ProcessGroupNCCL", object), "_shutdown"))
    return False


# ---------------------------------------------------------------- the state


def _state_of(state: dict) -> dict:
    return {name: (value.state_dict() if hasattr(value, "state_dict") else value) for name, value in state.items()}


def _load(state: dict, taken: dict) -> None:
    for name, value in taken.items():
        if name in state and hasattr(state[name], "load_state_dict"):
            state[name].load_state_dict(value)
        else:
            state[name] = value


def _share(state: dict, group: Group, holds: bool) -> int:
    """Every rank's state made the source's (the lowest rank that held one, else rank 0); the source's rank."""
    flags = torch.zeros(group.world_size, dtype=torch.int32, device=group.device)
    flags[group.rank] = 1 if holds else 0
    dist.all_reduce(flags)
    holders = [r for r, f in enumerate(flags.tolist()) if f]
    source = holders[0] if holders else 0
    if group.world_size > 1:
        box = [_state_of(state) if group.rank == source else None]
        dist.broadcast_object_list(box, src=source, device=group.device)
        if group.rank != source:
            _load(state, box[0])
    return source


# ---------------------------------------------------------------- the loop


def run(train: Callable[[Round], Any], state: dict, backend: Optional[str] = None,
        timeout: Optional[timedelta] = None) -> Any:
    """Call ``train`` in each round of the job this worker is in, until it returns; what it returned.

    ``state``: what a joiner takes from a survivor (``state_dict`` holders, or plain picklable values).
    ``backend``: NCCL where CUDA is, else gloo. ``timeout``: each round's rendezvous (5 minutes)."""
    backend = backend or ("nccl" if torch.cuda.is_available() else "gloo")
    timeout = timeout or DEFAULT_TIMEOUT
    keep = interruptible(backend)
    await_first_round()  # a worker started warm: its first round's variables, once it begins
    channel = Channel.connect(os.environ, keep)
    if channel is not None and not keep:
        log.warning("launcher.runtime.elastic: a blocked %s collective cannot be interrupted with this torch; "
                    "this worker is restarted at each membership change", backend)
    global _current
    progress = _Progress()
    with _frozen():
        while True:
            group = _current = Group(backend)
            if backend == "nccl":
                torch.cuda.set_device(group.device)
            try:
                done, result = _one_round(train, state, group, channel, progress, timeout, keep)
            except RoundOver:  # the round's end came between the training's own end and run taking it
                done, result = False, None
            finally:
                _current = None
            group.leave()
            group.close()
            if done:
                return result
            del group
            gc.collect()  # what the round made, held in a cycle (a wrapper of the model): its store must not outlive it
            channel.on_stop = lambda: None
            channel.parked()
            os.environ.update(channel.next_round())
            progress.number += 1


@contextlib.contextmanager
def _frozen():
    """What the program holds when ``run`` begins (torch's modules and its compiler's, which ``torch.optim`` imports,
    the model: some 300,000 objects) is left out of Python's garbage collections until ``run`` returns
    (``gc.freeze``): the collection at each round's end then looks only at what was made since, in milliseconds, where
    a full one took 0.1-0.3 s on 2 busy cores while every launcher waited for its workers to leave the round. A program
    that froze objects itself is left as it is."""
    if gc.get_freeze_count():
        yield
        return
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()


@dataclass
class _Progress:
    number: int = 0  # rounds this process entered before
    holds: bool = False  # whether it holds the state (it had it sent, or sent it)


def _one_round(train, state: dict, group: Group, channel: Optional[Channel], progress: _Progress, timeout, keep: bool):
    """(True, what ``train`` returned) when it returned; (False, None) when the round ended under it (it raised, and
    the launcher said the round is over within its ``reform_wait``); else what it raised, raised."""
    try:
        if channel is not None:
            channel.on_stop = group.interrupt
            if channel.stopped.is_set():  # the round ended before it began here
                group.interrupt()
        group.form(timeout)
        source = _share(state, group, progress.holds)
        progress.holds = True
        result = train(Round(progress.number, group.rank, group.world_size, group.local_rank, group.device,
                             group.backend, source))
    except Exception:
        group.leave()
        if channel is None or not keep or not channel.round_over(channel.reform_wait):
            raise
        log.info("launcher.runtime.elastic: the round is over; waiting for the next one")
        return False, None
    group.leave()
    return True, result
