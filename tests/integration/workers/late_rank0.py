"""Rank 0 starts SECONDS late; every rank then joins torch's env:// rendezvous (gloo) and a barrier.

Writes DIR/late.RANK.ATTEMPT.json: when (time.time()) the rank arrived at init_process_group and when it
passed the first barrier, TORCHELASTIC_USE_AGENT_STORE, and whether the store at MASTER_PORT already held
this rank's mark (``stale``: set there, without torch's per-attempt prefix, by every attempt). With
FAIL_FIRST set, rank 1 exits 1 after the barrier of the first attempt (a restart then follows).
Usage: late_rank0.py DIR SECONDS
"""

import json
import os
import sys
import time
from datetime import timedelta

import torch.distributed as dist

folder, late = sys.argv[1], float(sys.argv[2])
rank, attempt = int(os.environ["RANK"]), int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
if rank == 0:
    time.sleep(late)
arrived = time.time()
dist.init_process_group("gloo", init_method="env://")
dist.barrier()
passed = time.time()
raw = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), None, False, timeout=timedelta(seconds=60))
stale = raw.check([f"mark.{rank}"])
raw.set(f"mark.{rank}", str(attempt))
with open(os.path.join(folder, f"late.{rank}.{attempt}.json"), "w") as f:
    json.dump({"arrived": arrived, "passed": passed, "agent_store": os.environ.get("TORCHELASTIC_USE_AGENT_STORE"),
               "launched": dist.is_torchelastic_launched(), "stale": stale}, f)
dist.barrier()
dist.destroy_process_group()
if os.environ.get("FAIL_FIRST") and attempt == 0 and rank == 1:
    sys.exit(1)
