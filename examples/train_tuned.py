# -*- coding: utf-8 -*-
"""Paddle 1.8's tuned collective example on PyTorch.

    FLAGS_fuse_parameter_memory_size=16 python -m launcher --nproc_per_node 2 examples/train_tuned.py

docs/fleet.md says what each setting does on PyTorch.
"""
import os

import torch
from torch import nn
from launcher import fleet

# some of the tuning settings
# 2 suggested for several nodes, 1 for one node
nccl_comm_num = 2
# nccl_comm_num + 1 suggested for several nodes, 1 for one node
num_threads = 3
# scope drop frequency (warned about: PyTorch has no scopes to drop)
num_iteration_per_drop_scope = 30
# fuse the gradients' all-reduces into buckets
fuse_all_reduce_ops = True
# fetch (copy the loss to the host and print it) every this many steps
fetch_frequency = 2

def mlp(input_dim=32, hid_dim=1280, label_dim=2):
    return nn.Sequential(nn.Linear(input_dim, hid_dim), nn.Tanh(),
                         nn.Linear(hid_dim, hid_dim), nn.Tanh(),
                         nn.Linear(hid_dim, label_dim))

generator = torch.Generator()
generator.seed()

def gen_data():
    return {"x": torch.rand(128, 32, generator=generator),
            "y": torch.randint(2, (128,), generator=generator)}

gpu_id = int(os.getenv("FLAGS_selected_gpus", "0"))
device = torch.device("cuda", gpu_id) if torch.cuda.is_available() else torch.device("cpu")
model = mlp().to(device)
cost_fn = nn.CrossEntropyLoss()
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)

role = fleet.role_maker.PaddleCloudRoleMaker(is_collective=True)
fleet.init(role)

dist_strategy = fleet.DistributedStrategy()
dist_strategy.nccl_comm_num = nccl_comm_num
exec_strategy = fleet.ExecutionStrategy()
exec_strategy.num_threads = num_threads
exec_strategy.num_iteration_per_drop_scope = num_iteration_per_drop_scope
dist_strategy.exec_strategy = exec_strategy
dist_strategy.fuse_all_reduce_ops = fuse_all_reduce_ops

optimizer = fleet.distributed_optimizer(optimizer, strategy=dist_strategy)

step = 100
for i in range(step):
    data = gen_data()
    cost = cost_fn(model(data["x"].to(device)), data["y"].to(device))
    optimizer.minimize(cost)
    # fetch frequency
    if i % fetch_frequency == 0:
        print("step%d cost=%f" % (i, cost.item()))

model_path = "./output"
fleet.save_persistables(model_path, model, optimizer)
