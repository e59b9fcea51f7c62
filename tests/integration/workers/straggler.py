"""A data-parallel loop on gloo in which rank 1 is slow on purpose (an extra 0.2 s of its own work per step), its
waits in the all-reduce counted by fleet's gradient sync or by ``timed_allreduce_hook`` under DistributedDataParallel.

    straggler.py FOLDER fleet|ddp

Each step: forward, backward (the all-reduce), the optimizer, ``launcher.runtime.report(step=...)``. It ends at
FOLDER/stop (or after 400 steps) and writes FOLDER/result.RANK: the seconds it waited in the all-reduce and its
steps' time, from step 1 to its last (the first one's set-up left out)."""

import json
import os
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from launcher import fleet
from launcher.runtime import report, timed_allreduce_hook, waited

folder, mode = Path(sys.argv[1]), sys.argv[2]
rank = fleet.init(timeout=60).rank
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.Tanh(), torch.nn.Linear(64, 2))
if mode == "ddp":
    net = DistributedDataParallel(model)
    net.register_comm_hook(None, timed_allreduce_hook)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
else:
    net = model
    optimizer = fleet.distributed_optimizer(torch.optim.SGD(model.parameters(), lr=0.01))
x, y = torch.randn(16, 32), torch.randint(0, 2, (16,))
started = waited_before = None
step = 0
for step in range(400):
    if step == 1:
        started, waited_before = time.perf_counter(), waited()
    stop = torch.tensor([float((folder / "stop").exists())])
    dist.all_reduce(stop)  # every rank ends at the same step
    if stop.item():
        break
    if rank == 1:
        time.sleep(0.2)  # its own work, four times and more the others'
    loss = torch.nn.functional.cross_entropy(net(x), y)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    report(step=step, loss=float(loss))
(folder / f"result.{rank}").write_text(json.dumps({
    "waited": waited() - waited_before, "elapsed": time.perf_counter() - started, "steps": step - 1,
    "pid": os.getpid()}))
