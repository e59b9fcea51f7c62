"""Writes one line to stdout and one to stderr, each naming the stream and the worker's RANK; with
FAIL_FIRST_ATTEMPT set, rank 1 then exits 3 in the job's first attempt."""

import os
import sys

rank = os.environ["RANK"]
print(f"stdout of {rank}", flush=True)
print(f"stderr of {rank}", file=sys.stderr, flush=True)
if os.environ.get("FAIL_FIRST_ATTEMPT") and rank == "1" and os.environ["TORCHELASTIC_RESTART_COUNT"] == "0":
    sys.exit(3)
