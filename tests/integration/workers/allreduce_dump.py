"""A torchrun-style worker: gloo with the default env:// init, one all-reduce, a JSON record."""

import json
import os
import sys

import torch
import torch.distributed as dist

dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
t = torch.tensor([float(rank + 1)])
dist.all_reduce(t)
names = ["RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK", "MASTER_ADDR", "MASTER_PORT",
         "PADDLE_TRAINER_ID", "PADDLE_TRAINERS_NUM", "PADDLE_CURRENT_ENDPOINT", "PADDLE_TRAINER_ENDPOINTS"]
record = {"rank": rank, "world": world, "sum": t.item(), "env": {k: os.environ.get(k) for k in names}}
with open(os.path.join(sys.argv[1], f"allreduce.{rank}.json"), "w") as f:
    json.dump(record, f)
print(f"rank {rank}/{world}: sum {t.item()}", flush=True)
dist.destroy_process_group()
