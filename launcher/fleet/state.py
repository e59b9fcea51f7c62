"""The fleet of this process: who we are, the strategy in force, and what the strategy does."""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass, field
from typing import Optional

import torch
import torch.distributed as dist

from launcher.fleet.comm import BucketLimits, groups_of, make_channels
from launcher import envvars as ev
from launcher.fleet.strategy import DistributedStrategy, set_by_launcher
from launcher.runtime import ParallelEnv
from launcher.runtime import elastic
from launcher.runtime import flags as fl
from launcher.runtime import parallel
from launcher.runtime.flags import Flags, warn_once


@dataclass
class FleetState:
    penv: Optional[ParallelEnv]  # None in parameter-server mode
    strategy: object  # a DistributedStrategy; in parameter-server mode a launcher.ps PsStrategy
    ps: object = None  # the launcher.ps PsSession in parameter-server mode
    channels: dict = field(default_factory=dict)  # (comm_num, hierarchical, inter_nranks) -> channels
    model: Optional[torch.nn.Module] = None  # the last one given to distributed_model (Paddle-shaped saves use it)
    optimizer: Optional[torch.optim.Optimizer] = None  # the last distributed_optimizer
    saves: dict = field(default_factory=dict)  # file path -> how many times this rank saved it
    transpiled: object = None  # the GradientSync of the model an nccl2 transpile made data-parallel
    in_round: bool = False  # made by fleet.elastic_run for one round: fleet.init in it joins nothing more
    undo: list = field(default_factory=list)  # what the round's wrappers hooked onto the user's tensors, undone at its end


_state: Optional[FleetState] = None


def reset() -> None:
    """Forget the fleet, the process group, the store and the warnings given: the one reset for tests."""
    set_current(None)
    parallel.reset()


def current() -> FleetState:
    if _state is None:
        raise RuntimeError("fleet is not initialised: call fleet.init() first.")
    return _state


def initialised() -> bool:
    return _state is not None


def set_current(state: Optional[FleetState]) -> None:
    global _state
    _state = state


def make_state(penv: ParallelEnv, strategy: Optional[DistributedStrategy], in_round: bool = False) -> FleetState:
    return FleetState(penv, strategy or DistributedStrategy(), in_round=in_round)


def round_in_force() -> Optional[FleetState]:
    """The fleet of the round fleet.elastic_run is in, or None."""
    return _state if _state is not None and _state.in_round else None


def ps_session():
    """The parameter-server session of this process, or None (collective mode, or fleet.init not called)."""
    return None if _state is None else _state.ps


def barrier() -> None:
    """Wait for every worker (on the worker's own GPU under NCCL)."""
    device = current().penv.device
    if dist.get_world_size() > 1:
        dist.barrier(device_ids=[device.index] if device.type == "cuda" else None)


def read_flags() -> Flags:
    """The environment flags as they are now (read when a model or optimizer is wrapped)."""
    return fl.read_flags(os.environ)


def strategy_in_force(strategy: Optional[DistributedStrategy]) -> DistributedStrategy:
    """``strategy`` (which becomes the fleet's), or the fleet's; checked and applied."""
    state = current()
    if strategy is not None:
        state.strategy = strategy
    strategy = state.strategy
    _set_by_launcher(strategy)
    strategy.check(state.penv.world_size, state.penv.local_world_size)
    apply_exec_options(strategy)
    return strategy


def _set_by_launcher(strategy: DistributedStrategy) -> None:
    """The fields the launcher sets (a config file's strategy:, a tuning trial's) over the program's, said once."""
    text = os.environ.get(ev.STRATEGY)
    if not text:
        return
    changed = set_by_launcher(strategy, text)
    if not _said_strategy:
        _said_strategy.append(True)
        print(f"launcher: fleet's strategy, set by the launcher ({ev.STRATEGY}): {', '.join(changed)}",
              file=sys.stderr, flush=True)


_said_strategy: list = []


def apply_exec_options(strategy: DistributedStrategy) -> None:
    """num_threads sets torch's CPU threads; the two Paddle executor knobs are warned about."""
    if strategy.num_threads is not None and torch.get_num_threads() != strategy.num_threads:
        torch.set_num_threads(strategy.num_threads)
    if strategy.num_iteration_per_drop_scope != 1:
        warn_once("num_iteration_per_drop_scope", "num_iteration_per_drop_scope has no effect on PyTorch: there is no "
                  "scope to drop, every temporary tensor is freed as soon as nothing refers to it.")
    if strategy.fetch_frequency != 1:
        warn_once("fetch_frequency", "fetch_frequency has no effect on PyTorch: a loss is copied to the host only when the "
                  "script calls .item(); fetch every N steps in the training loop, as examples/train_tuned.py does.")


def bucket_limits(strategy: DistributedStrategy, flags: Flags, ddp: bool) -> BucketLimits:
    """Buckets from fuse_all_reduce_ops and FLAGS_fuse_parameter_memory_size / _groups_size."""
    if strategy.fuse_all_reduce_ops is False:
        if flags.fuse_memory_mb is not None or flags.fuse_groups_size is not None:
            warn_once("fuse_flags", f"{fl.FUSE_PARAMETER_MEMORY_SIZE} and {fl.FUSE_PARAMETER_GROUPS_SIZE} size the fused "
                      "all-reduce buckets; they have no effect while fuse_all_reduce_ops is False.")
        return BucketLimits(fuse=False)
    if ddp and flags.fuse_groups_size is not None:
        warn_once("fuse_groups_ddp", f"{fl.FUSE_PARAMETER_GROUPS_SIZE} has no effect on fleet.distributed_model: "
                  "DistributedDataParallel sizes its buckets in bytes only; use fleet.distributed_optimizer alone for a count limit.")
    return BucketLimits(fuse=True, cap_mb=flags.fuse_memory_mb, max_tensors=None if ddp else flags.fuse_groups_size)


def channels_for(strategy: DistributedStrategy) -> list:
    """The communicators the strategy asks for, created once per process (collectively)."""
    state = current()
    inner = strategy.inter_nranks(state.penv.local_world_size) if strategy.use_hierarchical_allreduce else 0
    key = (strategy.nccl_comm_num, strategy.use_hierarchical_allreduce, inner)
    if key not in state.channels:
        with elastic.round_owns() as made:  # interrupted with the round, under fleet.elastic_run
            state.channels[key] = make_channels(*key)
            made.extend(groups_of(state.channels[key]))
    return state.channels[key]


def on_round_end(undo) -> None:
    """``undo()`` is called when the round ends, under fleet.elastic_run (at once, in the round's last act)."""
    current().undo.append(undo)


def end_round() -> None:
    """Undo what the round's wrappers hooked onto the model's tensors (the next round wraps them again), forget the
    fleet: the next round starts with none."""
    state = _state
    set_current(None)
    if state is not None:
        for undo in reversed(state.undo):
            undo()
