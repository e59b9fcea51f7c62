"""A DistributedDataParallel step on CPU (gloo), as pytorch/examples' DDP recipes run it, writing
OUT/ddp.RANK.json: the rank, the world size and the sum of the weights after the step (the same on
every rank when the gradients were averaged).

usage: ddp_toy.py OUT
"""

import json
import os
import sys

import torch
import torch.distributed as dist
import torch.distributed.nn  # noqa: F401  (before init_process_group: a clean exit, docs/torchrun.md)
from torch.nn.parallel import DistributedDataParallel

dist.init_process_group("gloo")
rank = dist.get_rank()
torch.manual_seed(0)
model = DistributedDataParallel(torch.nn.Linear(4, 2))
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
torch.manual_seed(1 + rank)  # each rank its own batch
loss = model(torch.randn(8, 4)).pow(2).sum()
loss.backward()
optimizer.step()
total = float(sum(p.detach().sum() for p in model.parameters()))
with open(os.path.join(sys.argv[1], f"ddp.{rank}.json"), "w") as f:
    json.dump({"rank": rank, "world_size": dist.get_world_size(), "weights": round(total, 6),
               "local_rank": int(os.environ["LOCAL_RANK"])}, f)
dist.barrier()
del model, optimizer
dist.destroy_process_group()
