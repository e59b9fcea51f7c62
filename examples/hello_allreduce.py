"""The smallest distributed job: each worker says who it is and all-reduces rank + 1.

    python -m launcher examples/hello_allreduce.py          # 2 CPU workers (gloo), or one per GPU (NCCL)

A plain torch script: the launcher's variables are the ones torchrun gives, so
init_process_group() finds rank 0's store through MASTER_ADDR and MASTER_PORT.
"""

import os

import torch
import torch.distributed as dist


def main() -> None:
    use_gpu = "FLAGS_selected_gpus" in os.environ and torch.cuda.is_available()
    if use_gpu:
        torch.cuda.set_device(int(os.environ["FLAGS_selected_gpus"]))
    device = torch.device("cuda" if use_gpu else "cpu")
    dist.init_process_group("nccl" if use_gpu else "gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    value = torch.tensor([rank + 1.0], device=device)
    dist.all_reduce(value)
    expected = world * (world + 1) / 2
    print(f"rank {rank} of {world} ({dist.get_backend()} on {device}): "
          f"all_reduce sum = {value.item():g}, expected {expected:g}", flush=True)
    dist.destroy_process_group()
    if value.item() != expected:
        raise SystemExit(1)


if __name__ == "__main__":
    main()
