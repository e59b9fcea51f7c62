# -*- coding: utf-8 -*-
"""Paddle 1.8's train_with_fleet.py example on PyTorch: every worker of a job.

    python -m launcher --nproc_per_node 2 examples/train_with_fleet.py    # 2 CPU workers, gloo
    python -m launcher --selected_gpus 0,1 examples/train_with_fleet.py   # 2 GPUs, NCCL
    python examples/train_with_fleet.py                                   # alone: a world of one

It is examples/train_single.py plus the four marked changes.
"""
import os

import torch
from torch import nn
# Change 1: import the distributed training library
from launcher import fleet

# define the network: fc(1280, tanh) -> fc(1280, tanh) -> fc(2); the softmax is in the loss
def mlp(input_dim=32, hid_dim=1280, label_dim=2):
    return nn.Sequential(nn.Linear(input_dim, hid_dim), nn.Tanh(),
                         nn.Linear(hid_dim, hid_dim), nn.Tanh(),
                         nn.Linear(hid_dim, label_dim))

# generate the data: fresh random batches of 128 in every process, like np.random in Paddle's example
generator = torch.Generator()
generator.seed()

def gen_data():
    return {"x": torch.rand(128, 32, generator=generator),
            "y": torch.randint(2, (128,), generator=generator)}

gpu_id = int(os.getenv("FLAGS_selected_gpus", "0"))
device = torch.device("cuda", gpu_id) if torch.cuda.is_available() else torch.device("cpu")
model = mlp().to(device)

# define the loss: softmax cross-entropy, averaged over the batch
cost_fn = nn.CrossEntropyLoss()

# define the optimizer
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)

# Change 2: the training strategy and the cluster role (from the launcher's variables)
dist_strategy = fleet.DistributedStrategy()
role = fleet.role_maker.PaddleCloudRoleMaker(is_collective=True)
fleet.init(role)

# Change 3: wrap the optimizer (every rank starts from rank 0's parameters)
optimizer = fleet.distributed_optimizer(optimizer, strategy=dist_strategy)

step = 100
# train
for i in range(step):
    data = gen_data()
    cost = cost_fn(model(data["x"].to(device)), data["y"].to(device))
    # Change 3: zero the gradients, backward, all-reduce the averaged gradients, step
    optimizer.minimize(cost)

    print("step%d cost=%f" % (i, cost.item()))

# save the model
model_path = "./output"
# Change 4: the distributed save: only the first worker writes
fleet.save_persistables(model_path, model, optimizer)
