"""Rank 1 calls sys.exit(3) while rank 0 waits in an all-reduce: the job must end with 3, soon.

    fleet_exit_code.py
"""

import sys

import torch
import torch.distributed as dist

from launcher import fleet

if fleet.init(timeout=120).rank == 1:
    sys.exit(3)
dist.all_reduce(torch.ones(2))
