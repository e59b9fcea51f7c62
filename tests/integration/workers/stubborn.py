"""A first attempt whose stop needs SIGKILL; every later attempt exits 0.

    stubborn.py DIR [go]

Attempt 0: rank 0 ignores SIGTERM and sleeps; rank 1 waits until rank 0 has said so
(DIR/ignoring), and with ``go`` until DIR/go is there too, then exits 3. Attempt 1 and later:
each rank writes its cgroup to DIR/cgroup.RANK, says "attempt N rank R here" and exits 0.
"""

import os
import signal
import sys
import time

folder = sys.argv[1]
rank = os.environ["RANK"]
if os.environ["TORCHELASTIC_RESTART_COUNT"] != "0":
    with open("/proc/self/cgroup") as f, open(os.path.join(folder, f"cgroup.{rank}"), "w") as out:
        out.write(f.read())
    print(f"attempt {os.environ['TORCHELASTIC_RESTART_COUNT']} rank {rank} here")
    sys.exit(0)
if rank == "0":
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    open(os.path.join(folder, "ignoring"), "w").close()
    time.sleep(60)
    sys.exit(0)
awaited = ["ignoring"] + (["go"] if sys.argv[2:] == ["go"] else [])
deadline = time.monotonic() + 30
while not all(os.path.exists(os.path.join(folder, n)) for n in awaited) and time.monotonic() < deadline:
    time.sleep(0.01)
sys.exit(3)
