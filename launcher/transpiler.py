"""Paddle 1.8's DistributeTranspiler for eager PyTorch: the same script becomes a parameter server or a
trainer (mode "pserver"), or joins a collective group (mode "nccl2").

    config = DistributeTranspilerConfig()
    config.slice_var_up = False
    t = DistributeTranspiler(config=config)
    t.transpile(trainer_id, program=model, pservers="192.168.0.1:6174,192.168.0.2:6174", trainers=2,
                sync_mode=True, optimizer=optimizer)
    if role == "PSERVER":
        t.get_pserver_program(current_endpoint).run()        # serves until every trainer stopped
    else:
        program = t.get_trainer_program()                    # joins, takes the servers' parameters
        optimizer = program.optimizer                        # step() / minimize(loss) exchange with the servers
        ...
        program.save_persistables(dirname)                   # trainer 0 writes dirname/model.pt
        program.stop()

PyTorch has no program for the transpiler to rewrite: ``program`` is the model, and the optimizer
(which Paddle finds in the program's optimize ops) is given to ``transpile``. The server side and the
trainer side are launcher.ps, the same as fleet's parameter-server mode.
"""

from __future__ import annotations

import os
from typing import Optional

import torch

from launcher import envvars as ev
from launcher.ps.config import (ASYNC, GEO, HALF_ASYNC, SYNC, DistributeTranspilerConfig, HashName, PSDispatcher,
                                RoundRobin, check_min_block_size, options_from, split_method_name)
from launcher.ps.env import SERVER, TRAINER, make_ps_env
from launcher.ps.session import PsSession
from launcher.runtime.environment import env_from_endpoints, parse_endpoints
from launcher.runtime.flags import read_rpc_flags

__all__ = ["DistributeTranspiler", "DistributeTranspilerConfig", "HashName", "PSDispatcher", "PServerProgram",
           "RoundRobin", "TrainerProgram"]

PSERVER_MODE, NCCL2_MODE, COLLECTIVE_MODE = "pserver", "nccl2", "collective"
GRAD_ALLREDUCE = "grad_allreduce"  # the collective_mode that is nccl2's data parallelism


class PServerProgram:
    """A server's side: ``run(model_dir=None)`` takes this server's slices and rows, then serves until every trainer stopped."""

    def __init__(self, session: PsSession):
        self.session = session

    def run(self, model_dir: Optional[str] = None) -> None:
        self.session.init_server(model_dir)
        self.session.run_server()


class TrainerProgram:
    """A trainer's side, joined and holding the servers' parameters: ``optimizer``, ``save_persistables``, ``stop``."""

    def __init__(self, session: PsSession, optimizer, model: torch.nn.Module):
        self.session, self.optimizer, self.model = session, optimizer, model

    def save_persistables(self, dirname: str) -> str:
        """Trainer 0 writes the whole model's state_dict to ``dirname/model.pt``; the others wait for it."""
        return self.session.save(dirname, self.model)

    def stop(self) -> None:
        """Tell the servers this trainer is done (Paddle's exe.close() / fleet.stop_worker())."""
        self.session.stop_worker()


