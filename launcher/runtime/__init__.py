"""The worker-side runtime: join the job the launcher started (the only part that imports torch).

    from launcher.runtime import init_parallel_env
    penv = init_parallel_env()   # rank, world_size, local_rank, device, backend, endpoints
"""

from launcher.runtime.environment import WorkerEnv, WorkerEnvError, choose_backend, read_worker_env
from launcher.runtime.flags import FleetWarning
from launcher.runtime.parallel import ParallelEnv, RendezvousError, init_parallel_env, reset

__all__ = [
    "FleetWarning",
    "ParallelEnv",
    "RendezvousError",
    "WorkerEnv",
    "WorkerEnvError",
    "choose_backend",
    "init_parallel_env",
    "read_worker_env",
    "reset",
]
