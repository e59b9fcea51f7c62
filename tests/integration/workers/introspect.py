"""Records what a worker sees of itself, per attempt; rank 1 fails in the first attempt.

    introspect.py DIR [ARGS...]     (also run as a module: -m introspect, with the folder on PYTHONPATH)
"""

import json
import os
import sys
import time

folder = sys.argv[1]
attempt = int(os.environ["TORCHELASTIC_RESTART_COUNT"])
rank = int(os.environ["RANK"])
record = {
    "argv": sys.argv, "file": __file__, "name": __name__, "path0": sys.path[0],
    "restart": os.environ["PADDLE_RESTART_COUNT"], "rank": rank, "pid": os.getpid(),
    "unbuffered": sys.stdout.write_through, "main": sys.modules["__main__"].__name__,
}
path = os.path.join(folder, f"{attempt}.{rank}.json")
with open(path + ".tmp", "w") as f:
    json.dump(record, f)
os.replace(path + ".tmp", path)
print(f"attempt {attempt} rank {rank} here", flush=True)
if attempt == 0 and rank == 1:  # fail once the other rank has recorded itself too
    deadline = time.monotonic() + 30
    while not os.path.exists(os.path.join(folder, "0.0.json")) and time.monotonic() < deadline:
        time.sleep(0.01)
    sys.exit(5)
hold = os.environ.get("INTROSPECT_HOLD")  # from the second attempt on, wait for this file to appear
deadline = time.monotonic() + 30
while hold and attempt > 0 and not os.path.exists(hold) and time.monotonic() < deadline:
    time.sleep(0.01)
