"""A worker of ``launcher.runtime.elastic.run`` for tests/test_runtime_elastic*.py: a tiny model trained with
all-reduces, forever (until the process is stopped), in every round the launcher gives it.

At each entry into ``train`` it appends one JSON line to argv[1] ("event": "enter"): the round, rank, world
size, pid, step, its open descriptors, Python threads, OS threads, RSS and a digest of the parameters. Every
PROGRESS steps it appends a line with "event": "step". REFORM_RAISE_AT=N: ``train`` raises at step N.
REFORM_BACKEND=nccl: the model and its all-reduces on the GPU LOCAL_RANK (tests/gpu), else gloo on the CPU.
REFORM_FLEET=optimizer (fleet.distributed_optimizer) or model (fleet.distributed_model): a Fleet program under
fleet.elastic_run, its gradients averaged by fleet over REFORM_COMM_NUM communicators (nccl_comm_num); each
"step" line then also says how far the averaged gradient was from the mean of every rank's own ("grad_error",
computed here from every rank's batch) and how many gradient hooks the parameters hold ("hooks").
"""

import hashlib
import json
import os
import sys
import threading
import time

import torch
import torch.distributed as dist

from launcher import fleet
from launcher.runtime import elastic

OUT = sys.argv[1]
PROGRESS = 25
RAISE_AT = int(os.environ.get("REFORM_RAISE_AT", "-1"))
BACKEND = os.environ.get("REFORM_BACKEND", "gloo")
FLEET = os.environ.get("REFORM_FLEET", "")
COMM_NUM = int(os.environ.get("REFORM_COMM_NUM", "1"))
DEVICE = torch.device("cuda", int(os.environ["LOCAL_RANK"])) if BACKEND == "nccl" else torch.device("cpu")

torch.manual_seed(os.getpid())  # every process starts from a model of its own: only the broadcast makes them equal
model = torch.nn.Linear(8, 4).to(DEVICE)
state = {"model": model, "optimizer": torch.optim.SGD(model.parameters(), lr=0.01), "step": 0}


def note(event, round_=None, **more):
    record = {"event": event, "pid": os.getpid(), "step": state["step"], **more}
    if round_ is not None:
        record.update(round=round_.number, rank=round_.rank, world_size=round_.world_size, source=round_.source)
    with open(OUT, "a") as f:
        f.write(json.dumps(record) + "\n")


def digest():
    h = hashlib.sha256()
    for p in model.parameters():
        h.update(p.detach().cpu().numpy().tobytes())
    return h.hexdigest()


def train(round_):
    with open("/proc/self/statm") as f:
        rss = int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    note("enter", round_, fds=len(os.listdir("/proc/self/fd")), threads=threading.active_count(),
         tasks=len(os.listdir("/proc/self/task")), rss=rss, digest=digest())
    net, optimizer = model, state["optimizer"]
    if FLEET:
        strategy = fleet.DistributedStrategy()
        strategy.nccl_comm_num = COMM_NUM
        net = fleet.distributed_model(model, strategy) if FLEET == "model" else model
        optimizer = fleet.distributed_optimizer(optimizer, strategy) if FLEET == "optimizer" else optimizer
    while True:
        if state["step"] == RAISE_AT:
            raise RuntimeError(f"reform_probe: raised at step {RAISE_AT}")
        loss = net(batch(state["step"], round_.rank)).square().mean()
        optimizer.zero_grad()
        loss.backward()
        if not FLEET:
            for p in model.parameters():
                dist.all_reduce(p.grad)
                p.grad /= round_.world_size
        more = checked(round_) if (state["step"] + 1) % PROGRESS == 0 and FLEET else {}
        optimizer.step()
        state["step"] += 1
        if state["step"] % PROGRESS == 0:
            note("step", round_, **more)
        time.sleep(0.01)


def batch(step, rank):
    return torch.randn(16, 8, generator=torch.Generator().manual_seed(step * 1000 + rank)).to(DEVICE)


def checked(round_) -> dict:
    """How far each averaged gradient is from the mean of every rank's own, and the hooks on the parameters."""
    params = list(model.parameters())
    mean = [torch.zeros_like(p) for p in params]
    for rank in range(round_.world_size):
        own = torch.autograd.grad(model(batch(state["step"], rank)).square().mean(), params)
        for m, g in zip(mean, own):
            m += g / round_.world_size
    error = max((p.grad - m).abs().max().item() for p, m in zip(params, mean))
    return {"grad_error": error, "hooks": sum(len(p._post_accumulate_grad_hooks or {}) for p in params)}


(fleet.elastic_run if FLEET else elastic.run)(train, state, backend=BACKEND)
