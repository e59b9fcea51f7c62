"""Benchmark worker for the comparison with Paddle's launcher; reads Paddle's variables only.

    paddle_worker.py MODE READY_DIR [ARG]

MODE: ``exit`` (exit 0 at once), ``sleep`` (mark ready, sleep ARG seconds), ``fail`` (mark ready; rank 1
waits for every rank, then exits 7; the others sleep), ``spew`` (write ARG MB of 100-byte lines, exit 0).
"""

import os
import sys
import time

rank = int(os.environ["PADDLE_TRAINER_ID"])
world = int(os.environ["PADDLE_TRAINERS_NUM"])
mode, folder = sys.argv[1], sys.argv[2]


def mark_ready() -> None:
    tmp = os.path.join(folder, f".{rank}.{os.getpid()}")
    with open(tmp, "w") as f:
        f.write(str(os.getpid()))
    os.rename(tmp, os.path.join(folder, f"{rank}.ready"))


if mode == "exit":
    sys.exit(0)
if mode == "spew":
    block = b"".join(f"bench r{rank} n{i:010d} ".encode().ljust(99, b".") + b"\n" for i in range(100))
    for _ in range(int(float(sys.argv[3]) * 10_000 // 100)):
        os.write(1, block)
    sys.exit(0)
mark_ready()
if mode == "fail" and rank == 1:
    deadline = time.monotonic() + 60
    while sum(n.endswith(".ready") for n in os.listdir(folder)) < world and time.monotonic() < deadline:
        time.sleep(0.01)
    with open(os.path.join(folder, "stamp"), "w") as f:
        f.write(repr(time.time()))
    sys.exit(7)
time.sleep(float(sys.argv[3]) if len(sys.argv) > 3 else 60)
