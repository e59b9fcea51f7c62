"""Fleet on PyTorch: Paddle 1.8's four changes that turn a one-card script into a multi-card one.

    from launcher import fleet                                        # 1. import
    strategy = fleet.DistributedStrategy()                            # 2. strategy and role
    fleet.init(fleet.role_maker.PaddleCloudRoleMaker(is_collective=True))
    optimizer = fleet.distributed_optimizer(optimizer, strategy)      # 3. wrap the optimizer
    fleet.save_persistables(model_path, model, optimizer)             # 4. distributed save

An elastic job whose workers keep their processes at a membership change: ``fleet.elastic_run(train, state)``
instead of ``fleet.init`` (launcher.fleet.elastic).

Parameter-server mode (docs/parameter-servers.md):

    fleet.init(fleet.role_maker.PaddleCloudRoleMaker(is_collective=False))
    optimizer = fleet.distributed_optimizer(optimizer, fleet.StrategyFactory.create_sync_strategy())
    if fleet.is_server():
        fleet.init_server(); fleet.run_server()
    else:
        fleet.init_worker(); ...optimizer.minimize(loss)...; fleet.stop_worker()
"""

from __future__ import annotations

import os
from datetime import timedelta
from typing import Optional, Union

import torch

from launcher.fleet import role_maker
from launcher.fleet.role_maker import PaddleCloudRoleMaker, RoleMakerBase
from launcher.fleet import ps_mode as _ps
from launcher.fleet import state as _st
from launcher.fleet import checkpoint as _checkpoint
from launcher.fleet.checkpoint import load_persistables, save_inference_model
from launcher.fleet.elastic import elastic_run
from launcher.fleet.model import distributed_model
from launcher.fleet import optimizer as _collective
from launcher.fleet.optimizer import DistributedOptimizer
from launcher.fleet.strategy import DistributedStrategy, ExecutionStrategy
from launcher.ps.config import DistributeTranspilerConfig, PsStrategy, StrategyFactory
from launcher.ps.transport import PsError
from launcher.runtime import ParallelEnv, init_parallel_env


def init(role_maker: Optional[RoleMakerBase] = None, is_collective: bool = True,
         strategy: Optional[DistributedStrategy] = None, timeout: Union[None, float, timedelta] = None):
    """Join the job described by ``role_maker`` (default: the launcher's variables); returns where we are.

    Collective: a ParallelEnv; ``timeout`` (seconds) bounds the rendezvous and every collective (see
    init_parallel_env). Parameter-server mode (a role maker made with is_collective=False, or
    is_collective=False): a launcher.ps PsEnv, once every server and trainer joined the RPC world
    (bounded by FLAGS_rpc_deadline).
    """
    role = role_maker or PaddleCloudRoleMaker(is_collective=is_collective)
    in_round = _st.round_in_force()
    if in_round is not None and role.is_collective:  # under fleet.elastic_run, which joined the round
        in_round.strategy = strategy or in_round.strategy
        return in_round.penv
    if not role.is_collective:
        return _ps.init(role, strategy)
    penv = init_parallel_env(timeout=timeout, env=role.worker_env())
    _st.set_current(_st.make_state(penv, strategy))
    return penv


def distributed_optimizer(optimizer, strategy=None, model=None):
    """Collective: see launcher.fleet.optimizer.distributed_optimizer. Parameter-server mode: the
    optimizer's parameters placed on the servers, ``strategy`` from fleet.StrategyFactory; ``model``
    (optional) names the parameters, which are otherwise found from the optimizer."""
    if _st.ps_session() is not None:
        return _ps.distributed_optimizer(optimizer, strategy, model)
    if model is not None:
        raise TypeError("distributed_optimizer(model=...) is for parameter-server mode; drop it in collective mode.")
    return _collective.distributed_optimizer(optimizer, strategy)


