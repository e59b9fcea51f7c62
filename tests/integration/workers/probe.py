"""A small real worker for the launcher's tests; what it does is chosen by flags.

--dump DIR        write DIR/env.RANK.json (the variables of interest, argv, pid)
--fail-rank R     rank R exits with --code (after --delay seconds); the others sleep --sleep
--child           start a grandchild (sleep) in the worker's process group; --setsid-child: in a session of its own
--signals DIR     record each signal received as DIR/signal.RANK.NAME; exit 0 on SIGUSR*, 128+n otherwise
--ignore-term     ignore SIGTERM
--lines N         write N numbered lines of --width bytes (stdout; --stderr-every K also to stderr)
"""

import argparse
import json
import os
import signal
import subprocess
import sys
import time

p = argparse.ArgumentParser()
p.add_argument("--dump")
p.add_argument("--fail-rank", type=int, default=-1)
p.add_argument("--code", type=int, default=1)
p.add_argument("--delay", type=float, default=0.0)
p.add_argument("--sleep", type=float, default=0.0)
p.add_argument("--child", action="store_true")
p.add_argument("--setsid-child", action="store_true")
p.add_argument("--signals")
p.add_argument("--ignore-term", action="store_true")
p.add_argument("--lines", type=int, default=0)
p.add_argument("--width", type=int, default=100)
p.add_argument("--stderr-every", type=int, default=0)
p.add_argument("--kill-self", action="store_true", help="the failing rank dies by SIGKILL")
p.add_argument("--lines-mark", help="a folder: each rank marks there that its --lines are written, and the "
               "failing rank fails only once every rank has (at most 60 s)")
args, extra = p.parse_known_args()

rank = int(os.environ.get("RANK", "-1"))
children = []
if args.child or args.setsid_child:
    child = subprocess.Popen(["sleep", "300"], start_new_session=args.setsid_child)
    children.append(child.pid)

# signal handlers first: a test sends signals as soon as the dump exists
if args.signals:
    def note(signum, frame):
        open(os.path.join(args.signals, f"signal.{rank}.{signal.Signals(signum).name}"), "w").close()
        if signum not in (signal.SIGUSR1, signal.SIGUSR2):
            sys.exit(128 + signum)

    for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1, signal.SIGUSR2):
        signal.signal(s, note)
if args.ignore_term:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)

if args.dump:
    names = [k for k in os.environ if k.startswith(("PADDLE_", "FLAGS_", "MASTER_", "LOCAL_", "GROUP_", "CUDA_", "GLOO_", "LAUNCHER_", "EXTRA_"))]
    names += ["RANK", "WORLD_SIZE", "OMP_NUM_THREADS"]
    record = {
        "env": {k: os.environ.get(k) for k in names},
        "argv": sys.argv[1:],
        "extra": extra,
        "pid": os.getpid(),
        "pgid": os.getpgid(0),
        "children": children,
    }
    path = os.path.join(args.dump, f"env.{rank}.json")
    with open(path + ".tmp", "w") as f:
        json.dump(record, f)
    os.replace(path + ".tmp", path)

print(f"worker rank {rank} up", flush=True)
if args.lines:
    line_body = "x" * max(0, args.width - 30)
    for i in range(args.lines):
        line = f"r{rank} n{i:012d} {line_body}\n"
        sys.stdout.write(line)
        if args.stderr_every and i % args.stderr_every == 0:
            sys.stderr.write(f"e{rank} n{i:012d} {line_body}\n")

if args.lines_mark:
    open(os.path.join(args.lines_mark, f"lines.{rank}"), "w").close()
if rank == args.fail_rank:
    marks_by = time.monotonic() + 60
    while args.lines_mark and len(os.listdir(args.lines_mark)) < int(os.environ["WORLD_SIZE"]) \
            and time.monotonic() < marks_by:
        time.sleep(0.01)
    time.sleep(args.delay)
    print(f"rank {rank} is about to fail with {args.code}", flush=True)
    if args.kill_self:
        os.kill(os.getpid(), signal.SIGKILL)
    sys.exit(args.code)

deadline = time.monotonic() + args.sleep
while time.monotonic() < deadline:
    time.sleep(min(0.05, max(0.0, deadline - time.monotonic())))
print(f"worker rank {rank} done", flush=True)
