"""Join the job: rendezvous at rank 0's store, then torch.distributed with NCCL or gloo; leave it cleanly at exit.

What this module sets up for the process (the store, the process group) lives in one ``Job`` record,
which ``reset`` clears, so tests and re-initialisation start from nothing.
"""

from __future__ import annotations

import atexit
import os
import sys
import types
from contextlib import suppress
from dataclasses import dataclass
from datetime import timedelta
from typing import Optional, Union

import torch
import torch.distributed as dist

from launcher.runtime.environment import WorkerEnv, choose_backend, gpu_index, read_worker_env
from launcher import envvars as ev
from launcher.runtime.flags import apply_flags, read_flags, reset_warnings, warn_once

DEFAULT_TIMEOUT = timedelta(minutes=5)  # the rendezvous, when fleet.init / init_parallel_env is given no timeout
EXIT_WAIT = timedelta(seconds=10)  # the longest a leaving rank waits for the others (a rank calling sys.exit(1) waits too)
_ARRIVED = "launcher/arrived/"
_LEFT = "launcher/left/"


class RendezvousError(RuntimeError):
    """Some ranks did not arrive in time; the message names them and their endpoints."""


@dataclass(frozen=True)
class ParallelEnv:
    """What ``init_parallel_env`` set up for this worker."""

    rank: int
    world_size: int
    local_rank: int
    local_world_size: int
    node_rank: int
    node_count: int
    device: torch.device
    backend: str
    endpoints: tuple


@dataclass
class Job:
    """What this process created to join the job, torn down at exit."""

    store: dist.Store
    rank: int
    world_size: int
    timeout: timedelta  # the rendezvous's; also bounds the waits for rank 0's saves and, with EXIT_WAIT, the one at exit


_job: Optional[Job] = None


def current_job() -> Optional[Job]:
    """The store and timeout of the job this process joined, or None before init_parallel_env."""
    return _job


def init_parallel_env(
    backend: Optional[str] = None,
    timeout: Union[None, float, timedelta] = None,
    env: Optional[WorkerEnv] = None,
) -> ParallelEnv:
    """Initialise torch.distributed from the launcher's variables (or ``env``); a world of one without them.

    ``timeout`` (seconds or timedelta) bounds the rendezvous, which then names the ranks that never
    arrived, and every collective of the process group. None: 5 minutes for the rendezvous, torch's
    own default for collectives (30 minutes with gloo, 10 with NCCL).
    """
    global _job
    env = env or read_worker_env(os.environ)
    pg_timeout = _as_timedelta(timeout)
    timeout = pg_timeout or DEFAULT_TIMEOUT
    if env.selected_gpus and not torch.cuda.is_available():
        warn_once(ev.SELECTED_GPUS, f"{ev.SELECTED_GPUS}={env.selected_gpus} is set, but this PyTorch sees no CUDA device: "
                  "the worker runs on the CPU with gloo.")
    backend = choose_backend(env.selected_gpus, torch.cuda.is_available(), backend)
    device = _device(env, backend)
    apply_flags(read_flags(os.environ), backend, device)
    if not dist.is_initialized():
        store = dist.HashStore() if env.alone else rendezvous(env, timeout)
        dist.init_process_group(backend, store=dist.PrefixStore("pg/", store), rank=env.rank, world_size=env.world_size,
                                timeout=pg_timeout)
        atexit.unregister(teardown)  # once, also after a reset
        atexit.register(teardown)
        note_exit_code()
        _job = Job(store, env.rank, env.world_size, timeout)
    elif (dist.get_rank(), dist.get_world_size()) != (env.rank, env.world_size):
        raise RuntimeError(f"torch.distributed is already set up as rank {dist.get_rank()} of {dist.get_world_size()}, "
                           f"not rank {env.rank} of {env.world_size} as the launcher says.")
    return ParallelEnv(env.rank, env.world_size, env.local_rank, env.local_world_size, env.node_rank,
                       env.node_count, device, dist.get_backend(), env.endpoints)


def rendezvous(env: WorkerEnv, timeout: timedelta) -> dist.Store:
    """Meet every rank at rank 0's TCPStore (the launcher's, with ``env.agent_store``); name the ones missing
    after ``timeout``."""
    where = f"{env.master_addr}:{env.master_port}"
    hosts = env.rank == 0 and not env.agent_store
    try:
        store = dist.TCPStore(env.master_addr, env.master_port, env.world_size, hosts,
                              timeout=timeout, wait_for_workers=False)
    except Exception as e:  # torch raises several types (DistNetworkError, DistStoreError, RuntimeError)
        if hosts:
            raise RendezvousError(f"rank 0 could not host the store at {where}: {e}") from e
        raise RendezvousError(f"rank {env.rank} waited {timeout.total_seconds():g} s for rank 0's store at {where}; "
                              f"missing: rank 0 ({env.endpoint_of(0)}).") from e
    store.set(f"{_ARRIVED}{env.rank}", str(os.getpid()))
    try:
        store.wait([f"{_ARRIVED}{r}" for r in range(env.world_size)], timeout)
    except Exception as e:
        missing = [r for r in range(env.world_size) if not _arrived(store, r)]
        if not missing:
            raise
        names = ", ".join(f"rank {r} ({env.endpoint_of(r)})" for r in missing)
        raise RendezvousError(f"rank {env.rank} waited {timeout.total_seconds():g} s for all {env.world_size} ranks "
                              f"at {where}; missing: {names}.") from e
    return store