def init_worker() -> None:
    """Parameter-server mode: wait for the servers and take their parameters. Collective: nothing to do."""
    if _st.ps_session() is not None:
        _st.ps_session().init_worker()


def stop_worker() -> None:
    """Parameter-server mode: finish the sends in flight and tell the servers this trainer is done.
    Collective: nothing to do (the process group is torn down when the process exits)."""
    if _st.ps_session() is not None:
        _st.ps_session().stop_worker()


def init_server(model_dir: Optional[str] = None) -> None:
    """Parameter-server mode, on a server: take its slices of the model (from ``model_dir/model.pt`` when given)."""
    _ps_only("init_server").init_server(model_dir)


def run_server() -> None:
    """Parameter-server mode, on a server: serve until every trainer called stop_worker."""
    _ps_only("run_server").run_server()


def is_server() -> bool:
    session = _st.ps_session()
    return session is not None and session.env.is_server


def is_worker() -> bool:
    return not is_server()


def server_index() -> int:
    session = _ps_only("server_index")
    return session.env.index if session.env.is_server else 0


def server_num() -> int:
    session = _st.ps_session()
    return 0 if session is None else len(session.env.servers)


def server_endpoints() -> list:
    session = _st.ps_session()
    return [] if session is None else list(session.env.servers)


def save_persistables(where, *args, **kwargs) -> None:
    """Collective: see launcher.fleet.checkpoint.save_persistables. Parameter-server mode, on the trainers:
    ``save_persistables(dirname, model)``: trainer 0 gathers the servers' slices and rows and writes the
    whole model's state_dict to ``dirname/model.pt``; the other trainers return once it is written."""
    session = _st.ps_session()
    if session is None:
        return _checkpoint.save_persistables(where, *args, **kwargs)
    model = args[0] if args else kwargs.get("model")
    if not isinstance(where, (str, os.PathLike)) or not isinstance(model, torch.nn.Module):
        raise TypeError("in parameter-server mode write fleet.save_persistables(dirname, model) on the trainers.")
    session.save(where, model)


def _ps_only(call: str):
    session = _st.ps_session()
    if session is None:
        raise RuntimeError(f"fleet.{call}() is for parameter-server mode: fleet.init(PaddleCloudRoleMaker(is_collective=False)) "
                           "under python -m launcher --server_num S --worker_num T.")
    return session


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
    session = _st.ps_session()
    return _st.current().penv.rank if session is None else session.env.index


def worker_num() -> int:
    session = _st.ps_session()
    return _st.current().penv.world_size if session is None else session.env.trainers_num


def is_first_worker() -> bool:
    return worker_index() == 0


def worker_endpoints() -> list:
    session = _st.ps_session()
    return list(_st.current().penv.endpoints if session is None else session.env.trainer_endpoints)


def barrier_worker() -> None:
    """Wait until every worker gets here (collective mode)."""
    if _st.ps_session() is not None:
        raise RuntimeError("fleet.barrier_worker() is for collective mode; in parameter-server mode the servers "
                           "order the trainers (a sync strategy steps them together).")
    _st.barrier()


def parallel_env() -> ParallelEnv:
    """Rank, world size, local rank, device, backend and endpoints of this worker."""
    return _st.current().penv


__all__ = [
    "DistributeTranspilerConfig",
    "DistributedOptimizer",
    "DistributedStrategy",
    "ExecutionStrategy",
    "PsError",
    "PsStrategy",
    "StrategyFactory",
    "barrier_worker",
    "distributed_model",
    "distributed_optimizer",
    "elastic_run",
    "init",
    "init_server",
    "init_worker",
    "is_first_worker",
    "is_server",
    "is_worker",
    "load_persistables",
    "parallel_env",
    "role_maker",
    "run_server",
    "save_inference_model",
    "save_persistables",
    "server_endpoints",
    "server_index",
    "server_num",
    "stop_worker",
    "worker_endpoints",
    "worker_index",
    "worker_num",
]
