"""Benchmark worker for log volume: write numbered 100-byte lines to stdout.

    spew.py MEGABYTES

Line i of rank r is ``line(r, i)``: exactly LINE_BYTES bytes, newline included. Lines are written
in blocks of BLOCK_LINES lines, so the launcher sees writes that do not end on line boundaries
only when it reads less than a block.
"""

import os
import sys

LINE_BYTES = 100
BLOCK_LINES = 100


def line(rank: int, i: int) -> bytes:
    head = f"bench r{rank} n{i:010d} "
    return (head + "." * (LINE_BYTES - 1 - len(head)) + "\n").encode()


def line_count(megabytes: float) -> int:
    return int(megabytes * 1_000_000) // LINE_BYTES


def main() -> None:
    rank = int(os.environ["RANK"])
    n = line_count(float(sys.argv[1]))
    out = sys.stdout.buffer
    for start in range(0, n, BLOCK_LINES):
        out.write(b"".join(line(rank, i) for i in range(start, min(n, start + BLOCK_LINES))))
    out.flush()


if __name__ == "__main__":
    main()
