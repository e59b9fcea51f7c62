"""fleet's calls in parameter-server mode (fleet.init with a role maker made with is_collective=False)."""

from __future__ import annotations

import os
from typing import Optional

import torch

from launcher.fleet import state as st
from launcher.ps.config import PsStrategy, StrategyFactory
from launcher.ps.env import PsEnv
from launcher.runtime.flags import read_rpc_flags


def init(role_maker, strategy) -> PsEnv:
    """Join the job's RPC world (every server and trainer meet at server 0's endpoint)."""
    from launcher.ps.session import PsSession  # launcher.ps uses fleet's optimizer wrapper: import when needed

    env = role_maker.ps_env()
    flags = read_rpc_flags(os.environ)
    st.set_current(st.FleetState(None, strategy, ps=PsSession.join(env, flags)))
    return env


def distributed_optimizer(optimizer: torch.optim.Optimizer, strategy=None, model: Optional[torch.nn.Module] = None):
    """``optimizer`` on the servers (called with the same model on every server and trainer)."""
    state = st.current()
    strategy = strategy if strategy is not None else state.strategy
    if strategy is None:
        strategy = StrategyFactory.create_sync_strategy()
    if not isinstance(strategy, PsStrategy):
        raise TypeError(f"parameter-server mode takes a strategy from fleet.StrategyFactory (e.g. "
                        f"create_async_strategy()), not {type(strategy).__name__}.")
    state.strategy = strategy
    wrapped = state.ps.distribute(optimizer, strategy.options(read_rpc_flags(os.environ)), model)
    state.optimizer = wrapped
    return wrapped
