"""init_process_group("gloo") with the init method given (env:// or tcp://HOST:PORT), then an
all_reduce of a one-hot tensor of its rank: the sum must be the world size.

usage: init_method.py INIT_METHOD
"""

import os
import sys

import torch
import torch.distributed as dist

dist.init_process_group("gloo", init_method=sys.argv[1], world_size=int(os.environ["WORLD_SIZE"]),
                        rank=int(os.environ["RANK"]))
world = dist.get_world_size()
one_hot = torch.zeros(world, dtype=torch.int64)
one_hot[dist.get_rank()] = 1
dist.all_reduce(one_hot)
if int(one_hot.sum()) != world:
    sys.exit(f"the all_reduce gave {int(one_hot.sum())}, not the world size {world}")
dist.barrier()
dist.destroy_process_group()
print(f"rank {os.environ['RANK']} of {world}: done", flush=True)
