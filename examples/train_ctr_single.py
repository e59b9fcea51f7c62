# -*- coding: utf-8 -*-
"""A CTR-like model on PyTorch, one process: a large sparse embedding (nn.Embedding(sparse=True))
of the categorical features under a small MLP.

    python examples/train_ctr_single.py

examples/train_ctr_ps.py is this file in Fleet's parameter-server mode (the marked lines differ).
"""
import os

import torch
from torch import nn

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

torch.manual_seed(0)  # every process builds the same model
model = CTR()
loss_fn = nn.BCEWithLogitsLoss()
optimizer = torch.optim.SGD(model.parameters(), lr=0.5)

for step in range(200):
    ids, clicks = gen_data()
    loss = loss_fn(model(ids), clicks)
    optimizer.zero_grad()  # PS: these three lines become optimizer.minimize(loss)
    loss.backward()  # PS
    optimizer.step()  # PS
    if step % 50 == 0:
        print("step %d loss %.4f" % (step, loss.item()))

os.makedirs("./output", exist_ok=True)  # PS: these two lines become fleet.save_persistables("./output", model)
torch.save(model.state_dict(), "./output/model.pt")  # PS
