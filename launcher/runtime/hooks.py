"""``timed_allreduce_hook``: DistributedDataParallel's all-reduce of the gradients, as DDP does it by default (each
bucket averaged over the group), which also counts how long this rank waits for the others at the end of backward
(``launcher.runtime.timing``), so that ``launcher.runtime.report`` gives each step's own work (its compute time):

    ddp = DistributedDataParallel(model)
    ddp.register_comm_hook(None, timed_allreduce_hook)   # state: None (the default group) or a process group

The wait of a step: from the moment the last bucket is handed over (backward's own work is done) to the end of the
last all-reduce. No collective, no GPU synchronisation is added: each bucket's all-reduce notes when it ends, in the
callback DDP waits for anyway. On CUDA with NCCL, the end noted is the host's (see ``launcher.runtime.timing``)."""

import threading
import time

import torch
import torch.distributed as dist

from launcher.runtime.timing import add_wait


class WaitClock:
    """One backward's buckets: how many are in flight, when the last one was handed over, when the last one ended."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.in_flight = 0
        self.last_sent = None  # perf_counter when the step's last bucket was sent; None before it
        self.ended = 0.0

    def sent(self, last: bool) -> None:
        with self.lock:
            self.in_flight += 1
            if last:
                self.last_sent = time.perf_counter()

    def done(self) -> None:
        with self.lock:
            self.in_flight -= 1
            self.ended = max(self.ended, time.perf_counter())
            if self.in_flight > 0:
                return
            if self.last_sent is not None:  # the step's buckets are all back: its wait is over
                add_wait(self.ended - self.last_sent)
            self.last_sent, self.ended = None, 0.0


clock = WaitClock()


def timed_allreduce_hook(state, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    """A DDP communication hook: the bucket averaged over ``state`` (a process group; None: the default one), and
    this rank's wait for it counted. (Its annotations are the ones DDP checks: no ``from __future__ import annotations``
in this module.)"""
    group = state if state is not None else dist.group.WORLD
    flat = bucket.buffer()
    flat.div_(dist.get_world_size(group))
    work = dist.all_reduce(flat, group=group, async_op=True)
    clock.sent(bucket.is_last())  # after the call (one that raises leaves nothing in flight), before the callback is attached

    def averaged(fut: torch.futures.Future) -> torch.Tensor:
        clock.done()
        return fut.value()[0]

    return work.get_future().then(averaged)
