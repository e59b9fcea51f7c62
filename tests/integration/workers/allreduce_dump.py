"""A torchrun-style worker: gloo with the default env:// init, one all-reduce, a JSON record.
With WORKER_GROUP=store it imports no torch: its group is store_group.py's; the same sum and record."""

import json
import os
import sys

if os.environ.get("WORKER_GROUP") == "store":
    from store_group import group

    made = group()
    rank, world, close = made.rank, made.world, made.close
    total = made.all_reduce(float(rank + 1))
else:
    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    t = torch.tensor([float(rank + 1)])
    dist.all_reduce(t)
    total, close = t.item(), dist.destroy_process_group
names = ["RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK", "MASTER_ADDR", "MASTER_PORT",
         "PADDLE_TRAINER_ID", "PADDLE_TRAINERS_NUM", "PADDLE_CURRENT_ENDPOINT", "PADDLE_TRAINER_ENDPOINTS"]
record = {"rank": rank, "world": world, "sum": total, "env": {k: os.environ.get(k) for k in names}}
with open(os.path.join(sys.argv[1], f"allreduce.{rank}.json"), "w") as f:
    json.dump(record, f)
print(f"rank {rank}/{world}: sum {total}", flush=True)
close()
