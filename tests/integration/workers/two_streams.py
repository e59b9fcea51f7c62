"""Writes one line to stdout and one to stderr, each naming the stream and the worker's RANK. With
FAIL_FIRST_ATTEMPT=<folder>, rank 1 then exits 3 in the job's first attempt, once rank 0 has written
its lines (rank 0 leaves a mark in that folder), so that the stop never comes before them."""

import os
import sys
import time

rank = os.environ["RANK"]
print(f"stdout of {rank}", flush=True)
print(f"stderr of {rank}", file=sys.stderr, flush=True)
folder = os.environ.get("FAIL_FIRST_ATTEMPT")
if folder and os.environ["TORCHELASTIC_RESTART_COUNT"] == "0":
    mark = os.path.join(folder, "rank0-wrote")
    if rank == "0":
        open(mark, "w").close()
    elif rank == "1":
        deadline = time.monotonic() + 60  # a hang guard: the test fails on the missing line
        while not os.path.exists(mark) and time.monotonic() < deadline:
            time.sleep(0.02)
        sys.exit(3)
