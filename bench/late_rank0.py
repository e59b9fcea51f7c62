#!/usr/bin/env python3
"""How long a job waits for its ranks after a late rank 0 arrives: ours (the store on node 0's launcher,
and rank 0 hosting it) against torchrun (its agent hosts the store).

    python bench/late_rank0.py [--late 0,6,20] [--nproc 3] [--runs 1]

Each run starts ``--nproc`` workers (tests/integration/workers/late_rank0.py) whose rank 0 sleeps LATE s before
torch's env:// rendezvous (gloo); the figure is from rank 0's arrival to the last rank past the first
barrier (the median of --runs). One table: a row per lateness, a column per launcher.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
WORKER = REPO / "tests" / "integration" / "workers" / "late_rank0.py"
TIMEOUT = 300


def launchers(nproc: int) -> dict:
    ours = [sys.executable, "-m", "launcher", "--print_config", "false", "--nproc_per_node", str(nproc)]
    return {
        "ours (--agent_store on)": ours + ["--agent_store", "on"],
        "ours (--agent_store off)": ours + ["--agent_store", "off"],
        "torchrun": [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(nproc),
                     "--master_port", "{port}"],
    }


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def together_after(cmd: list, late: float) -> float:
    """One run: seconds from rank 0's arrival to the last rank past the barrier."""
    with tempfile.TemporaryDirectory() as folder:
        cmd = [part.format(port=free_port()) for part in cmd] + [str(WORKER), folder, str(late)]
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
        done = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=TIMEOUT)
        if done.returncode != 0:
            raise SystemExit(f"{' '.join(cmd)} failed ({done.returncode}):\n{done.stderr[-2000:]}")
        records = [json.loads(p.read_text()) for p in Path(folder).glob("late.*.0.json")]
        rank_0 = json.loads((Path(folder) / "late.0.0.json").read_text())
        return max(r["passed"] for r in records) - rank_0["arrived"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--late", default="0,6,20", help="how late rank 0 starts, in seconds (comma-separated)")
    parser.add_argument("--nproc", type=int, default=3)
    parser.add_argument("--runs", type=int, default=1)
    args = parser.parse_args()
    cmds = launchers(args.nproc)
    print(f"{'rank 0 late':>12}  " + "  ".join(f"{name:>26}" for name in cmds))
    for late in [float(x) for x in args.late.split(",")]:
        figures = {name: statistics.median(together_after(cmd, late) for _ in range(args.runs))
                   for name, cmd in cmds.items()}
        print(f"{late:>10g} s  " + "  ".join(f"{figures[name]:>24.3f} s" for name in cmds), flush=True)


if __name__ == "__main__":
    main()
