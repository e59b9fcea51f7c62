"""Rank 1 stays alive but never joins the all-reduce; rank 0's collective must fail after fleet.init's timeout.

    fleet_stuck.py TIMEOUT_S
"""

import sys
import time

import torch
import torch.distributed as dist

from launcher import fleet

rank = fleet.init(timeout=float(sys.argv[1])).rank
if rank == 1:
    time.sleep(120)  # stuck, alive
started = time.monotonic()
try:
    dist.all_reduce(torch.ones(2))
finally:
    print(f"all_reduce gave up after {time.monotonic() - started:.1f} s", flush=True)
