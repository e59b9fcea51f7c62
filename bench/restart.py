"""Benchmark worker for a restart: one rank fails once, the job is restarted, then all exit 0.

    restart.py READY_DIR STAMP_FILE MARKER_FILE [FAILING_RANK]

The attempt comes from TORCHELASTIC_RESTART_COUNT (0 for the first; both launchers set it).
Every worker writes READY_DIR/<attempt>.<rank>.ready holding "pid READY STARTED", atomically, once
it runs: READY is time.time() then, STARTED the time.time() at which the process was created (by
the launcher's fork, before the interpreter started), to the kernel's clock tick (10 ms).
In the first attempt the failing rank (default 1) waits until all WORLD_SIZE workers are ready,
creates MARKER_FILE, writes time.time() to STAMP_FILE and exits 7 at once; the others sleep until
they are stopped. In a later attempt (or with MARKER_FILE already there) every worker waits until
all of its attempt are ready, then exits 0.
"""

import os
import sys
import time

EXIT_CODE = 7


def started_at() -> float:
    """time.time() when this process was created, from its start time in /proc/self/stat
    (clock ticks since boot, on the clock of CLOCK_BOOTTIME)."""
    with open("/proc/self/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()  # from field 3 (state) on
    since_boot = int(fields[22 - 3]) / os.sysconf("SC_CLK_TCK")  # field 22: starttime
    return time.time() - (time.clock_gettime(time.CLOCK_BOOTTIME) - since_boot)


def mark_ready(folder: str, attempt: int, rank: int) -> None:
    tmp = os.path.join(folder, f".{attempt}.{rank}.{os.getpid()}")
    with open(tmp, "w") as f:
        f.write(f"{os.getpid()} {time.time()!r} {started_at()!r}")
    os.rename(tmp, os.path.join(folder, f"{attempt}.{rank}.ready"))


def wait_for_all(folder: str, attempt: int, world: int, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    prefix = f"{attempt}."
    while sum(n.startswith(prefix) and n.endswith(".ready") for n in os.listdir(folder)) < world:
        if time.monotonic() > deadline:
            sys.exit(f"restart.py: not all {world} workers of attempt {attempt} became ready in {timeout} s")
        time.sleep(0.005)


if __name__ == "__main__":
    ready_dir, stamp_file, marker_file = sys.argv[1:4]
    failing_rank = int(sys.argv[4]) if len(sys.argv) > 4 else 1
    attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    mark_ready(ready_dir, attempt, rank)
    if attempt == 0 and not os.path.exists(marker_file):
        if rank != failing_rank:
            time.sleep(600)
            sys.exit(0)
        wait_for_all(ready_dir, attempt, world)
        open(marker_file, "w").close()
        with open(stamp_file, "w") as f:
            f.write(repr(time.time()))
        sys.exit(EXIT_CODE)
    wait_for_all(ready_dir, attempt, world)
    sys.exit(0)
