"""A real Paddle collective program, as Paddle's docs write it: init_parallel_env + all_reduce.

Writes OUT_DIR/collective.RANK.json: rank, world size, the all_reduce sum, fleet's local rank.
"""
import json
import os
import sys

import paddle
import paddle.distributed as dist

dist.init_parallel_env()
rank, world = dist.get_rank(), dist.get_world_size()
x = paddle.to_tensor([float(rank + 1)])
dist.all_reduce(x)
result = {"rank": rank, "world": world, "sum": float(x.numpy()[0])}
with open(os.path.join(sys.argv[1], f"collective.{rank}.json"), "w") as f:
    json.dump(result, f)
