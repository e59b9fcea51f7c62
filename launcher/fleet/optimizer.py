"""fleet.distributed_optimizer: any torch optimizer, with gradients averaged over all ranks before each step."""

from __future__ import annotations

import contextlib
import warnings
from typing import Optional

import torch
from torch.distributed.algorithms.model_averaging.averagers import PeriodicModelAverager

from launcher.fleet import state as st
from launcher.fleet.comm import GradientSync, broadcast_parameters, check_same_parameters, refuse_unfrozen
from launcher.fleet.strategy import DistributedStrategy
from launcher.runtime.flags import warn_once


class WrappedOptimizer(torch.optim.Optimizer):
    """An optimizer standing in for ``self.optimizer``: its groups, state and state_dict are the wrapped one's."""

    optimizer: torch.optim.Optimizer

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

    def minimize(self, loss: torch.Tensor, startup_program=None, parameter_list=None, no_grad_set=None) -> torch.Tensor:
        """Paddle's minimize: zero the gradients, backward, step.

        ``parameter_list`` (default: all) and ``no_grad_set`` are tensors: only the parameters in the
        first and not in the second get gradients, and so move. ``startup_program`` has no meaning here.
        """
        if startup_program is not None:
            warn_once("startup_program", "minimize(loss, startup_program): PyTorch has no startup program, the parameters "
                      "are initialised when the model is built; the argument is ignored.")
        inputs = backward_inputs(self._params(), parameter_list, no_grad_set)
        self.zero_grad()
        loss.backward(inputs=inputs)
        self.step()
        return loss

    def _params(self) -> list:
        return [p for group in self.param_groups for p in group["params"]]


def closure_loss(closure):
    """torch.optim's step(closure): the loss the closure computes (with gradients enabled), or None."""
    if closure is None:
        return None
    with torch.enable_grad():
        return closure()


class DistributedOptimizer(WrappedOptimizer):
    """Wraps ``optimizer`` (as torch's PostLocalSGDOptimizer does): step() keeps every rank identical.

    Backward averages the gradients over all ranks (as DistributedDataParallel does, unless a
    fleet.distributed_model already does it), so clipping and GradScaler between backward and step()
    see the averages; step() averages gradients that no backward did. With use_local_sgd, as Paddle
    1.8's LocalSGD program, no gradient is averaged: each rank steps on its own, and the parameters are
    averaged after the step at each of the first local_sgd_is_warm_steps steps, then every
    local_sgd_steps steps.
    """

    def __init__(self, optimizer: torch.optim.Optimizer, strategy: DistributedStrategy, sync: GradientSync):
        self.optimizer = optimizer
        self.strategy = strategy
        self._sync = sync
        sync.enabled = self._needs_gradient_sync
        self._steps = 0
        self._averager = None
        if strategy.use_local_sgd:
            with warnings.catch_warnings():  # torch's "when period is 1, use DDP": averaging is due when step() says
                warnings.filterwarnings("ignore", message="When period is 1", category=UserWarning)
                self._averager = PeriodicModelAverager(period=1, warmup_steps=0)
            for p in self._params():
                p._fleet_averaged = True  # tells fleet.distributed_model that someone averages the parameters
        broadcast_parameters(self._params())

    def zero_grad(self, set_to_none: bool = True) -> None:
        self._sync.synced = False  # a rank whose next backward touches no parameter still averages at step()
        self.optimizer.zero_grad(set_to_none=set_to_none)

    def step(self, closure=None):
        """Average the gradients (when this step is synchronous), step, average the parameters (local SGD)."""
        loss = closure_loss(closure)
        if self._sync.frozen and self._needs_gradient_sync():
            refuse_unfrozen("fleet.distributed_optimizer", [(f"parameter {i} of the optimizer", p) for i, p in self._sync.frozen],
                            "set requires_grad before fleet.distributed_optimizer (a frozen parameter with no gradient "
                            "is left alone), or wrap the optimizer again after unfreezing")
        if not self._sync.synced and self._needs_gradient_sync():
            self._sync()
        self._sync.synced = False
        self.optimizer.step()
        if self._averager is not None and averaging_due(self._steps, self.strategy):
            self._averager.average_parameters(self.param_groups)
        self._steps += 1
        return loss

    @contextlib.contextmanager
    def no_sync(self):
        """Backward passes inside this block keep their gradients local (gradient accumulation, as DDP's no_sync)."""
        with self._sync.paused():
            yield

    def _needs_gradient_sync(self) -> bool:
        under_model = self._under_fleet_model()  # checked first: it refuses a model with other local SGD settings
        return not self.strategy.use_local_sgd and not under_model

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


