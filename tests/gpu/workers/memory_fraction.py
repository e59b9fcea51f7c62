"""FLAGS_fraction_of_gpu_memory_to_use caps what torch may take on this worker's GPU: an allocation
of --within of the card succeeds, one of --beyond raises torch.OutOfMemoryError."""

import argparse

import torch

from launcher import runtime

p = argparse.ArgumentParser()
p.add_argument("--within", type=float, required=True)
p.add_argument("--beyond", type=float, required=True)
args = p.parse_args()

env = runtime.init_parallel_env()
total = torch.cuda.get_device_properties(env.device).total_memory


def take(fraction):
    try:
        block = torch.empty(int(total * fraction), dtype=torch.uint8, device=env.device)
        del block
        return "ok"
    except torch.OutOfMemoryError:
        return "oom"


print(f"FRACTION within={take(args.within)} beyond={take(args.beyond)}", flush=True)
