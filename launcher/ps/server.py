"""A parameter server: holds its slices of the dense parameters and its rows of the sparse tables,
and applies the trainers' gradients with the user's optimizer (one instance per slice or table shard).

sync: a gradient waits until every trainer still training sent its own for that step; the server
then averages them, steps, and answers all of them with the new values. async / half-async: each
gradient is applied on arrival and answered with the new values (with DC-ASGD, compensated by the
distance from the values that trainer last pulled). geo: trainers send parameter deltas, added on
arrival. The module-level functions are what trainers call over RPC; they act on this process's
Server.
"""

from __future__ import annotations

import threading
import time
from contextlib import suppress
from typing import Optional

import torch
import torch.distributed.rpc as rpc
from torch.futures import Future

from launcher.ps import transport
from launcher.ps.config import GEO, SYNC, PsOptions
from launcher.ps.env import PsEnv, trainer_name
from launcher.ps.model import ModelSpec
from launcher.ps.placement import Slice

PING_EVERY = 0.5  # seconds between liveness checks of each trainer


class Held:
    """One slice of a dense parameter (flat) or one server's rows of a table, with its own optimizer."""

    def __init__(self, spec: ModelSpec, info, values: torch.Tensor):
        self.value = torch.nn.Parameter(values, requires_grad=True)
        self.optimizer = spec.make_optimizer(info, self.value)

    def apply(self, grad: torch.Tensor) -> None:
        self.value.grad = grad
        self.optimizer.step()
        self.value.grad = None


class Server:
    def __init__(self, env: PsEnv, options: PsOptions, spec: ModelSpec, slices: tuple, params: list):
        self.env, self.options = env, options
        self.lock = threading.Lock()
        me, servers = env.index, len(env.servers)
        self.dense = {s.name: Held(spec, spec.params[spec.index_of(s.param)], _slice_of(params, spec, s))
                      for s in slices if s.server == me}
        self.sparse = {i.name: Held(spec, i, params[i.index].detach()[me::servers].clone()) for i in spec.sparse}
        self.backups: dict = {}  # trainer -> {slice name: values that trainer last pulled} (DC-ASGD)
        self.round: dict = {}  # sync: trainer -> (dense grads, sparse grads) of the step being gathered
        self.waiting: list = []  # sync: (trainer, future) answered when the round is applied
        self.stopped: set = set()
        self.saved: dict = {}  # save key -> Future done once trainer 0 wrote it
        self.failure: Optional[str] = None
        self.finished = threading.Event()
        self.watcher: Optional[threading.Thread] = None  # the liveness checks, started by serve()

    # ------------------------------------------------------------------ what trainers ask

    def values(self, trainer: int) -> dict:
        """Every dense slice this server holds (a pull); DC-ASGD remembers them as that trainer's backup."""
        out = {name: h.value.detach().clone() for name, h in self.dense.items()}
        if self.options.enable_dc_asgd:
            self.backups[trainer] = out
        return out

    def push(self, trainer: int, dense: dict, sparse: dict) -> Future:
        fut = Future()
        with self.lock:
            self._check_alive()
            if self.options.mode != SYNC:
                self._apply(trainer, [dense], [sparse], 1)
                fut.set_result(self.values(trainer) if self.options.mode != GEO else {})
                return fut
            if trainer in self.round:
                raise RuntimeError(f"trainer {trainer} pushed twice in one synchronous step.")
            self.round[trainer] = (dense, sparse)
            self.waiting.append((trainer, fut))
            answers = self._finish_round()
        _answer(answers)
        return fut

    def add_deltas(self, trainer: int, deltas: dict, rows: dict) -> tuple:
        """geo: add a trainer's deltas (dense slices, and {table: (local ids, rows)}); the new values of both."""
        with self.lock:
            self._check_alive()
            for name, delta in deltas.items():
                self.dense[name].value.data.add_(delta)
            for name, (ids, delta) in rows.items():
                self.sparse[name].value.data.index_add_(0, ids, delta)
            return (self.values(trainer),
                    {name: self.sparse[name].value.detach()[ids].clone() for name, (ids, _) in rows.items()})

    def rows(self, table: str, local_ids: torch.Tensor) -> torch.Tensor:
        with self.lock:
            return self.sparse[table].value.detach()[local_ids].clone()

    def everything(self) -> tuple:
        with self.lock:
            return ({n: h.value.detach().clone() for n, h in self.dense.items()},
                    {n: h.value.detach().clone() for n, h in self.sparse.items()})

    def stop(self, trainer: int) -> None:
        with self.lock:
            self.stopped.add(trainer)
            answers = self._finish_round()
            if len(self.stopped) == self.env.trainers_num:
                self.finished.set()
        _answer(answers)

    def saved_future(self, key: str) -> Future:
        with self.lock:
            return self.saved.setdefault(key, Future())

    def fail(self, message: str) -> None:
        with self.lock:
            if self.failure is not None:
                return
            self.failure = message
            waiting, self.waiting, self.round = self.waiting, [], {}
            pending = [f for f in self.saved.values() if not f.done()]
        for fut in [f for _, f in waiting] + pending:
            fut.set_exception(transport.PsError(message))
        self.finished.set()

    # ------------------------------------------------------------------ inside

    def _check_alive(self) -> None:
        if self.failure is not None:
            raise transport.PsError(self.failure)

    def _finish_round(self) -> list:
        """Apply the round once every trainer still training is in it; the (future, answer) pairs to send."""
        active = set(range(self.env.trainers_num)) - self.stopped
        if not self.round or not active <= set(self.round):
            return []
        grads = list(self.round.values())
        self._apply(None, [d for d, _ in grads], [s for _, s in grads], len(grads))
        answers = [(fut, self.values(t)) for t, fut in self.waiting]
        self.round, self.waiting = {}, []
        return answers

    def _apply(self, trainer: Optional[int], dense: list, sparse: list, count: int) -> None:
        """Step every slice and table with the average of ``count`` trainers' gradients (None: no gradient)."""
        for name, held in self.dense.items():
            given = [d[name] for d in dense if d.get(name) is not None]
            if not given:
                continue
            grad = given[0] if len(given) == 1 and count == 1 else torch.stack(given).sum(0) / count
            if self.options.enable_dc_asgd and trainer in self.backups:
                grad = dc_asgd(grad, held.value.detach(), self.backups[trainer][name], self.options.dc_asgd_lambda)
            held.apply(grad.view_as(held.value))
        for name, held in self.sparse.items():
            parts = [s[name] for s in sparse if name in s]
            if parts:
                ids = torch.cat([p[0] for p in parts])
                rows = torch.cat([p[1] for p in parts]) / count
                held.apply(torch.sparse_coo_tensor(ids.unsqueeze(0), rows, held.value.shape, check_invariants=False))


