"""A worker for the console-fault tests: every rank writes numbered lines to stdout and stderr at a
steady pace, then leaves a mark file saying it got to its end, then exits.

--lines N        lines on each of stdout and stderr: "r0 n000000000042 out", "r0 n000000000042 err"
--interval S     sleep S between lines
--marks DIR      at the end, write DIR/done.RANK
--code-rank R    rank R exits with --code once it is done, --delay seconds after its last line; with --marks,
                 once every rank's mark is there too (up to 60 s), then --delay seconds more
--progress N     before the lines, rank 0 draws a bar of N steps ("\\rstep K/N"), --interval apart
--bar-width W    each state of the bar ends with a space and W "#"
--ignore-write-errors   a write that fails (a full disk) is skipped, and the worker goes on
"""

import argparse
import os
import sys
import time

p = argparse.ArgumentParser()
p.add_argument("--lines", type=int, default=0)
p.add_argument("--interval", type=float, default=0.0)
p.add_argument("--marks")
p.add_argument("--code-rank", type=int, default=-1)
p.add_argument("--code", type=int, default=0)
p.add_argument("--delay", type=float, default=0.0)
p.add_argument("--progress", type=int, default=0)
p.add_argument("--bar-width", type=int, default=0)
p.add_argument("--ignore-write-errors", action="store_true")
args = p.parse_args()
rank = int(os.environ["RANK"])


def write(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        try:
            view = view[os.write(fd, view):]
        except OSError:
            if not args.ignore_write_errors:
                raise
            return


if rank == 0 and args.progress:
    for k in range(1, args.progress + 1):
        write(1, b"\rstep %d/%d" % (k, args.progress) + (b" " + b"#" * args.bar_width if args.bar_width else b""))
        time.sleep(args.interval)
    write(1, b"\n")
for i in range(args.lines):
    write(1, b"r%d n%012d out\n" % (rank, i))
    write(2, b"r%d n%012d err\n" % (rank, i))
    if args.interval:
        time.sleep(args.interval)
write(1, b"worker rank %d done\n" % rank)
if args.marks:
    with open(os.path.join(args.marks, f"done.{rank}"), "w") as f:
        f.write(str(args.lines))
if rank == args.code_rank:
    others = [os.path.join(args.marks, f"done.{r}") for r in range(int(os.environ["WORLD_SIZE"]))] if args.marks else []
    deadline = time.monotonic() + 60  # a rank stopped never writes its mark: the test says so, not a hang
    while not all(map(os.path.exists, others)) and time.monotonic() < deadline:
        time.sleep(0.05)
    time.sleep(args.delay)
    sys.exit(args.code)
