"""A real paddle.DataParallel training loop: every rank must end with the same weights.

Writes OUT_DIR/dp.RANK.json: rank, the final loss, the weights' sum.
"""
import json
import os
import sys

import paddle
import paddle.distributed as dist

dist.init_parallel_env()
rank = dist.get_rank()
paddle.seed(1)
model = paddle.DataParallel(paddle.nn.Linear(4, 1))
opt = paddle.optimizer.SGD(learning_rate=0.1, parameters=model.parameters())
paddle.seed(100 + rank)  # each rank its own data: only the gradient all-reduce keeps the weights equal
for _ in range(5):
    x = paddle.randn([8, 4])
    loss = ((model(x) - x.sum(axis=1, keepdim=True)) ** 2).mean()
    loss.backward()
    opt.step()
    opt.clear_grad()
weights = float(sum(p.sum() for p in model.parameters()))
with open(os.path.join(sys.argv[1], f"dp.{rank}.json"), "w") as f:
    json.dump({"rank": rank, "weights": round(weights, 5)}, f)
