"""Seed 002's nccl2 flow with a plain torch optimizer: after transpile, training must be data-parallel.

    transpiler_nccl2.py OUT_DIR
Every rank writes OUT_DIR/nccl2.RANK.json: its largest difference to one process trained on the whole batch.
"""

import json
import os
import sys

import torch
from torch import nn

from launcher.transpiler import DistributeTranspiler, DistributeTranspilerConfig


def batch(step, rank=None, size=8):
    g = torch.Generator().manual_seed(100 + step)
    x, y = torch.rand(2 * size, 4, generator=g), torch.randint(0, 2, (2 * size,), generator=g)
    return (x, y) if rank is None else (x[rank * size:(rank + 1) * size], y[rank * size:(rank + 1) * size])


def mlp(seed):
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(4, 16), nn.Tanh(), nn.Linear(16, 2))


trainer_id = int(os.environ["PADDLE_TRAINER_ID"])
model, reference = mlp(trainer_id), mlp(0)  # rank 1 starts elsewhere: transpile gives it trainer 0's parameters
config = DistributeTranspilerConfig()
config.mode = "nccl2"
t = DistributeTranspiler(config=config)
t.transpile(trainer_id, program=model, trainers=os.environ["PADDLE_TRAINER_ENDPOINTS"],
            current_endpoint=os.environ["PADDLE_CURRENT_ENDPOINT"])
optimizer = torch.optim.Adam(model.parameters(), lr=0.05)  # a plain optimizer, no fleet wrapper
ref_opt = torch.optim.Adam(reference.parameters(), lr=0.05)
for step in range(6):
    optimizer.zero_grad()
    nn.functional.cross_entropy(model(batch(step, trainer_id)[0]), batch(step, trainer_id)[1]).backward()
    optimizer.step()
    ref_opt.zero_grad()
    nn.functional.cross_entropy(reference(batch(step)[0]), batch(step)[1]).backward()
    ref_opt.step()
diff = max((p - q).abs().max().item() for p, q in zip(model.parameters(), reference.parameters()))
with open(os.path.join(sys.argv[1], f"nccl2.{trainer_id}.json"), "w") as f:
    json.dump({"diff": diff}, f)
