"""The worker-side runtime: join the job the launcher started (the only part that imports torch), and tell the
launcher how far the worker got.

    from launcher.runtime import init_parallel_env, report
    penv = init_parallel_env()   # rank, world_size, local_rank, device, backend, endpoints
    report(step=step, loss=loss.item())
    ddp.register_comm_hook(None, timed_allreduce_hook)   # each step's wait for the other ranks, counted

``report`` (launcher.runtime.progress) imports no torch; the rest is imported when first used.
"""

from importlib import import_module

from launcher.runtime.environment import WorkerEnv, WorkerEnvError, choose_backend, read_worker_env
from launcher.runtime.flags import FleetWarning
from launcher.runtime.progress import report
from launcher.runtime.timing import waited

_FROM_PARALLEL = ("ParallelEnv", "RendezvousError", "init_parallel_env", "reset")  # these import torch
_FROM_HOOKS = ("timed_allreduce_hook",)


def __getattr__(name: str):
    if name in _FROM_PARALLEL:
        return getattr(import_module("launcher.runtime.parallel"), name)
    if name in _FROM_HOOKS:
        return getattr(import_module("launcher.runtime.hooks"), name)
    raise AttributeError(f"module 'launcher.runtime' has no attribute {name!r}")


__all__ = [
    "FleetWarning",
    "ParallelEnv",
    "RendezvousError",
    "WorkerEnv",
    "WorkerEnvError",
    "choose_backend",
    "init_parallel_env",
    "read_worker_env",
    "report",
    "reset",
    "timed_allreduce_hook",
    "waited",
]
