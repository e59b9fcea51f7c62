#!/usr/bin/env python3
"""Many restarts whose first attempt needs SIGKILL: how many of them end with anything but 0.

    python bench/restart_race.py [--runs 300] [--parallel 2] [--workers 2]

Each run is ``python -m launcher --nproc_per_node W --max_restarts 1 --shutdown_timeout 0.3
tests/integration/workers/stubborn.py DIR``: in attempt 1, rank 0 ignores SIGTERM, so the stop
after rank 1's failure ends with SIGKILL (cgroup.kill, where the launcher has a cgroup); attempt 2
runs in the spares and exits 0. A run fails if the launcher's exit code is not 0 or it says
"killed by SIGKILL". Prints one line per failed run, then the totals.
"""

import argparse
import os
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
STUBBORN = os.path.join(ROOT, "tests", "integration", "workers", "stubborn.py")


def one_run(workers: int) -> tuple:
    with tempfile.TemporaryDirectory() as folder:
        cmd = [sys.executable, "-m", "launcher", "--nproc_per_node", str(workers), "--max_restarts", "1",
               "--shutdown_timeout", "0.3", STUBBORN, folder]
        try:
            r = subprocess.run(cmd, capture_output=True, text=True, timeout=120, cwd=ROOT)
        except subprocess.TimeoutExpired:
            return "timeout", ""
        ok = r.returncode == 0 and "killed by SIGKILL" not in r.stderr
        return ("ok" if ok else f"exit {r.returncode}"), ("" if ok else r.stderr.strip().splitlines()[-1:])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--runs", type=int, default=300)
    p.add_argument("--parallel", type=int, default=2)
    p.add_argument("--workers", type=int, default=2)
    args = p.parse_args()
    started = time.monotonic()
    with ThreadPoolExecutor(args.parallel) as pool:
        results = list(pool.map(lambda _: one_run(args.workers), range(args.runs)))
    failed = [(i, what, last) for i, (what, last) in enumerate(results) if what != "ok"]
    for i, what, last in failed:
        print(f"run {i}: {what}: {last}")
    print(f"{len(failed)} of {args.runs} runs failed ({args.parallel} at a time, {time.monotonic() - started:.0f} s; "
          f"load average {os.getloadavg()[0]:.2f})")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
