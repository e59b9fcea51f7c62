"""A worker for the console tests: only one rank writes (rank 0, or --rank); the others may fail or wait.

--dump DIR         write DIR/env.RANK.json with the pid (as probe.py does)
--lines N          rank 0 writes N numbered lines of --width bytes: "n000000000042 xxx..." (-1: without end)
--rank R           the rank that writes them, instead of rank 0
--to out|err|both  where it writes them (both: each line to one of them, in turn)
--interval S       rank 0 sleeps S between lines (each line one write)
--long SIZES       rank 0 writes, for each comma-separated size, one line of that many bytes
                   (a repeating pattern, then a newline), then the line "after long"
--until-full       rank 0 writes without blocking, and once it has written --lines lines, goes on
                   until its output pipe has stayed full for 0.5 s; then says on stderr how many
--fail-rank R      rank R exits with --code after --delay seconds
--after-writer DIR the writer marks DIR/written once its lines are out; rank R's --delay starts then
--sleep S          every rank that does not fail then waits S seconds
"""

import argparse
import itertools
import json
import os
import sys
import time

p = argparse.ArgumentParser()
p.add_argument("--dump")
p.add_argument("--lines", type=int, default=0)
p.add_argument("--rank", type=int, default=0)
p.add_argument("--to", choices=("out", "err", "both"), default="out")
p.add_argument("--width", type=int, default=100)
p.add_argument("--interval", type=float, default=0.0)
p.add_argument("--long", default="")
p.add_argument("--until-full", action="store_true")
p.add_argument("--fail-rank", type=int, default=-1)
p.add_argument("--code", type=int, default=1)
p.add_argument("--delay", type=float, default=0.0)
p.add_argument("--sleep", type=float, default=0.0)
p.add_argument("--after-writer")
args = p.parse_args()

rank = int(os.environ["RANK"])
if args.dump:
    path = os.path.join(args.dump, f"env.{rank}.json")
    with open(path + ".tmp", "w") as f:
        json.dump({"pid": os.getpid(), "children": []}, f)
    os.replace(path + ".tmp", path)


def write(data: bytes, fd: int = 1) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


writer = rank == args.rank
if writer and args.until_full:
    body = b"x" * max(0, args.width - 15)
    os.set_blocking(1, False)
    i, full_since = 0, None
    while True:
        try:
            os.write(1, b"n%012d %s\n" % (i, body))  # under PIPE_BUF: all or nothing
            i, full_since = i + 1, None
        except BlockingIOError:
            full_since = full_since or time.monotonic()
            if i >= args.lines and time.monotonic() - full_since > 0.5:
                break
            time.sleep(0.01)
    sys.stderr.write(f"wrote {i} lines\n")
elif writer:
    body = b"x" * max(0, args.width - 15)
    fds = {"out": (1,), "err": (2,), "both": (1, 2)}[args.to]
    for i in itertools.count() if args.lines < 0 else range(args.lines):
        write(b"n%012d %s\n" % (i, body), fds[i % len(fds)])
        if args.interval:
            time.sleep(args.interval)
    for size in filter(None, args.long.split(",")):
        pattern = b"0123456789abcdef"
        size = int(size)
        write(pattern * (size // len(pattern)) + pattern[:size % len(pattern)] + b"\n")
    if args.long:
        write(b"after long\n")
if writer and args.after_writer:
    open(os.path.join(args.after_writer, "written"), "w").close()

if rank == args.fail_rank:
    while args.after_writer and not os.path.exists(os.path.join(args.after_writer, "written")):
        time.sleep(0.05)  # the launcher's stop, or its --hang_timeout, bounds this wait
    time.sleep(args.delay)
    sys.exit(args.code)
time.sleep(args.sleep)
