"""Fleet on PyTorch: Paddle 1.8's four changes that turn a one-card script into a multi-card one.

    from launcher import fleet                                        # 1. import
    strategy = fleet.DistributedStrategy()                            # 2. strategy and role
    fleet.init(fleet.role_maker.PaddleCloudRoleMaker(is_collective=True))
    optimizer = fleet.distributed_optimizer(optimizer, strategy)      # 3. wrap the optimizer
    fleet.save_persistables(model_path, model, optimizer)             # 4. distributed save
"""

from __future__ import annotations

from datetime import timedelta
from typing import Optional, Union

from launcher.fleet import role_maker
from launcher.fleet.role_maker import NO_PARAMETER_SERVER, PaddleCloudRoleMaker, RoleMakerBase
from launcher.fleet import state as _st
from launcher.fleet.checkpoint import load_persistables, save_inference_model, save_persistables
from launcher.fleet.model import distributed_model
from launcher.fleet.optimizer import DistributedOptimizer, distributed_optimizer
from launcher.fleet.strategy import DistributedStrategy, ExecutionStrategy
from launcher.runtime import ParallelEnv, init_parallel_env


def init(role_maker: Optional[RoleMakerBase] = None, is_collective: bool = True,
         strategy: Optional[DistributedStrategy] = None, timeout: Union[None, float, timedelta] = None) -> ParallelEnv:
    """Join the job described by ``role_maker`` (default: the launcher's variables); returns where we are.

    ``timeout`` (seconds) bounds the rendezvous and every collective (see init_parallel_env).
    """
    if not is_collective:
        raise ValueError(NO_PARAMETER_SERVER)
    role = role_maker or PaddleCloudRoleMaker(is_collective=True)
    penv = init_parallel_env(timeout=timeout, env=role.worker_env())
    _st.set_current(_st.make_state(penv, strategy))
    return penv


def init_worker() -> None:
    """Nothing to do in collective mode (Paddle starts parameter-server communicators here)."""


def stop_worker() -> None:
    """Nothing to do in collective mode: the process group is torn down when the process exits."""


_STATIC_PROGRAMS = {
    "main_program": "fleet.main_program is Paddle's static program, which PyTorch does not have: the model is the "
                    "program, so run model(x) and optimizer.minimize(loss) in the training loop instead of exe.run(program).",
    "startup_program": "fleet.startup_program is Paddle's static start-up program, which PyTorch does not have: the "
                       "parameters are initialised when the model is built, so drop exe.run(startup_program).",
}


def __getattr__(name: str):
    if name in _STATIC_PROGRAMS:
        raise AttributeError(_STATIC_PROGRAMS[name])
    raise AttributeError(f"module 'launcher.fleet' has no attribute {name!r}")


def worker_index() -> int:
    return _st.current().penv.rank


def worker_num() -> int:
    return _st.current().penv.world_size


def is_first_worker() -> bool:
    return worker_index() == 0


def worker_endpoints() -> list:
    return list(_st.current().penv.endpoints)


def barrier_worker() -> None:
    """Wait until every worker gets here."""
    _st.barrier()


def parallel_env() -> ParallelEnv:
    """Rank, world size, local rank, device, backend and endpoints of this worker."""
    return _st.current().penv


__all__ = [
    "DistributedOptimizer",
    "DistributedStrategy",
    "ExecutionStrategy",
    "barrier_worker",
    "distributed_model",
    "distributed_optimizer",
    "init",
    "init_worker",
    "is_first_worker",
    "load_persistables",
    "parallel_env",
    "role_maker",
    "save_inference_model",
    "save_persistables",
    "stop_worker",
    "worker_endpoints",
    "worker_index",
    "worker_num",
]
