"""A parameter frozen when fleet wraps the model or optimizer, unfrozen after a step: fleet must stop on every
rank, naming it, before the ranks drift apart.

    fleet_unfrozen.py optimizer|model
"""

import sys

import torch
from torch import nn

from launcher import fleet

api = sys.argv[1]
rank = fleet.init(timeout=20).rank
torch.manual_seed(0)
model = nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 1))
model[0].weight.requires_grad_(False)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
net = fleet.distributed_model(model) if api == "model" else model
opt = optimizer if api == "model" else fleet.distributed_optimizer(optimizer)
for step in range(3):
    if step == 1:
        model[0].weight.requires_grad_(True)
    x = torch.full((2, 4), float(rank + step))
    opt.zero_grad()
    net(x).sum().backward()
    opt.step()
    print(f"step {step} done", flush=True)
print("trained: unexpected", flush=True)
