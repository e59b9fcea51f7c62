"""Benchmark worker for a 2-worker job: gloo init through env://, one all-reduce, exit.

Exits 3 when the all-reduce gives a wrong sum.
"""

import sys

import torch
import torch.distributed as dist


def main() -> int:
    dist.init_process_group("gloo")
    t = torch.ones(4)
    dist.all_reduce(t)
    ok = bool((t == dist.get_world_size()).all())
    dist.destroy_process_group()
    return 0 if ok else 3


if __name__ == "__main__":
    sys.exit(main())
