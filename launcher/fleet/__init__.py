"""Fleet on PyTorch: the four changes that turn a one-card script into a multi-card one (seeds 2.3).

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
from launcher.fleet.checkpoint import load_persistables, save_persistables
from launcher.fleet.model import distributed_model
from launcher.fleet.optimizer import DistributedOptimizer, distributed_optimizer
from launcher.fleet.strategy import DistributedStrategy, ExecutionStrategy
from launcher.runtime import ParallelEnv, init_parallel_env
from launcher.runtime.parallel import DEFAULT_TIMEOUT


def init(role_maker: Optional[RoleMakerBase] = None, is_collective: bool = True,
         strategy: Optional[DistributedStrategy] = None, timeout: Union[float, timedelta] = DEFAULT_TIMEOUT) -> ParallelEnv:
    """Join the job described by ``role_maker`` (default: the launcher's variables); returns where we are."""
    if not is_collective:
        raise ValueError(NO_PARAMETER_SERVER)
    role = role_maker or PaddleCloudRoleMaker(is_collective=True)
    penv = init_parallel_env(timeout=timeout, env=role.worker_env())
    _st.set_current(_st.make_state(penv, strategy))
    return penv



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
    "is_first_worker",
    "load_persistables",
    "parallel_env",
    "role_maker",
    "save_persistables",
    "worker_endpoints",
    "worker_index",
    "worker_num",
]
