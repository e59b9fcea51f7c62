"""A hung gloo job for --hang_timeout across nodes (under the launcher: RANK, WORLD_SIZE, MASTER_*).

As in hang_allreduce.py, rank 0 waits inside dist.all_reduce (the line marked ALLREDUCE) while
rank 1 sleeps before its own (the line marked SLEEP). Differences:
- until the process group is up, each rank writes "starting" every second, so that a slow
  import of torch on a loaded machine is never taken for a hang; then "ready";
- with --talk S, rank 1 writes one more line S seconds after "ready", so that its node goes
  quiet S seconds after rank 0's;
- with --without_torch, no process group (for a test of the launchers' part only, where the stacks are
  not read): each rank is "ready" at once, rank 0 waits in a sleep on the line marked ALLREDUCE.
Nothing lasts longer than --limit seconds.
"""

import argparse
import threading
import time

p = argparse.ArgumentParser()
p.add_argument("--limit", type=float, default=120.0)
p.add_argument("--talk", type=float, default=0.0)
p.add_argument("--without_torch", action="store_true")
args = p.parse_args()

up = threading.Event()


def chatter() -> None:
    while not up.wait(1.0):
        print("starting", flush=True)


threading.Thread(target=chatter, daemon=True).start()

import datetime  # noqa: E402
import os  # noqa: E402

if not args.without_torch:
    import torch  # noqa: E402
    import torch.distributed as dist  # noqa: E402


def step(rank: int) -> None:
    value = None if args.without_torch else torch.ones(1)
    if rank == 1:
        if args.talk:
            time.sleep(args.talk)
            print("still here", flush=True)
        time.sleep(args.limit)  # SLEEP
    if args.without_torch:
        time.sleep(args.limit)  # rank 0's wait, where it would all-reduce
    else:
        dist.all_reduce(value)  # ALLREDUCE


def main() -> None:
    if not args.without_torch:
        dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=args.limit))
    up.set()
    print("ready", flush=True)
    step(int(os.environ["RANK"]))


if __name__ == "__main__":
    main()
