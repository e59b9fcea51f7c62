"""A hung gloo job for the stack tests, started without the launcher (RANK, WORLD_SIZE, MASTER_*).

Rank 1 sleeps before its all_reduce (the line marked SLEEP), so rank 0 waits inside
dist.all_reduce (the line marked ALLREDUCE). Each rank prints "ready" once the group is up.
Nothing lasts longer than --limit seconds, should the test that started it die first.
"""

import argparse
import datetime
import time

import torch
import torch.distributed as dist

p = argparse.ArgumentParser()
p.add_argument("--limit", type=float, default=120.0)
args = p.parse_args()


def step(rank: int) -> None:
    value = torch.ones(1)
    if rank == 1:
        time.sleep(args.limit)  # SLEEP
    dist.all_reduce(value)  # ALLREDUCE


def main() -> None:
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=args.limit))
    print("ready", flush=True)
    step(dist.get_rank())


if __name__ == "__main__":
    main()
