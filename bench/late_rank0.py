#!/usr/bin/env python3
"""How long a job of two nodes waits for its ranks after a late rank 0 arrives: ours with node 0's
launcher serving the store (``auto``, which is on for a job of several nodes), ours with rank 0
hosting it (``--agent_store off``), and torchrun (its agent on node 0 hosts the store).

    python bench/late_rank0.py [--late 0,6,20] [--nproc 2] [--runs 1]

Each run is two launchers on this machine, node 0 on 127.0.0.1 and node 1 on 127.0.0.2 (node 1
started first), ``--nproc`` workers each (tests/integration/workers/late_rank0.py), whose rank 0
(on node 0) sleeps LATE s before torch's env:// rendezvous (gloo). Ours: ``--cluster_node_ips
127.0.0.1,127.0.0.2 --node_ip ... --started_port P``; torchrun: ``--nnodes 2 --node-rank 0/1
--master-addr 127.0.0.1 --master-port P``. The figure is from rank 0's arrival to the last rank past
the first barrier (the median of --runs). One table: a row per lateness, a column per launcher.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from harness import PortReservations  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
WORKER = REPO / "tests" / "integration" / "workers" / "late_rank0.py"
NODES = ("127.0.0.1", "127.0.0.2")
TIMEOUT = 300


def node_commands(name: str, nproc: int, port: int) -> list:
    """[node 0's command, node 1's] for the launcher ``name``, before the worker and its arguments."""
    if name == "torchrun":
        return [[sys.executable, "-m", "torch.distributed.run", "--nnodes", "2", "--node-rank", str(rank),
                 "--master-addr", NODES[0], "--master-port", str(port), "--nproc-per-node", str(nproc)]
                for rank in range(2)]
    store = ["--agent_store", "off"] if name.endswith("off)") else []
    return [[sys.executable, "-m", "launcher", "--print_config", "false", "--cluster_node_ips", ",".join(NODES),
             "--node_ip", ip, "--started_port", str(port), "--nproc_per_node", str(nproc), *store] for ip in NODES]


LAUNCHERS = ("ours (auto: agent store)", "ours (--agent_store off)", "torchrun")


def together_after(name: str, nproc: int, late: float) -> float:
    """One run: seconds from rank 0's arrival to the last rank past the barrier."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
    with tempfile.TemporaryDirectory() as folder, PortReservations() as ports:
        port = ports.reserve_block(nproc + 1) + 1  # ours: node 0's control port is the one before
        commands = [cmd + [str(WORKER), folder, str(late)] for cmd in node_commands(name, nproc, port)]
        procs = [subprocess.Popen(cmd, cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
                 for cmd in reversed(commands)]  # node 1 first
        try:
            errors = [p.communicate(timeout=TIMEOUT)[1] for p in procs]
        finally:
            for p in procs:
                if p.poll() is None:
                    p.kill()
                    p.wait()
        if any(p.returncode for p in procs):
            raise SystemExit(f"{name} failed ({[p.returncode for p in procs]}):\n{''.join(errors)[-2000:]}")
        records = [json.loads(p.read_text()) for p in Path(folder).glob("late.*.0.json")]
        if len(records) != 2 * nproc:
            raise SystemExit(f"{name}: {len(records)} of {2 * nproc} ranks wrote their record")
        rank_0 = json.loads((Path(folder) / "late.0.0.json").read_text())
        return max(r["passed"] for r in records) - rank_0["arrived"]


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--late", default="0,6,20", help="how late rank 0 starts, in seconds (comma-separated)")
    parser.add_argument("--nproc", type=int, default=2, help="workers per node")
    parser.add_argument("--runs", type=int, default=1)
    args = parser.parse_args(argv)
    print(f"load average {os.getloadavg()[0]:.2f} at start; 2 nodes x {args.nproc} workers")
    print(f"{'rank 0 late':>12}  " + "  ".join(f"{name:>26}" for name in LAUNCHERS))
    for late in [float(x) for x in args.late.split(",")]:
        figures = {name: statistics.median(together_after(name, args.nproc, late) for _ in range(args.runs))
                   for name in LAUNCHERS}
        print(f"{late:>10g} s  " + "  ".join(f"{figures[name]:>24.3f} s" for name in LAUNCHERS), flush=True)


if __name__ == "__main__":
    main()
