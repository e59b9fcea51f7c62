"""How averaged gradients travel: buckets (fusion), channels (communicators, hierarchical), and the sync.

A channel averages one flat tensor over all ranks. All ranks must build channels in the same order,
because creating a process group is itself collective.
"""

from __future__ import annotations

import contextlib
import functools
import time
from dataclasses import dataclass
from typing import Callable, List, Optional, Sequence

import torch
import torch.distributed as dist
from torch._utils import _flatten_dense_tensors, _unflatten_dense_tensors

from launcher.runtime.timing import add_wait

DEFAULT_BUCKET_MB = 25.0  # DistributedDataParallel's default bucket size
DEFAULT_FIRST_BUCKET_MB = 1.0  # and its first one, small so that sending starts early in backward
UNFUSED_BUCKET_MB = 1e-6  # smaller than any tensor: one bucket per gradient


@dataclass(frozen=True)
class BucketLimits:
    fuse: bool
    cap_mb: Optional[float] = None  # None: DDP's default sizes (1 MB first, 25 MB after)
    max_tensors: Optional[int] = None


def make_buckets(params: Sequence[torch.Tensor], limits: BucketLimits) -> List[list]:
    """Parameters in buckets, last layer first (the order backward produces gradients).

    As in DDP, a bucket is closed once it reaches its size (or holds ``max_tensors``), and the first
    one is small by default so that sending starts early in backward.
    """
    ordered = list(reversed(list(params)))
    if not limits.fuse:
        return [[p] for p in ordered]
    cap = (limits.cap_mb or DEFAULT_BUCKET_MB) * 2**20
    first_cap = (limits.cap_mb or DEFAULT_FIRST_BUCKET_MB) * 2**20
    buckets, current, size = [], [], 0
    for p in ordered:
        if current and (p.dtype != current[0].dtype or p.device != current[0].device):
            buckets.append(current)
            current, size = [], 0
        current.append(p)
        size += p.numel() * p.element_size()
        if size >= (cap if buckets else first_cap) or len(current) == limits.max_tensors:
            buckets.append(current)
            current, size = [], 0
    if current:
        buckets.append(current)
    return buckets


class FlatChannel:
    """A plain all-reduce on one communicator (process group)."""

    def __init__(self, group, world_size: int):
        self.group = group
        self.world_size = world_size

    def start(self, flat: torch.Tensor, scaled: bool = False):
        """Begin averaging ``flat`` in place (summing it, when it is ``scaled`` already); returns the Work to wait for."""
        if not scaled:
            flat.mul_(1.0 / self.world_size)
        return dist.all_reduce(flat, group=self.group, async_op=True)


class HierarchicalChannel:
    """Reduce to the node's first worker, all-reduce among nodes' first workers, broadcast in the node."""

    def __init__(self, intra, leader: int, inter, world_size: int):
        self.intra = intra
        self.leader = leader  # global rank of this node's first worker
        self.inter = inter  # None on the other workers of the node
        self.world_size = world_size

    def start(self, flat: torch.Tensor, scaled: bool = False):
        if not scaled:
            flat.mul_(1.0 / self.world_size)
        dist.reduce(flat, dst=self.leader, group=self.intra)
        if self.inter is not None:
            dist.all_reduce(flat, group=self.inter)
        dist.broadcast(flat, src=self.leader, group=self.intra)
        return None


def make_channels(comm_num: int, hierarchical: bool, inter_nranks: int) -> list:
    """``comm_num`` channels over the whole world, flat or hierarchical with ``inter_nranks`` per node."""
    world, rank = dist.get_world_size(), dist.get_rank()
    if not hierarchical:
        if comm_num == 1:
            return [FlatChannel(None, world)]
        return [FlatChannel(dist.new_group(list(range(world))), world) for _ in range(comm_num)]
    leaders = list(range(0, world, inter_nranks))
    leader = rank - rank % inter_nranks
    channels = []
    for _ in range(comm_num):
        intra = None
        for first in leaders:
            group = dist.new_group(list(range(first, first + inter_nranks)))
            intra = group if first == leader else intra
        inter = dist.new_group(leaders)
        channels.append(HierarchicalChannel(intra, leader, inter if rank == leader else None, world))
    return channels


def groups_of(channels: list) -> list:
    """The process groups ``channels`` made (not the default one)."""
    found = []
    for c in channels:
        found.extend(g for g in ((c.group,) if isinstance(c, FlatChannel) else (c.intra, c.inter)) if g is not None)
    return found


