"""A short fleet script: init, distributed_optimizer, five minimize steps, exit (nothing to tear down by hand)."""

import torch

from launcher import fleet

fleet.init()
model = torch.nn.Linear(4, 2)
optimizer = fleet.distributed_optimizer(torch.optim.SGD(model.parameters(), lr=0.1))
for _ in range(5):
    optimizer.minimize(model(torch.rand(3, 4)).sum())
