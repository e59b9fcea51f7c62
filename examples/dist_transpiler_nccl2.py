# -*- coding: utf-8 -*-
"""Seed 002's NCCL2-mode listing (分布式同步训练, "NCCL2 模式分布式训练") on PyTorch, around seed 000's MLP.

    python -m launcher --nproc_per_node 2 examples/dist_transpiler_nccl2.py    # 2 CPU workers (gloo)
    python -m launcher --selected_gpus 0,1 examples/dist_transpiler_nccl2.py   # 2 GPUs (NCCL)

The transpile call is the seed's, with program=model (there is no startup program to pass). After
it, every backward averages the gradients over the trainers, so the plain torch optimizer trains
data-parallel, as Paddle's executor did after an nccl2 transpile.
"""
import os

import torch
from torch import nn

from launcher import transpiler as fluid  # fluid.DistributeTranspilerConfig, fluid.DistributeTranspiler

trainer_id = int(os.getenv("PADDLE_TRAINER_ID", "0"))
gpu_id = int(os.getenv("FLAGS_selected_gpus", "0"))
device = torch.device("cuda", gpu_id) if torch.cuda.is_available() else torch.device("cpu")
main_program = nn.Sequential(nn.Linear(32, 1280), nn.Tanh(), nn.Linear(1280, 1280), nn.Tanh(),
                             nn.Linear(1280, 2)).to(device)
optimizer = torch.optim.SGD(main_program.parameters(), lr=0.01)

config = fluid.DistributeTranspilerConfig()
config.mode = "nccl2"
t = fluid.DistributeTranspiler(config=config)
t.transpile(trainer_id,
            program=main_program,
            trainers=os.getenv("PADDLE_TRAINER_ENDPOINTS", "192.168.0.1:6174,192.168.0.2:6174"),
            current_endpoint=os.getenv("PADDLE_CURRENT_ENDPOINT", "192.168.0.1:6174"))

generator = torch.Generator().manual_seed(trainer_id)  # each trainer its own batches
for i in range(20):
    x, y = torch.rand(128, 32, generator=generator), torch.randint(2, (128,), generator=generator)
    cost = nn.functional.cross_entropy(main_program(x.to(device)), y.to(device))
    optimizer.zero_grad()
    cost.backward()  # averages the gradients over the trainers
    optimizer.step()
    print("step%d cost=%f" % (i, cost.item()))
checksum = sum(p.detach().double().sum().item() for p in main_program.parameters())
print("parameters checksum %.10f" % checksum)  # the same on every trainer
