"""Benchmark worker: say "ready" (optionally), then sleep.

    sleeper.py SECONDS [READY_DIR]

With READY_DIR, writes READY_DIR/<rank>.ready holding this process's pid, atomically, before sleeping.
"""

import os
import sys
import time


def mark_ready(folder: str) -> None:
    rank = os.environ.get("RANK", "x")
    tmp = os.path.join(folder, f".{rank}.{os.getpid()}")
    with open(tmp, "w") as f:
        f.write(str(os.getpid()))
    os.rename(tmp, os.path.join(folder, f"{rank}.ready"))


if __name__ == "__main__":
    if len(sys.argv) > 2:
        mark_ready(sys.argv[2])
    time.sleep(float(sys.argv[1]))