class DistributeTranspiler:
    def __init__(self, config: Optional[DistributeTranspilerConfig] = None):
        self.config = config if config is not None else DistributeTranspilerConfig()
        if self.config.split_method is None:
            self.config.split_method = RoundRobin  # as Paddle's __init__ does
        check_min_block_size(self.config.min_block_size)  # Paddle asserts both here
        split_method_name(self.config.split_method)
        self._plan = None

    def transpile(self, trainer_id: int, program: Optional[torch.nn.Module] = None, pservers: str = "127.0.0.1:6174",
                  trainers=1, sync_mode: bool = True, startup_program=None, current_endpoint: str = "127.0.0.1:6174",
                  optimizer: Optional[torch.optim.Optimizer] = None) -> None:
        """Plan the job (nothing starts until a program is asked for, except in nccl2 mode).

        pserver mode: ``program`` is the model, ``optimizer`` the torch optimizer over its parameters,
        ``pservers`` every server's ip:port, ``trainers`` their number; ``sync_mode=False`` is async
        (DC-ASGD with config.enable_dc_asgd), half-async with config.half_async, and
        config.geo_sgd_mode is geo. nccl2 mode: ``trainers`` is every trainer's ip:port; this one
        joins the collective group as fleet's collective mode does, takes trainer 0's parameters, and
        from then on every backward of ``program`` averages its gradients over the trainers (what
        Paddle's all-reduce ops do), so a plain optimizer trains data-parallel. Returns the ParallelEnv.
        """
        if self.config.mode == COLLECTIVE_MODE and self.config.collective_mode != GRAD_ALLREDUCE:
            raise ValueError(f"collective_mode={self.config.collective_mode!r}: mode='collective' runs "
                             f"collective_mode={GRAD_ALLREDUCE!r} here (nccl2's data parallelism); for local SGD use "
                             "fleet.distributed_optimizer with DistributedStrategy.use_local_sgd.")
        if self.config.mode in (NCCL2_MODE, COLLECTIVE_MODE):
            return self._collective(trainer_id, program, trainers, current_endpoint)
        if self.config.mode != PSERVER_MODE:
            raise ValueError(f"DistributeTranspilerConfig.mode={self.config.mode!r} must be 'pserver', 'nccl2' or 'collective'.")
        if not isinstance(program, torch.nn.Module) or not isinstance(optimizer, torch.optim.Optimizer):
            raise TypeError("transpile(trainer_id, program=model, pservers=..., trainers=N, optimizer=optimizer): PyTorch "
                            "has no program holding the optimizer, so pass the model and its torch optimizer.")
        if isinstance(trainers, str) or not isinstance(trainers, int) or trainers < 1:
            raise ValueError(f"trainers={trainers!r}: in pserver mode it is the number of trainers (a whole number of at least 1).")
        servers = parse_endpoints(pservers, "pservers")
        if not servers:
            raise ValueError("pservers is empty: give every server's ip:port, separated by commas.")
        self._plan = (trainer_id, program, servers, trainers, optimizer, self._mode(sync_mode))
        return None

    def get_pserver_program(self, endpoint: str) -> PServerProgram:
        """The server at ``endpoint`` (one of pservers), joined to the job."""
        trainer_id, model, servers, trainers, optimizer, mode = self._planned()
        if endpoint not in servers:
            raise ValueError(f"endpoint {endpoint!r} is not one of the pservers ({', '.join(servers)}).")
        session = self._join(SERVER, servers.index(endpoint), servers, trainers)
        session.distribute(optimizer, self._options(mode), model)
        return PServerProgram(session)

    def get_startup_program(self, endpoint: str = None, pserver_program=None, startup_program=None):
        """Paddle runs this before the pserver program; here the server program's run() does it all: None."""
        return None

    def get_trainer_program(self, wait_port: bool = True) -> TrainerProgram:
        """This trainer, joined to the job, holding the servers' parameters."""
        trainer_id, model, servers, trainers, optimizer, mode = self._planned()
        session = self._join(TRAINER, trainer_id, servers, trainers)
        wrapped = session.distribute(optimizer, self._options(mode), model)
        session.init_worker()
        return TrainerProgram(session, wrapped, model)

    # ------------------------------------------------------------------ helpers

    def _mode(self, sync_mode: bool) -> str:
        if self.config.geo_sgd_mode:
            return GEO
        if sync_mode:
            return SYNC
        return HALF_ASYNC if self.config.half_async else ASYNC

    def _options(self, mode: str):
        return options_from(self.config, mode, read_rpc_flags(os.environ))

    def _join(self, role: str, index: int, servers: tuple, trainers: int) -> PsSession:
        endpoints = parse_endpoints(os.environ.get(ev.TRAINER_ENDPOINTS, ""), ev.TRAINER_ENDPOINTS)
        env = make_ps_env(role, index, servers, trainers, endpoints if len(endpoints) == trainers else ())
        return PsSession.join(env, read_rpc_flags(os.environ))

    def _planned(self) -> tuple:
        if self._plan is None:
            raise RuntimeError("call transpile(...) in pserver mode before asking for a program.")
        return self._plan

    def _collective(self, trainer_id: int, model, trainers, current_endpoint: str):
        from launcher.fleet import state as st
        from launcher.runtime import init_parallel_env

        if not isinstance(model, torch.nn.Module):
            raise TypeError("transpile(trainer_id, program=model, trainers=..., current_endpoint=...): in nccl2 mode "
                            "pass the model as program (PyTorch has no default program), so that its backward "
                            "averages the gradients over the trainers as Paddle's all-reduce ops do.")
        if not isinstance(trainers, str):
            raise ValueError(f"trainers={trainers!r}: in nccl2 mode it is every trainer's ip:port, separated by commas.")
        endpoints = parse_endpoints(trainers, "trainers")
        env = env_from_endpoints(trainer_id, endpoints, os.environ.get(ev.SELECTED_GPUS) or None)
        if current_endpoint and endpoints[trainer_id] != current_endpoint.strip():
            raise ValueError(f"current_endpoint {current_endpoint!r} is not trainer {trainer_id}'s endpoint "
                             f"({endpoints[trainer_id]}) in trainers.")
        penv = init_parallel_env(env=env)
        st.set_current(st.make_state(penv, self._strategy()))
        _average_gradients_in_backward(model)
        return penv

    def _strategy(self):
        """The collective strategy of the config's nccl_comm_num and hierarchical all-reduce settings."""
        from launcher.fleet.strategy import DistributedStrategy

        strategy = DistributedStrategy()
        for name in ("nccl_comm_num", "use_hierarchical_allreduce", "hierarchical_allreduce_inter_nranks"):
            setattr(strategy, name, getattr(self.config, name))
        return strategy


def _average_gradients_in_backward(model: torch.nn.Module) -> None:
    """Trainer 0's parameters everywhere, and every backward averaging the gradients (fleet's GradientSync,
    with the strategy's defaults); fleet.distributed_optimizer on top does not average them again."""
    from launcher.fleet import state as st
    from launcher.fleet.comm import GradientSync, broadcast_parameters, check_same_parameters

    params = list(model.parameters())
    check_same_parameters("transpile (nccl2)", list(model.named_parameters()))
    broadcast_parameters(params)
    strategy, flags = st.strategy_in_force(None), st.read_flags()
    sync = GradientSync(params, st.bucket_limits(strategy, flags, ddp=False), st.channels_for(strategy), flags.sync_allreduce)
    for p in params:
        p._fleet_model_strategy = strategy  # as under fleet.distributed_model: someone else averages the gradients
    st.current().model, st.current().transpiled = model, sync
