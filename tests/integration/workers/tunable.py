"""A program whose best settings are known, for launcher tune's tests: its step time is made of sleeps, so that the
answer holds on a busy machine. It imports no torch (but with TUNABLE_FLEET=1: see the end).

    tunable.py [--batch-size N] [--steps N]

Each step sleeps 0.04 s, 0.02 s with LAUNCHER_STRATEGY's use_local_sgd true, and reports
report(step=step, samples=N * (step + 1)): --batch-size 32 and use_local_sgd are each twice as fast in samples/s.
TUNE_MODE: crash (exit 3 at step 2), hang (reports 3 steps, then sleeps), silent (no report; ends after 1 s).
--steps N: ends by itself after N steps (default: runs for 120 s at most).
TUNABLE_FLEET=1: fleet.init and distributed_optimizer with a strategy of the program's own (use_local_sgd False), then
prints the strategy in force and this worker's arguments, and ends."""

import argparse
import json
import os
import sys
import time

from launcher.runtime import report

p = argparse.ArgumentParser()
p.add_argument("--batch-size", type=int, default=16)
p.add_argument("--steps", type=int, default=0)
args = p.parse_args()
strategy = json.loads(os.environ.get("LAUNCHER_STRATEGY") or "{}")

if os.environ.get("TUNABLE_FLEET") == "1":
    import torch
    from launcher import fleet

    fleet.init(is_collective=True)
    own = fleet.DistributedStrategy()
    own.use_local_sgd = False
    fleet.distributed_optimizer(torch.optim.SGD(torch.nn.Linear(2, 2).parameters(), lr=0.1), own)
    print(f"in force: use_local_sgd={own.use_local_sgd} batch={args.batch_size}", flush=True)
    sys.exit(0)

mode = os.environ.get("TUNE_MODE", "ok")
pause = 0.02 if strategy.get("use_local_sgd") else 0.04
if mode == "silent":
    time.sleep(1)
    sys.exit(0)
end = time.monotonic() + 120
step = 0
while time.monotonic() < end and (not args.steps or step < args.steps):
    if mode == "crash" and step == 2:
        print("tunable: crashing as asked", flush=True)
        sys.exit(3)
    if mode == "hang" and step == 3:
        time.sleep(3600)
    time.sleep(pause)
    report(step=step, samples=args.batch_size * (step + 1))
    step += 1
