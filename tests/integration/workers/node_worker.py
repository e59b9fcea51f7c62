"""A worker for the tests of jobs across several nodes (tests/integration/test_many_nodes.py).

--dump DIR         write DIR/env.RANK.ATTEMPT.json (rank, pid, the restart counts) once started
--fail-rank R      rank R exits with --code after --delay seconds, writing time.time() to
                   DIR/exit.RANK.ATTEMPT just before it exits (DIR: --dump)
--world N          the failing rank first waits (at most 60 s) until N ranks of its attempt have dumped
--fail-once FILE   with --fail-rank: fail only when FILE does not exist yet (creating it)
--sleep S          every other rank (and rank R when it does not fail) sleeps S seconds, then exits 0;
                   --sleep-restarted S instead on attempts after the first
--until FILE       ... or until FILE exists, whichever comes first ({node} in FILE: this node's index)
--term-delay S     on SIGTERM, take S seconds before exiting (143)
"""

import argparse
import glob
import json
import os
import signal
import sys
import time

p = argparse.ArgumentParser()
p.add_argument("--dump", required=True)
p.add_argument("--fail-rank", type=int, default=-1)
p.add_argument("--code", type=int, default=7)
p.add_argument("--delay", type=float, default=0.0)
p.add_argument("--fail-once")
p.add_argument("--world", type=int, default=0)
p.add_argument("--sleep", type=float, default=0.0)
p.add_argument("--sleep-restarted", type=float)
p.add_argument("--until")
p.add_argument("--term-delay", type=float)
args = p.parse_args()

if args.term_delay is not None:
    def slow_exit(signum, frame):
        time.sleep(args.term_delay)
        os._exit(128 + signum)

    signal.signal(signal.SIGTERM, slow_exit)

rank = int(os.environ["RANK"])
attempt = int(os.environ.get("PADDLE_RESTART_COUNT", "0"))
record = {
    "rank": rank,
    "pid": os.getpid(),
    "node": os.environ.get("GROUP_RANK"),
    "env": {k: os.environ.get(k) for k in ("PADDLE_RESTART_COUNT", "TORCHELASTIC_RESTART_COUNT", "RANK",
                                           "GROUP_RANK", "LAUNCHER_RUN_ID")},
}
path = os.path.join(args.dump, f"env.{rank}.{attempt}.json")
with open(path + ".tmp", "w") as f:
    json.dump(record, f)
os.replace(path + ".tmp", path)
print(f"rank {rank} attempt {attempt} up", flush=True)

fails = rank == args.fail_rank
if fails and args.fail_once:
    try:
        os.close(os.open(args.fail_once, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
    except FileExistsError:
        fails = False

if fails:
    limit = time.monotonic() + 60
    pattern = os.path.join(args.dump, f"env.*.{attempt}.json")
    while len(glob.glob(pattern)) < args.world and time.monotonic() < limit:
        time.sleep(0.02)
    time.sleep(args.delay)
    print(f"rank {rank} fails with {args.code} on attempt {attempt}", flush=True)
    stamp = os.path.join(args.dump, f"exit.{rank}.{attempt}")
    with open(stamp + ".tmp", "w") as f:
        f.write(repr(time.time()))
    os.replace(stamp + ".tmp", stamp)
    sys.exit(args.code)

sleep = args.sleep_restarted if attempt and args.sleep_restarted is not None else args.sleep
deadline = time.monotonic() + sleep
until = args.until and args.until.replace("{node}", os.environ.get("GROUP_RANK", "0"))
while time.monotonic() < deadline and not (until and os.path.exists(until)):
    time.sleep(min(0.05, max(0.0, deadline - time.monotonic())))
print(f"rank {rank} attempt {attempt} done", flush=True)
