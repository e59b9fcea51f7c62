"""fleet.distributed_optimizer: any torch optimizer, with gradients averaged over all ranks before each step."""

from __future__ import annotations

from typing import Optional

import torch
from torch.distributed.algorithms.model_averaging.averagers import PeriodicModelAverager

from launcher.fleet import state as st
from launcher.fleet.comm import GradientSync, broadcast_parameters
from launcher.fleet.strategy import DistributedStrategy


class DistributedOptimizer(torch.optim.Optimizer):
    """Wraps ``optimizer`` (as torch's PostLocalSGDOptimizer does): step() keeps every rank identical.

    Synchronous steps all-reduce the averaged gradients first (unless a fleet.distributed_model
    already did, during backward). With use_local_sgd, after local_sgd_is_warm_steps steps each rank
    steps on its own gradients and the parameters are averaged every local_sgd_steps steps.
    """

    def __init__(self, optimizer: torch.optim.Optimizer, strategy: DistributedStrategy, sync: GradientSync):
        self.optimizer = optimizer
        self.strategy = strategy
        self._sync = sync
        self._steps = 0
        self._averager = None
        if strategy.use_local_sgd:
            self._averager = PeriodicModelAverager(period=strategy.local_sgd_steps, warmup_steps=strategy.local_sgd_is_warm_steps)
            for p in self._params():
                p._fleet_averaged = True  # tells fleet.distributed_model that someone averages the parameters
        broadcast_parameters(self._params())

    # the wrapped optimizer's state, always the current objects (load_state_dict replaces them)
    @property
    def param_groups(self):
        return self.optimizer.param_groups

    @property
    def state(self):
        return self.optimizer.state

    @property
    def defaults(self):
        return self.optimizer.defaults

    def state_dict(self):
        return self.optimizer.state_dict()

    def load_state_dict(self, state_dict) -> None:
        self.optimizer.load_state_dict(state_dict)

    def add_param_group(self, param_group) -> None:
        raise NotImplementedError("add a parameter group before fleet.distributed_optimizer, so every rank buckets the same parameters.")

    def zero_grad(self, set_to_none: bool = True) -> None:
        self.optimizer.zero_grad(set_to_none=set_to_none)

    def step(self, closure=None):
        """Average the gradients (when this step is synchronous), step, average the parameters (local SGD)."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        if self._needs_gradient_sync():
            self._sync()
        self.optimizer.step()
        if self._averager is not None:
            self._averager.average_parameters(self.param_groups)
        self._steps += 1
        return loss

    def minimize(self, loss: torch.Tensor) -> torch.Tensor:
        """Paddle's minimize: zero the gradients, backward (sending gradients as they are ready), step."""
        self.zero_grad()
        if self._needs_gradient_sync():
            with self._sync.overlap():
                loss.backward()
        else:
            loss.backward()
        self.step()
        return loss

    def _params(self) -> list:
        return [p for group in self.param_groups for p in group["params"]]

    def _needs_gradient_sync(self) -> bool:
        if self.strategy.use_local_sgd and self._steps >= self.strategy.local_sgd_is_warm_steps:
            return False
        return not self._under_fleet_model()

    def _under_fleet_model(self) -> bool:
        marks = [getattr(p, "_fleet_model_strategy", None) for p in self._params()]
        if not any(marks):
            return False
        if not all(marks):
            raise ValueError("only some of this optimizer's parameters belong to a fleet.distributed_model; wrap the whole model.")
        if any(_local_sgd_of(m) != _local_sgd_of(self.strategy) for m in marks):
            raise ValueError("fleet.distributed_model and fleet.distributed_optimizer were given different local SGD "
                             "settings; pass the same DistributedStrategy to both.")
        return True


def _local_sgd_of(strategy: DistributedStrategy) -> tuple:
    if not strategy.use_local_sgd:
        return (False,)
    return (True, strategy.local_sgd_steps, strategy.local_sgd_is_warm_steps)


def distributed_optimizer(optimizer: torch.optim.Optimizer, strategy: Optional[DistributedStrategy] = None) -> DistributedOptimizer:
    """``optimizer`` made distributed; every rank's parameters become rank 0's at once."""
    if isinstance(optimizer, DistributedOptimizer):
        raise ValueError("this optimizer is already a fleet.distributed_optimizer.")
    strategy = st.strategy_in_force(strategy)
    params = [p for group in optimizer.param_groups for p in group["params"]]
    flags = st.read_flags()
    limits = st.bucket_limits(strategy, flags, ddp=False)
    sync = GradientSync(params, limits, st.channels_for(strategy), flags.sync_allreduce)
    return DistributedOptimizer(optimizer, strategy, sync)
