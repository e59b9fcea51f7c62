# -*- coding: utf-8 -*-
"""examples/train_ctr_single.py in Fleet's parameter-server mode: 2 servers hold the parameters
(the embedding's rows sharded by id % servers), 2 trainers compute gradients.

    python -m launcher --server_num 2 --worker_num 2 examples/train_ctr_ps.py
    python -m launcher --servers 10.0.0.1:6170,10.0.0.2:6170 --workers 10.0.0.3:6170,10.0.0.4:6170 examples/train_ctr_ps.py

The marked lines (PS) are the difference.
"""
import os

import torch
from torch import nn

from launcher import fleet  # PS

SLOTS, VOCAB, DIM = 8, 100_000, 16

class CTR(nn.Module):
    def __init__(self):
        super().__init__()
        self.embedding = nn.Embedding(VOCAB, DIM, sparse=True)  # sparse gradients: only the batch's rows
        self.mlp = nn.Sequential(nn.Linear(SLOTS * DIM, 64), nn.ReLU(), nn.Linear(64, 1))

    def forward(self, ids):
        return self.mlp(self.embedding(ids).flatten(1)).squeeze(1)

# synthetic clicks: skewed ids (a few are frequent, as in real logs); a click when the first one is even
generator = torch.Generator().manual_seed(int(os.getenv("PADDLE_TRAINER_ID", "0")))

def gen_data(batch=256):
    ids = (torch.rand(batch, SLOTS, generator=generator) ** 6 * VOCAB).long()
    return ids, (ids[:, 0] % 2 == 0).float()

fleet.init(fleet.role_maker.PaddleCloudRoleMaker(is_collective=False))  # PS
torch.manual_seed(0)  # every process builds the same model
model = CTR()
loss_fn = nn.BCEWithLogitsLoss()
optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
strategy = fleet.StrategyFactory.create_async_strategy()  # PS: or sync, half_async, geo(update_frequency)
optimizer = fleet.distributed_optimizer(optimizer, strategy)  # PS

if fleet.is_server():  # PS
    fleet.init_server()  # PS: takes this server's slices and rows
    fleet.run_server()  # PS: until every trainer called stop_worker
else:  # PS
    fleet.init_worker()  # PS
    for step in range(200):
        ids, clicks = gen_data()
        loss = loss_fn(model(ids), clicks)
        optimizer.minimize(loss)  # PS
        if step % 50 == 0:
            print("step %d loss %.4f" % (step, loss.item()))

    fleet.save_persistables("./output", model)  # PS: trainer 0 writes ./output/model.pt
    fleet.stop_worker()  # PS
