"""A parameter-server trainer that keeps its dense part on CUDA: the servers hold the values (on their
CPU), the trainer's model, batches and gradients are on its GPU; a sparse table too."""

import torch
from torch import nn

from launcher import fleet


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(1000, 8, sparse=True)
        self.fc = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 1))

    def forward(self, ids):
        return self.fc(self.embed(ids).sum(1)).squeeze(-1)


fleet.init(fleet.role_maker.PaddleCloudRoleMaker(is_collective=False))
torch.manual_seed(0)  # every process builds the same model
model = Net()
on_gpu = fleet.is_worker() and torch.cuda.is_available()  # without CUDA the same runs on the CPU (a check of the script)
device = torch.device("cuda", 0) if on_gpu else torch.device("cpu")
model = model.to(device)
optimizer = fleet.distributed_optimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                        fleet.StrategyFactory.create_sync_strategy())
if fleet.is_server():
    fleet.init_server()
    fleet.run_server()
else:
    fleet.init_worker()
    data = torch.Generator().manual_seed(fleet.worker_index())
    losses = []
    for step in range(40):
        ids = torch.randint(1000, (16, 4), generator=data)
        y = ids.float().mean(1) / 1000
        loss = nn.functional.mse_loss(model(ids.to(device)), y.to(device))
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    on = sorted({str(p.device) for p in model.fc.parameters()})
    print(f"PS_CUDA trainer={fleet.worker_index()} first={losses[0]:.5f} last={losses[-1]:.5f} devices={on}", flush=True)
    fleet.stop_worker()
