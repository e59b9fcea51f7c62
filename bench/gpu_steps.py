"""GPU benchmark worker: steps per second of the Fleet tutorial's MLP on this worker's GPU.

    gpu_steps.py API STEPS OUT_DIR      API: optimizer | model (ours, under the launcher) | ddp (under torchrun)

Writes OUT_DIR/gpu_steps.<rank>.json. Batches live on the GPU; each timed block ends with a
synchronize, so the figure is what the GPU did, not what was queued.
"""

import json
import os
import sys
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

WARMUP, BATCH = 10, 1024


def main(api: str, steps: int, out_dir: str) -> None:
    rank = int(os.environ.get("RANK", "0"))
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(32, 1280), nn.Tanh(), nn.Linear(1280, 1280), nn.Tanh(), nn.Linear(1280, 2))
    if api == "ddp":
        device = torch.device("cuda", int(os.environ["LOCAL_RANK"]))
        torch.cuda.set_device(device)
        dist.init_process_group("nccl")
        model = nn.parallel.DistributedDataParallel(model.to(device), device_ids=[device.index])
        opt = torch.optim.SGD(model.parameters(), lr=0.01)
    else:
        from launcher import fleet

        device = fleet.init(is_collective=True).device
        model = model.to(device)
        if api == "model":
            model = fleet.distributed_model(model)
            opt = torch.optim.SGD(model.parameters(), lr=0.01)
        else:
            opt = fleet.distributed_optimizer(torch.optim.SGD(model.parameters(), lr=0.01))
    gen = torch.Generator(device=device).manual_seed(1000 + rank)
    x = torch.rand(BATCH, 32, device=device, generator=gen)
    y = torch.randint(2, (BATCH,), device=device, generator=gen)

    def step():
        opt.zero_grad()
        F.cross_entropy(model(x), y).backward()
        opt.step()

    for _ in range(WARMUP):
        step()
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(steps):
        step()
    torch.cuda.synchronize()
    elapsed = time.perf_counter() - start
    with open(os.path.join(out_dir, f"gpu_steps.{rank}.json"), "w") as f:
        json.dump({"api": api, "steps_per_s": steps / elapsed, "backend": dist.get_backend() if dist.is_initialized() else None}, f)


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]), sys.argv[3])
