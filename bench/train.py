"""Benchmark worker for training: the MLP of Paddle 1.8's Fleet tutorial on CPU workers.

    train.py API STEPS OUT_DIR

API is how gradients are synchronised:
  optimizer  our ``fleet.distributed_optimizer`` (under ``python -m launcher``)
  model      our ``fleet.distributed_model``     (under ``python -m launcher``)
  ddp        hand-written DistributedDataParallel (under torchrun)

Each rank writes OUT_DIR/train.<rank>.json: steps per second over STEPS timed steps (after
WARMUP untimed ones), the CPU time per step of the whole process (less sensitive than wall time
to other work on the machine) and a checksum of its parameters, so that the harness can check that the
ranks stayed in sync.
"""

import json
import os
import sys
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

WARMUP = 3
BATCH, IN_DIM, HID_DIM, LABEL_DIM = 128, 32, 1280, 2


def mlp() -> nn.Module:
    """fc(1280, tanh) -> fc(1280, tanh) -> fc(2, softmax), as in the Fleet tutorial."""
    return nn.Sequential(
        nn.Linear(IN_DIM, HID_DIM), nn.Tanh(),
        nn.Linear(HID_DIM, HID_DIM), nn.Tanh(),
        nn.Linear(HID_DIM, LABEL_DIM),
    )


def batch(gen: torch.Generator):
    return torch.rand(BATCH, IN_DIM, generator=gen), torch.randint(LABEL_DIM, (BATCH,), generator=gen)


def step_function(api: str, model: nn.Module):
    """A callable doing one training step on (x, y), for the given API."""
    if api == "ddp":
        dist.init_process_group("gloo")
        model = nn.parallel.DistributedDataParallel(model)
        opt = torch.optim.SGD(model.parameters(), lr=0.01)
        return lambda x, y: _plain_step(model, opt, x, y)
    from launcher import fleet

    fleet.init(is_collective=True)
    if api == "model":
        model = fleet.distributed_model(model)
        opt = torch.optim.SGD(model.parameters(), lr=0.01)
        return lambda x, y: _plain_step(model, opt, x, y)
    opt = fleet.distributed_optimizer(torch.optim.SGD(model.parameters(), lr=0.01))

    return lambda x, y: opt.minimize(F.cross_entropy(model(x), y))  # zero_grad, backward, sync, step


def _plain_step(model, opt, x, y):
    opt.zero_grad()
    F.cross_entropy(model(x), y).backward()
    opt.step()


def main(api: str, steps: int, out_dir: str) -> None:
    rank = int(os.environ["RANK"])
    torch.manual_seed(0)  # same initial weights on every rank
    model = mlp()
    step = step_function(api, model)
    gen = torch.Generator().manual_seed(1000 + rank)  # different data on every rank
    data = [batch(gen) for _ in range(8)]
    for i in range(WARMUP):
        step(*data[i % len(data)])
    start, cpu_start = time.perf_counter(), time.process_time()
    for i in range(steps):
        step(*data[i % len(data)])
    elapsed, cpu = time.perf_counter() - start, time.process_time() - cpu_start
    checksum = float(sum(p.detach().double().sum() for p in model.parameters()))
    with open(os.path.join(out_dir, f"train.{rank}.json"), "w") as f:
        json.dump({"steps_per_s": steps / elapsed, "cpu_ms_per_step": 1000 * cpu / steps, "checksum": checksum}, f)


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]), sys.argv[3])
