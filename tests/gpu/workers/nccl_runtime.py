"""One job through launcher.runtime on GPUs: NCCL chosen, the device set, an all-reduce on CUDA."""

import torch
import torch.distributed as dist

from launcher import runtime

env = runtime.init_parallel_env()
value = torch.full((1024,), float(env.rank + 1), device=env.device)
dist.all_reduce(value)
expected = env.world_size * (env.world_size + 1) / 2
print(f"NCCL_RESULT rank={env.rank} backend={env.backend} device={env.device} "
      f"current={torch.cuda.current_device()} sum={value[0].item():g} expected={expected:g}", flush=True)
assert env.backend == "nccl" and value.eq(expected).all()
