"""A real fleet collective program: fleet.init(is_collective=True), a distributed optimizer, fleet's ranks.

Writes OUT_DIR/fleet.RANK.json.
"""
import json
import os
import sys

import paddle
import paddle.distributed as dist
from paddle.distributed import fleet

fleet.init(is_collective=True)
rank = fleet.worker_index()
paddle.seed(1)
model = fleet.distributed_model(paddle.nn.Linear(4, 1))
opt = fleet.distributed_optimizer(paddle.optimizer.SGD(learning_rate=0.1, parameters=model.parameters()))
paddle.seed(100 + rank)
for _ in range(3):
    x = paddle.randn([8, 4])
    loss = (model(x) ** 2).mean()
    loss.backward()
    opt.step()
    opt.clear_grad()
x = paddle.to_tensor([1.0])
dist.all_reduce(x)
weights = float(sum(p.sum() for p in model.parameters()))
result = {"rank": rank, "workers": fleet.worker_num(), "local_rank": fleet.local_rank(),
          "first_worker": fleet.is_first_worker(), "sum": float(x.numpy()[0]), "weights": round(weights, 5)}
with open(os.path.join(sys.argv[1], f"fleet.{rank}.json"), "w") as f:
    json.dump(result, f)