def is_default(channels: list) -> bool:
    """Only the default group, flat: what DistributedDataParallel does by itself."""
    return len(channels) == 1 and isinstance(channels[0], FlatChannel) and channels[0].group is None


class FlatBucket:
    """One bucket's gradients in one flat buffer, then one used-mark per parameter (0 where a rank had no gradient).

    Packing scales each gradient into its slot (copy and average's division in one pass, as DDP's reducer);
    after the all-reduce each gradient becomes a view of its slot (DDP's gradient_as_bucket_view), so nothing
    is copied back, and a gradient that is already that view (accumulated in place) is not copied in either.
    """

    def __init__(self, params: Sequence[torch.Tensor]):
        self.params = list(params)
        sizes = [p.numel() for p in self.params]
        first = self.params[0]
        self.flat = torch.zeros(sum(sizes) + len(sizes), dtype=first.dtype, device=first.device)
        self.slots = [s.view(p.shape) for s, p in zip(torch.split(self.flat[:sum(sizes)], sizes), self.params)]
        self.marks = self.flat[sum(sizes):]

    def pack(self, scale: float) -> list:
        """The gradients, times ``scale``, into the buffer; returns which parameters had none here."""
        filled = []
        for p, slot in zip(self.params, self.slots):
            grad = p.grad
            if grad is None:
                slot.zero_()
                filled.append(True)
                continue
            filled.append(False)
            if grad.is_sparse:
                raise ValueError("sparse gradients cannot be all-reduced by fleet, as in Paddle 1.8; use dense embeddings.")
            if _is_view_of(grad, slot):
                slot.mul_(scale)
            else:
                torch.mul(grad, scale, out=slot)
        self.marks.fill_(1.0)
        if any(filled):
            self.marks.copy_(torch.tensor([0.0 if f else 1.0 for f in filled], dtype=self.marks.dtype))
        return filled

    def unpack(self, filled: list) -> None:
        """Each gradient becomes the average in its slot; one that no rank had stays None, as in one process."""
        used = self.marks.tolist() if any(filled) else None  # read (a GPU sync) only when this rank lacked one
        for i, (p, slot) in enumerate(zip(self.params, self.slots)):
            if filled[i] and used[i] == 0:
                p.grad = None
            elif p.grad is None or p.grad.is_contiguous():
                p.grad = slot  # the slot holds the average: a gradient backward made (if not the slot itself) is dropped
            else:
                p.grad.copy_(slot)  # a layout of its own (channels_last): the optimizer expects it kept


def _is_view_of(grad: torch.Tensor, slot: torch.Tensor) -> bool:
    return grad.data_ptr() == slot.data_ptr() and grad.shape == slot.shape and grad.is_contiguous()