def averaging_due(step: int, strategy: DistributedStrategy) -> bool:
    """Local SGD averages the parameters after step ``step`` (from 0): each warm-up step, then every local_sgd_steps."""
    warm = strategy.local_sgd_is_warm_steps
    return step < warm or (step - warm) % strategy.local_sgd_steps == 0


def _local_sgd_of(strategy: DistributedStrategy) -> tuple:
    if not strategy.use_local_sgd:
        return (False,)
    return (True, strategy.local_sgd_steps, strategy.local_sgd_is_warm_steps)


def backward_inputs(params: list, parameter_list, no_grad_set) -> Optional[list]:
    """The tensors backward should fill (None: all), from Paddle's parameter_list and no_grad_set."""
    if parameter_list is None and not no_grad_set:
        return None
    chosen = params if parameter_list is None else list(parameter_list)
    excluded = list(no_grad_set or ())
    for t in chosen + excluded:
        if isinstance(t, str):
            raise TypeError(f"minimize was given the name {t!r}: PyTorch parameters have no global names, "
                            "pass the tensors themselves (e.g. parameter_list=[model.fc.weight]).")
    known = {id(p) for p in params}
    stranger = next((t for t in chosen if id(t) not in known), None)
    if stranger is not None:
        raise ValueError(f"parameter_list holds a tensor of shape {tuple(stranger.shape)} that this optimizer does not "
                         "update; pass only parameters given to the optimizer.")
    skip = {id(t) for t in excluded}
    inputs = [p for p in chosen if id(p) not in skip and p.requires_grad]
    if not inputs:
        raise ValueError("parameter_list and no_grad_set leave no parameter to train; remove some from no_grad_set.")
    return inputs


def distributed_optimizer(optimizer: torch.optim.Optimizer, strategy: Optional[DistributedStrategy] = None) -> DistributedOptimizer:
    """``optimizer`` made distributed; every rank's parameters become rank 0's at once.

    Every rank must hold the same parameters (shapes and dtypes): a difference is refused, naming the
    first parameter that differs and the ranks.
    """
    if isinstance(optimizer, DistributedOptimizer):
        raise ValueError("this optimizer is already a fleet.distributed_optimizer.")
    strategy = st.strategy_in_force(strategy)
    named = [(f"parameter {i} of the optimizer", p) for i, p in enumerate(p for g in optimizer.param_groups for p in g["params"])]
    check_same_parameters("fleet.distributed_optimizer", named)
    flags = st.read_flags()
    limits = st.bucket_limits(strategy, flags, ddp=False)
    sync = GradientSync([p for _, p in named], limits, st.channels_for(strategy), flags.sync_allreduce)
    wrapped = DistributedOptimizer(optimizer, strategy, sync)
    st.current().optimizer = wrapped
    if st.current().in_round:
        st.on_round_end(lambda: _unwrap(wrapped))
    return wrapped


def _unwrap(wrapped: DistributedOptimizer) -> None:
    """The round is over: ``wrapped``'s hooks and marks off the optimizer's parameters (the next round wraps it again)."""
    wrapped._sync.detach()
    for p in wrapped._params():
        p.__dict__.pop("_fleet_averaged", None)
