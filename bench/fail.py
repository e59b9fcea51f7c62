"""Benchmark worker for failure teardown: one rank exits with code 7, the others sleep.

    fail.py READY_DIR STAMP_FILE [FAILING_RANK]

Every worker marks itself ready in READY_DIR. The failing rank (default 1) waits until all
WORLD_SIZE workers are ready, writes time.time() to STAMP_FILE and exits 7 at once.
"""

import os
import sys
import time

from sleeper import mark_ready

EXIT_CODE = 7


def wait_for_all(folder: str, world: int, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while sum(n.endswith(".ready") for n in os.listdir(folder)) < world:
        if time.monotonic() > deadline:
            sys.exit(f"fail.py: not all {world} workers became ready in {timeout} s")
        time.sleep(0.005)


if __name__ == "__main__":
    ready_dir, stamp_file = sys.argv[1], sys.argv[2]
    failing_rank = int(sys.argv[3]) if len(sys.argv) > 3 else 1
    mark_ready(ready_dir)
    if int(os.environ["RANK"]) != failing_rank:
        time.sleep(600)
        sys.exit(0)
    wait_for_all(ready_dir, int(os.environ["WORLD_SIZE"]))
    with open(stamp_file, "w") as f:
        f.write(repr(time.time()))
    sys.exit(EXIT_CODE)
