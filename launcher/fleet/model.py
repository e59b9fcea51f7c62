"""fleet.distributed_model: DistributedDataParallel configured from the strategy (all-reduce overlapped with backward)."""

import inspect
import time
from typing import Optional

import torch
import torch.distributed as dist
from torch.distributed.algorithms.ddp_comm_hooks.debugging_hooks import noop_hook
from torch.nn.parallel import DistributedDataParallel

from launcher.fleet import state as st
from launcher.fleet.comm import UNFUSED_BUCKET_MB, check_same_parameters, is_default, refuse_unfrozen, wait
from launcher.fleet.strategy import DistributedStrategy
from launcher.runtime.flags import SYNC_NCCL_ALLREDUCE, Flags, warn_once
from launcher.runtime.hooks import clock
from launcher.runtime.timing import add_wait


class ChannelHookState:
    """What the communication hook needs: the channels to use in turn, and whether to wait on the spot."""

    def __init__(self, channels: list, wait_each: bool):
        self.channels = channels
        self.wait_each = wait_each


def channel_hook(state: ChannelHookState, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    """DDP communication hook: average the bucket on channel ``bucket.index() % nccl_comm_num``; this rank's wait for
    the last buckets counted, as ``launcher.runtime.timed_allreduce_hook`` counts it."""
    flat = bucket.buffer()
    started = time.perf_counter()
    work = state.channels[bucket.index() % len(state.channels)].start(flat)
    if work is not None and not state.wait_each:
        clock.sent(bucket.is_last())  # before its callback can run: that is attached below
        return work.get_future().then(lambda sent: _result(sent, flat))
    wait(work, flat)
    add_wait(time.perf_counter() - started)  # waited for here
    done = torch.futures.Future()
    done.set_result(flat)
    return done


def _result(sent: torch.futures.Future, flat: torch.Tensor) -> torch.Tensor:
    """The averaged bucket, once its all-reduce is done; the all-reduce's error, raised (a peer gone: never a bucket
    taken as averaged when it was not)."""
    clock.done()
    sent.value()
    return flat


def distributed_model(model: torch.nn.Module, strategy: Optional[DistributedStrategy] = None, **ddp_options) -> DistributedDataParallel:
    """``model`` in DistributedDataParallel: buckets, communicators, hierarchy and local SGD from the strategy.

    ``ddp_options`` go to DistributedDataParallel as given (find_unused_parameters, broadcast_buffers,
    static_graph, ...) and win over what fleet would choose. Buffers (BatchNorm's running statistics)
    stay each rank's own, as with distributed_optimizer, unless broadcast_buffers=True is passed.
    Every rank must hold the same parameters: a difference is refused, naming the first one.
    """
    strategy = st.strategy_in_force(strategy)
    state = st.current()
    flags = st.read_flags()
    limits = st.bucket_limits(strategy, flags, ddp=True)
    device = state.penv.device
    check_same_parameters("fleet.distributed_model", list(model.named_parameters()))
    options = {
        "device_ids": [device.index] if device.type == "cuda" else None,
        "bucket_cap_mb": limits.cap_mb if limits.fuse else UNFUSED_BUCKET_MB,  # None: DDP's own defaults
        "gradient_as_bucket_view": True,
        **({} if {"broadcast_buffers", "forward_sync_buffers"} & ddp_options.keys() else _no_buffer_sync()),
        **ddp_options,
    }
    ddp = DistributedDataParallel(model, **options)
    _register_hook(ddp, strategy, flags)
    if strategy.use_local_sgd:
        _require_averaging(ddp, strategy)
    _refuse_unfrozen_later(ddp, [(n, p) for n, p in model.named_parameters() if not p.requires_grad])
    for p in model.parameters():
        p._fleet_model_strategy = strategy  # tells fleet.distributed_optimizer that DDP all-reduces this one
    state.model = model
    if state.in_round:
        st.on_round_end(lambda: _unwrap(ddp))
    return ddp


def _unwrap(ddp: DistributedDataParallel) -> None:
    """The round is over: the reducer's hooks and fleet's marks off the model's parameters (the next round wraps
    the model again, in its own process group)."""
    ddp._remove_autograd_hooks()
    for p in ddp.module.parameters():
        p.__dict__.pop("_fleet_model_strategy", None)


def _no_buffer_sync() -> dict:
    """DDP's option that keeps buffers each rank's own after the start (renamed in recent torch)."""
    accepted = inspect.signature(DistributedDataParallel.__init__).parameters
    return {"forward_sync_buffers": False} if "forward_sync_buffers" in accepted else {"broadcast_buffers": False}


def _require_averaging(ddp: DistributedDataParallel, strategy: DistributedStrategy) -> None:
    """Refuse local SGD with an optimizer that would never average the parameters (workers would drift apart)."""
    def check(module, args):
        if not any(getattr(p, "_fleet_averaged", False) for p in module.parameters()):
            raise RuntimeError("use_local_sgd with fleet.distributed_model needs fleet.distributed_optimizer(optimizer, strategy): "
                               f"it averages the parameters every {strategy.local_sgd_steps} steps; a plain optimizer never would.")
        handle.remove()

    handle = ddp.register_forward_pre_hook(check)


def _refuse_unfrozen_later(ddp: DistributedDataParallel, frozen: list) -> None:
    """DistributedDataParallel averages only what required a gradient when it was built: refuse, at the next
    forward, a parameter unfrozen since (every rank unfreezes it alike, so every rank stops)."""
    if frozen:
        ddp.register_forward_pre_hook(lambda _m, _args: refuse_unfrozen(
            "fleet.distributed_model", frozen, "set requires_grad before fleet.distributed_model (a frozen parameter "
            "is left alone), or wrap the model again after unfreezing"))


def _register_hook(ddp: DistributedDataParallel, strategy: DistributedStrategy, flags: Flags) -> None:
    channels = st.channels_for(strategy)
    if strategy.use_local_sgd:
        if not is_default(channels) or flags.sync_allreduce:
            warn_once("local_sgd_ddp", "with use_local_sgd no gradient is all-reduced (the parameters are averaged): "
                      f"nccl_comm_num, use_hierarchical_allreduce and {SYNC_NCCL_ALLREDUCE} do not apply.")
        ddp.register_comm_hook(None, noop_hook)  # Paddle's LocalSGD averages parameters (the optimizer), never gradients
    elif not is_default(channels) or flags.sync_allreduce:
        ddp.register_comm_hook(ChannelHookState(channels, flags.sync_allreduce), channel_hook)