def dc_asgd(grad: torch.Tensor, value: torch.Tensor, backup: torch.Tensor, lam: float) -> torch.Tensor:
    """The delay-compensated gradient g + λ·g⊙g⊙(w − w_backup)."""
    return grad + lam * grad * grad * (value.view_as(grad) - backup.view_as(grad))


def _answer(answers: list) -> None:
    for fut, value in answers:
        fut.set_result(value)


def _slice_of(params: list, spec: ModelSpec, s: Slice) -> torch.Tensor:
    return params[spec.index_of(s.param)].detach().reshape(-1)[s.offset:s.offset + s.size].clone()


# ---------------------------------------------------------------------- this process's server

_server: Optional[Server] = None
_ready = Future()  # done once init_server built the server


def serve(server: Server) -> None:
    """Start answering trainers with ``server``, and watching them."""
    global _server
    _server = server
    server.watcher = threading.Thread(target=_watch, args=(server,), daemon=True, name="ps-watch")
    server.watcher.start()
    if not _ready.done():
        _ready.set_result(True)


def wait_finished(server: Server) -> None:
    """Return once every trainer stopped and left; a PsError once a trainer is gone or a call failed."""
    while not server.finished.wait(0.2):
        pass
    if server.failure is not None:
        raise transport.PsError(server.failure)
    # every ping is answered before this server's agent shuts down: an answer on its way to a closed
    # pipe is a TensorPipe warning in the trainer's log
    if server.watcher is not None:
        server.watcher.join(server.options.rpc.deadline_s + 1.0)


def _watch(server: Server) -> None:
    """Ping every trainer still training; one that is gone (or silent past the deadline) fails the server.
    A trainer that stopped gets no new ping; the ones on their way are waited for, also at the end."""
    pending: dict = {}
    while not server.finished.is_set():
        for t in range(server.env.trainers_num):
            fut = pending.get(t)
            if fut is None:
                if t not in server.stopped:
                    pending[t] = rpc.rpc_async(trainer_name(t), transport.ping, timeout=server.options.rpc.deadline_s)
            elif fut.done():
                del pending[t]
                try:
                    fut.wait()
                except Exception as e:
                    if t not in server.stopped:
                        server.fail(f"server {server.env.index}: {server.env.describe(trainer_name(t))} is gone "
                                    f"({transport.first_line(e)}); stopping.")
        time.sleep(PING_EVERY)
    for fut in pending.values():
        with suppress(Exception):
            fut.wait()


# ---------------------------------------------------------------------- called by trainers over RPC


@rpc.functions.async_execution
def ready() -> Future:
    return _ready


def pull(trainer: int) -> dict:
    with _server.lock:
        return _server.values(trainer)


@rpc.functions.async_execution
def push(trainer: int, dense: dict, sparse: dict) -> Future:
    return _server.push(trainer, dense, sparse)


def push_deltas(trainer: int, deltas: dict, rows: dict) -> tuple:
    return _server.add_deltas(trainer, deltas, rows)


def prefetch(table: str, local_ids: torch.Tensor) -> torch.Tensor:
    return _server.rows(table, local_ids)


def fetch_all() -> tuple:
    return _server.everything()


def stop(trainer: int) -> None:
    _server.stop(trainer)


def mark_saved(key: str) -> None:
    fut = _server.saved_future(key)
    if not fut.done():
        fut.set_result(True)


@rpc.functions.async_execution
def wait_saved(key: str) -> Future:
    return _server.saved_future(key)
