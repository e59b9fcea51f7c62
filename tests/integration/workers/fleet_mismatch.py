"""Ranks build different models: fleet must refuse at wrap time, on every rank, naming the parameter.

    fleet_mismatch.py optimizer|model shapes|extra_layer
"""

import sys

import torch
from torch import nn

from launcher import fleet

api, kind = sys.argv[1], sys.argv[2]
rank = fleet.init(timeout=20).rank
if kind == "shapes":
    model = nn.Linear(4, 6) if rank == 0 else nn.Linear(6, 4)
else:
    model = nn.Sequential(nn.Linear(4, 4), *([nn.Linear(4, 4)] if rank == 1 else []))
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
if api == "model":
    fleet.distributed_model(model)
else:
    fleet.distributed_optimizer(optimizer)
print("wrapped: unexpected", flush=True)
