# -*- coding: utf-8 -*-
"""Paddle 1.8's train_with_fleet.py example on PyTorch: every worker of a job.

    python -m launcher --nproc_per_node 2 examples/train_with_fleet.py    # 2 CPU workers, gloo
    python -m launcher --selected_gpus 0,1 examples/train_with_fleet.py   # 2 GPUs, NCCL
    python examples/train_with_fleet.py                                   # alone: a world of one

It is examples/train_single.py plus the four marked changes, and it keeps every line of Paddle's
listing that PyTorch lets it keep (the data, the strategy, the role, the loop, the save's guard).
"""
import os
import numpy as np
import torch
from torch import nn
# Change 1: import the distributed training library
from launcher import fleet
from launcher.fleet import DistributedStrategy, role_maker

# define the network: fc(1280, tanh) -> fc(1280, tanh) -> fc(2); the softmax is in the loss
def mlp(input_dim=32, hid_dim=1280, label_dim=2):
    return nn.Sequential(nn.Linear(input_dim, hid_dim), nn.Tanh(),
                         nn.Linear(hid_dim, hid_dim), nn.Tanh(),
                         nn.Linear(hid_dim, label_dim))

# generate the data: fresh random batches of 128 in every process, as in Paddle's example
def gen_data():
    return {"x": np.random.random(size=(128, 32)).astype('float32'),
            "y": np.random.randint(2, size=(128, 1)).astype('int64')}

gpu_id = int(os.getenv("FLAGS_selected_gpus", "0"))
print(gpu_id)
device = torch.device("cuda", gpu_id) if torch.cuda.is_available() else torch.device("cpu")
model = mlp().to(device)

# define the loss: softmax cross-entropy, averaged over the batch
cost_fn = nn.CrossEntropyLoss()
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)

# Change 2: the training strategy and the cluster role (from the launcher's variables)
dist_strategy = DistributedStrategy()
role = role_maker.PaddleCloudRoleMaker(is_collective=True)
fleet.init(role)

# Change 3: wrap the optimizer (every rank starts from rank 0's parameters)
optimizer = fleet.distributed_optimizer(optimizer, strategy=DistributedStrategy())

step = 100
for i in range(step):
    feed = gen_data()
    cost = cost_fn(model(torch.from_numpy(feed["x"]).to(device)), torch.from_numpy(feed["y"]).view(-1).to(device))
    # Change 3: zero the gradients, backward, all-reduce the averaged gradients, step
    optimizer.minimize(cost)

    print("step%d cost=%f" % (i, cost.item()))

# save the model
model_path = "./"
if os.path.exists(model_path):
    # Change 4: the distributed save: only the first worker writes
    fleet.save_persistables(model_path, model, optimizer)
