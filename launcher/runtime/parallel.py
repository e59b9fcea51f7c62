"""Join the job: rendezvous at rank 0's store, then torch.distributed with NCCL or gloo."""

from __future__ import annotations

import atexit
import os
from dataclasses import dataclass
from datetime import timedelta
from typing import Optional, Union

import torch
import torch.distributed as dist

from launcher.runtime.environment import WorkerEnv, choose_backend, gpu_index, read_worker_env
from launcher import envvars as ev
from launcher.runtime.flags import apply_flags, read_flags, warn_once

DEFAULT_TIMEOUT = timedelta(minutes=5)
_ARRIVED = "launcher/arrived/"


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


def init_parallel_env(
    backend: Optional[str] = None,
    timeout: Union[float, timedelta] = DEFAULT_TIMEOUT,
    env: Optional[WorkerEnv] = None,
) -> ParallelEnv:
    """Initialise torch.distributed from the launcher's variables (or ``env``); a world of one without them.

    Fails after ``timeout`` (seconds or timedelta) naming the ranks that never arrived.
    """
    env = env or read_worker_env(os.environ)
    timeout = timeout if isinstance(timeout, timedelta) else timedelta(seconds=timeout)
    if env.selected_gpus and not torch.cuda.is_available():
        warn_once(ev.SELECTED_GPUS, f"{ev.SELECTED_GPUS}={env.selected_gpus} is set, but this PyTorch sees no CUDA device: "
                  "the worker runs on the CPU with gloo.")
    backend = choose_backend(env.selected_gpus, torch.cuda.is_available(), backend)
    device = _device(env, backend)
    apply_flags(read_flags(os.environ), backend, device)
    if not dist.is_initialized():
        store = dist.HashStore() if env.alone else rendezvous(env, timeout)
        dist.init_process_group(backend, store=dist.PrefixStore("pg/", store), rank=env.rank, world_size=env.world_size)
        atexit.register(_destroy)
    elif (dist.get_rank(), dist.get_world_size()) != (env.rank, env.world_size):
        raise RuntimeError(f"torch.distributed is already set up as rank {dist.get_rank()} of {dist.get_world_size()}, "
                           f"not rank {env.rank} of {env.world_size} as the launcher says.")
    return ParallelEnv(env.rank, env.world_size, env.local_rank, env.local_world_size, env.node_rank,
                       env.node_count, device, dist.get_backend(), env.endpoints)


def rendezvous(env: WorkerEnv, timeout: timedelta) -> dist.Store:
    """Meet every rank at rank 0's TCPStore; name the ones missing after ``timeout``."""
    where = f"{env.master_addr}:{env.master_port}"
    try:
        store = dist.TCPStore(env.master_addr, env.master_port, env.world_size, env.rank == 0,
                              timeout=timeout, wait_for_workers=False)
    except Exception as e:  # torch raises several types (DistNetworkError, DistStoreError, RuntimeError)
        if env.rank == 0:
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


def _destroy() -> None:
    """Release the communicators at exit (NCCL complains when a process group is left to the destructor)."""
    if dist.is_initialized():
        dist.destroy_process_group()


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
