"""A plain torch NCCL job that hangs: a few all-reduces, then rank 0 waits in one that rank 1 never
joins (with one rank, the job sleeps without a word). The launcher's --hang_timeout stops it."""

import os
import time

import torch
import torch.distributed as dist

torch.cuda.set_device(int(os.environ["FLAGS_selected_gpus"]))
dist.init_process_group("nccl")
x = torch.ones(1 << 20, device="cuda")
for _ in range(5):
    dist.all_reduce(x)
torch.cuda.synchronize()
print("collectives done; hanging now", flush=True)
if dist.get_world_size() > 1 and dist.get_rank() == 0:
    dist.all_reduce(x)  # waits for rank 1, which sleeps
    torch.cuda.synchronize()
time.sleep(300)