class GradientSync:
    """Average every parameter's gradient over all ranks, bucket by bucket, channels in turn, as DDP does.

    During backward each bucket is sent as soon as its last gradient is ready (in bucket order); when
    backward ends, the rest is sent and everything is waited for, so the gradients a script sees after
    backward (to clip them, or for GradScaler's inf check) are already the averages. Each bucket also
    carries a mask of the parameters that had a gradient: one that no rank used stays None.
    Called directly (by step() when no backward synced since), it does the same for the gradients as they are.
    The time spent waiting for the all-reduces is counted (``launcher.runtime.timing``): a step's time less it is the
    rank's own work, what ``launcher.runtime.report`` tells the launcher to find the straggler.
    """

    def __init__(self, params: Sequence[torch.Tensor], limits: BucketLimits, channels: list, wait_each: bool):
        self.buckets = make_buckets([p for p in params if p.requires_grad], limits)
        self.frozen = [(i, p) for i, p in enumerate(params) if not p.requires_grad]  # at wrap time: no hooks, no bucket
        self.channels = channels
        self.wait_each = wait_each  # FLAGS_sync_nccl_allreduce=1
        self.enabled: Callable[[], bool] = lambda: True  # False: backward leaves the gradients local
        self.synced = False  # the gradients are averaged and nothing changed them since
        self.calls = 0
        self._paused = False
        self._queued = False  # the end-of-backward callback is queued
        self._pending = []  # (bucket index, filled, work) of the buckets sent, in bucket order
        self._ready = [0] * len(self.buckets)
        self._flat = [FlatBucket(bucket) for bucket in self.buckets]  # kept: no allocation per step
        self._scale = 1.0 / dist.get_world_size()
        self._hooks = [p.register_post_accumulate_grad_hook(functools.partial(self._on_gradient, index))
                       for index, bucket in enumerate(self.buckets) for p in bucket]

    def detach(self) -> None:
        """Take this sync's hooks off the parameters: their gradients are left alone from now on."""
        for hook in self._hooks:
            hook.remove()
        self._hooks = []

    @contextlib.contextmanager
    def paused(self):
        """Backward passes inside this block accumulate local gradients; the next one outside averages them all."""
        self._paused = True
        try:
            yield
        finally:
            self._paused = False

    def __call__(self) -> None:
        """Send what is not sent yet, wait for everything, put the averages in place."""
        self.calls += 1
        for index in range(len(self._pending), len(self.buckets)):
            self._send(index)
        waited = 0.0
        for index, filled, work in self._pending:
            if work is not None:
                started = time.perf_counter()
                work.wait()
                waited += time.perf_counter() - started
            self._flat[index].unpack(filled)
        add_wait(waited)
        self._reset()
        self.synced = True

    def _on_gradient(self, index: int, _param) -> None:
        self.synced = False
        if self._paused or not (self._queued or self.enabled()):
            return
        if not self._queued:
            torch.autograd.Variable._execution_engine.queue_callback(self)  # DDP's way to run at the end of backward
            self._queued = True
        self._ready[index] += 1
        while len(self._pending) < len(self.buckets) and self._ready[len(self._pending)] == len(self.buckets[len(self._pending)]):
            self._send(len(self._pending))

    def _send(self, index: int) -> None:
        bucket = self._flat[index]
        filled = bucket.pack(self._scale)
        started = time.perf_counter()
        work = self.channels[index % len(self.channels)].start(bucket.flat, scaled=True)
        if self.wait_each:
            wait(work, bucket.flat)
            work = None
        if work is None:  # waited for here (also a hierarchical channel's start, which is synchronous)
            add_wait(time.perf_counter() - started)
        self._pending.append((index, filled, work))

    def _reset(self) -> None:
        self._pending = []
        self._ready = [0] * len(self.buckets)
        self._queued = False


def refuse_unfrozen(what: str, frozen: Sequence[tuple], fix: str) -> None:
    """Refuse a parameter frozen when ``what`` was called and trainable now: no rank would synchronise it."""
    late = next(((name, p) for name, p in frozen if p.requires_grad), None)
    if late is not None:
        raise RuntimeError(f"{what}: {late[0]} (shape {tuple(late[1].shape)}) had requires_grad=False when it was wrapped "
                           f"and requires a gradient now, which no rank would average (the ranks would drift apart); {fix}.")


def wait(work, flat: torch.Tensor) -> None:
    """Wait for ``work`` to finish, also on the GPU (Paddle's FLAGS_sync_nccl_allreduce=1)."""
    if work is not None:
        work.wait()
    if flat.is_cuda:
        torch.cuda.current_stream(flat.device).synchronize()


def broadcast_parameters(tensors: Sequence[torch.Tensor], src: int = 0) -> None:
    """Make every rank's ``tensors`` equal to rank ``src``'s, one flat broadcast per dtype and device."""
    groups: dict = {}
    for t in tensors:
        groups.setdefault((t.dtype, t.device), []).append(t)
    with torch.no_grad():
        for same in groups.values():
            flat = _flatten_dense_tensors([t.data for t in same])
            dist.broadcast(flat, src)
            for t, synced in zip(same, _unflatten_dense_tensors(flat, same)):
                t.data.copy_(synced)


def check_same_parameters(what: str, named: Sequence[tuple]) -> None:
    """Refuse, on every rank alike, parameters whose count, shapes or dtypes differ between ranks.

    torch's own verifier (the one DDP runs) is not used: on a shape difference it raises on the other
    ranks only, leaving rank 0 in the next collective, and it cannot name the parameter.
    """
    mine = [(name, tuple(p.shape), str(p.dtype).replace("torch.", "")) for name, p in named]
    every = [None] * dist.get_world_size()
    dist.all_gather_object(every, mine)
    for index in range(max(len(e) for e in every)):
        found = [e[index] if index < len(e) else None for e in every]
        other = next((r for r in range(1, len(found)) if _kind(found[r]) != _kind(found[0])), None)
        if other is not None:
            name = (found[0] or found[other])[0]
            raise ValueError(f"{what}: {name} is {_describe(found[0])} on rank 0 but {_describe(found[other])} on rank {other}; "
                             "every rank must build the same model.")


def _kind(entry) -> Optional[tuple]:
    return None if entry is None else entry[1:]


def _describe(entry) -> str:
    return "missing" if entry is None else f"{entry[2]} of shape {entry[1]}"
