"""Benchmark worker of bench/scale.py: say who it is, then sleep.

    scale_worker.py READY_DIR [SECONDS]

Writes READY_DIR/<pid>.ready holding "RANK WORLD_SIZE" (atomically), then sleeps (an hour by default).
"""

import os
import sys
import time

if __name__ == "__main__":
    folder = sys.argv[1]
    tmp = os.path.join(folder, f".{os.getpid()}")
    with open(tmp, "w") as f:
        f.write(f"{os.environ.get('RANK', '-1')} {os.environ.get('WORLD_SIZE', '-1')}")
    os.rename(tmp, os.path.join(folder, f"{os.getpid()}.ready"))
    time.sleep(float(sys.argv[2]) if len(sys.argv) > 2 else 3600)
