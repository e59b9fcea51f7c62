"""An elastic data-parallel loop (gloo, ``launcher.runtime.elastic``: the survivors of a membership change go on in
place) whose node is slow on purpose when its launcher was started with SLOW_NODE=1: 0.25 s more of its own work per
step. Each step reports its own work as its compute time (``launcher.runtime.report(step, compute=...)``) and prints

    step=N world=W rank=R pid=P slow=0|1

It ends once FOLDER/stop exists (every rank at the same step) or after 3,000 steps.

    slow_member.py FOLDER
"""

import os
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist

from launcher.runtime import elastic, report

folder = Path(sys.argv[1])
slow = os.environ.get("SLOW_NODE") == "1"
torch.manual_seed(0)
torch.set_num_threads(1)
model = torch.nn.Linear(16, 1)
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
state = {"model": model, "optimizer": optimizer, "step": 0}


def train(round_: elastic.Round) -> None:
    x, y = torch.randn(8, 16), torch.randn(8, 1)
    while state["step"] < 3000:
        began = time.perf_counter()
        time.sleep(0.25 if slow else 0.02)  # its own work
        optimizer.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        compute = time.perf_counter() - began
        for p in model.parameters():
            dist.all_reduce(p.grad)
        stop = torch.tensor([float((folder / "stop").exists())])
        dist.all_reduce(stop)
        if stop.item():
            return
        optimizer.step()
        state["step"] += 1
        report(step=state["step"], compute=compute)
        print(f"step={state['step']} world={round_.world_size} rank={round_.rank} pid={os.getpid()} "
              f"slow={int(slow)}", flush=True)


elastic.run(train, state, backend="gloo")