def teardown() -> None:
    """Leave the job (at exit): wait for the other ranks to get here too, then destroy every process group.

    The groups are destroyed while the interpreter is still whole, so no communication thread is
    left holding tensors when Python shuts down, and no rank closes its connections (or, rank 0, the
    store) while another still uses them. The wait is bounded (EXIT_WAIT, or the job's timeout when
    shorter), and skipped by a rank that leaves on an uncaught exception: the launcher stops the job
    then anyway.
    """
    global _job
    job, _job = _job, None
    if job is None or not dist.is_initialized():  # nothing of ours (a group the script made is the script's)
        return
    code = exit_code()
    if code not in (None, 0):
        leave_now(code)
    if job.world_size > 1:
        _meet(job)
    world = dist.group.WORLD
    dist.destroy_process_group()
    release_captured(world)


def release_captured(group) -> None:
    """Let go of ``group`` where torch modules imported after it was made still hold it.

    Some take the default group as a default argument when they are imported (the functions of
    torch.distributed.nn.functional, which torch.optim's first optimizer imports via torch._dynamo,
    ZeroRedundancyOptimizer, ShardedGradScaler: ``group=group.WORLD``). Those references kept the
    destroyed group, its gloo threads and rank 0's store alive into the interpreter's shutdown,
    where they were torn down in no set order, while the other ranks might still be connected:
    now and then ``terminate called without an active exception`` (SIGABRT, exit 134) after a clean
    run. None, what they hold when imported before the group exists, is put back.
    """
    for name, module in list(sys.modules.items()):
        if name.startswith("torch.distributed") and module is not None:
            for function in _functions_of(module):
                _drop_default(function, group)


def _functions_of(module):
    """The functions of ``module`` and of its classes, and the ones they wrap (type() only: some
    values of torch.distributed warn when looked at)."""
    for value in list(vars(module).values()):
        if issubclass(type(value), type) and value.__module__ == module.__name__:
            yield from _plain_functions(vars(value).values())
        else:
            yield from _plain_functions([value])


def _plain_functions(values):
    for value in values:
        if type(value) in (staticmethod, classmethod):
            value = value.__func__
        while type(value) is types.FunctionType:
            yield value
            value = getattr(value, "__wrapped__", None)


def _drop_default(function, group) -> None:
    if function.__defaults__ and any(d is group for d in function.__defaults__):
        function.__defaults__ = tuple(None if d is group else d for d in function.__defaults__)
    if function.__kwdefaults__ and any(d is group for d in function.__kwdefaults__.values()):
        function.__kwdefaults__ = {k: None if d is group else d for k, d in function.__kwdefaults__.items()}


def leave_now(code) -> None:
    """Leaving on a failure (an uncaught exception, whose traceback is printed by now, or
    ``sys.exit`` with a non-zero code): exit with that code at once, without waiting for the other
    ranks and without the rest of the shutdown. The other ranks may still be talking to this one:
    gloo's threads could then abort the process (SIGABRT, exit 134) while the interpreter and torch's
    C++ objects are torn down, and a wait would let their errors reach the launcher before this
    rank's own code. The launcher stops the other ranks anyway."""
    import logging

    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        with suppress(Exception):
            stream.flush()
    if not isinstance(code, int):  # sys.exit("message") printed the message: its code is 1
        code = 1
    os._exit(code & 0xFF)


_exit_code: dict = {}  # the code given to sys.exit, once the script calls it


def note_exit_code() -> None:
    """Wrap ``sys.exit`` so that the exit code is known at exit (Python does not tell atexit)."""
    real = sys.exit
    if getattr(real, "_launcher_wrapper", False):
        return

    def exit(code=None):
        _exit_code["code"] = code
        real(code)

    exit._launcher_wrapper = True
    exit.__doc__ = real.__doc__
    sys.exit = exit


def exit_code():
    """The code this process leaves with, as known at exit: 1 after an uncaught exception (Python's code
    for it), else what the script gave sys.exit, else None."""
    if getattr(sys, "last_value", None) is not None:
        return 1
    return _exit_code.get("code")


def reset() -> None:
    """Forget everything this package holds for the process: the job (torn down as at exit) and the warnings given."""
    teardown()
    reset_warnings()


def _meet(job: Job) -> None:
    """Say this rank is leaving, then wait (bounded) until every rank has said so."""
    with suppress(Exception):  # a rank is still busy or gone, or rank 0's store is: leave all the same
        job.store.set(f"{_LEFT}{job.rank}", "1")
        job.store.wait([f"{_LEFT}{r}" for r in range(job.world_size)], min(job.timeout, EXIT_WAIT))


def _as_timedelta(timeout: Union[None, float, timedelta]) -> Optional[timedelta]:
    if timeout is None or isinstance(timeout, timedelta):
        return timeout
    return timedelta(seconds=timeout)


def _arrived(store: dist.Store, rank: int) -> bool:
    try:
        return store.check([f"{_ARRIVED}{rank}"])
    except Exception:  # the store itself went away: nobody can be seen
        return False


def _device(env: WorkerEnv, backend: str) -> torch.device:
    index = gpu_index(env.selected_gpus)
    if backend != "nccl" or index is None:
        return torch.device("cpu")
    torch.cuda.set_device(index)
    return torch.device("cuda", index)
