# -*- coding: utf-8 -*-
"""Paddle 1.8's single-card MLP example on PyTorch: one process.

    python examples/train_single.py

examples/train_with_fleet.py is this file plus the four marked changes.
"""
import os
import numpy as np
import torch
from torch import nn

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

step = 100
for i in range(step):
    feed = gen_data()
    cost = cost_fn(model(torch.from_numpy(feed["x"]).to(device)), torch.from_numpy(feed["y"]).view(-1).to(device))
    # Change 3 (fleet): these three lines become optimizer.minimize(cost)
    optimizer.zero_grad()
    cost.backward()
    optimizer.step()

    print("step%d cost=%f" % (i, cost.item()))

# save the model
model_path = "./"
if os.path.exists(model_path):
    # Change 4 (fleet): this line becomes fleet.save_persistables(model_path, model, optimizer)
    torch.save(model.state_dict(), os.path.join(model_path, "model.pt"))
