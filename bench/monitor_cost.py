#!/usr/bin/env python3
"""What ``--monitor_port`` costs the launcher, and how soon a worker's line shows in the monitor's view.

    python bench/monitor_cost.py [--idle 20] [--workers 2] [--scrape 0] [--probes 10] [--json FILE]

Runs the same job twice, without and with ``--monitor_port 0``: WORKERS CPU workers that sleep (the launcher idle,
as in a long training step). Once the workers run, it takes the launcher's CPU time (user + system, psutil) over
IDLE seconds, as a share of one core, and its RSS at the end. ``--scrape S``: a client GETs /metrics every S
seconds meanwhile (Prometheus scrapes every 15-60 s). Then, with the monitor on, PROBES lines are written by a
worker one at a time (it prints when a file appears), and for each the time from just before the file is made to
the line in /view.json (polled every 10 ms). Prints a small table; ``--json FILE`` also writes the figures.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import psutil

REPO = Path(__file__).resolve().parent.parent
WORKER = """\
import os, sys, time
folder = sys.argv[1]
rank = os.environ["RANK"]
n = 0
while not os.path.exists(os.path.join(folder, "end")):
    probe = os.path.join(folder, f"probe.{n}")
    if rank == "0" and os.path.exists(probe):
        print(f"probe {n}", flush=True)
        n += 1
    time.sleep(0.005)
"""


def run_job(folder: Path, workers: int, idle: float, monitor: bool, scrape: float, probes: int) -> dict:
    (folder / "worker.py").write_text(WORKER)
    args = [sys.executable, "-m", "launcher", "--nproc_per_node", str(workers), "--log_dir", str(folder / "logs")]
    args += ["--monitor_port", "0"] if monitor else []
    proc = subprocess.Popen(args + [str(folder / "worker.py"), str(folder)], cwd=REPO, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True)
    url = None
    try:
        if monitor:
            line = proc.stderr.readline()
            while line and "monitor: http://" not in line:
                line = proc.stderr.readline()
            url = line.split("monitor: ", 1)[1].split(" ", 1)[0]
        launcher = psutil.Process(proc.pid)
        deadline = time.monotonic() + 60
        while len(launcher.children()) < workers and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(2)  # the workers' start-up is over
        before, start = launcher.cpu_times(), time.monotonic()
        next_scrape = start
        while time.monotonic() - start < idle:
            if url and scrape and time.monotonic() >= next_scrape:
                urllib.request.urlopen(url + "metrics", timeout=10).read()
                next_scrape += scrape
            time.sleep(0.05)
        after, spent = launcher.cpu_times(), time.monotonic() - start
        cpu = (after.user + after.system - before.user - before.system) / spent
        rss = launcher.memory_info().rss
        delays = [probe(folder, url, n) for n in range(probes)] if url else []
        return {"cpu_share": cpu, "rss_mib": rss / 2**20, "line_seconds": delays}
    finally:
        (folder / "end").touch()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def probe(folder: Path, url: str, n: int) -> float:
    start = time.monotonic()
    (folder / f"probe.{n}").touch()
    while time.monotonic() - start < 10:
        view = json.loads(urllib.request.urlopen(url + "view.json", timeout=10).read())
        if view["workers"][0]["last_line"] == f"probe {n}":
            return time.monotonic() - start
        time.sleep(0.01)
    return float("inf")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--idle", type=float, default=20.0)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--scrape", type=float, default=0.0)
    parser.add_argument("--probes", type=int, default=10)
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    results = {}
    for monitor in (False, True):
        with tempfile.TemporaryDirectory() as folder:
            results["on" if monitor else "off"] = run_job(Path(folder), args.workers, args.idle, monitor, args.scrape,
                                                          args.probes)
    off, on = results["off"], results["on"]
    print(f"{'':28}{'off':>10}{'on':>10}")
    print(f"{'launcher CPU, share of a core':28}{off['cpu_share']:>10.4f}{on['cpu_share']:>10.4f}")
    print(f"{'launcher RSS, MiB':28}{off['rss_mib']:>10.1f}{on['rss_mib']:>10.1f}")
    if on["line_seconds"]:
        d = on["line_seconds"]
        print(f"a line in /view.json: median {statistics.median(d):.3f} s, largest {max(d):.3f} s ({len(d)} lines)")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
