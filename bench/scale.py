#!/usr/bin/env python3
"""The control plane at scale: one job of N nodes on this machine, one launcher per node, one worker each.

    python bench/scale.py [--nodes 128] [--backends fixed,c10d,etcd] [--etcd HOST:PORT] [--idle S]
                          [--only up,idle,fail,silent] [--side ours|torchrun] [--up-bound S] [--json FILE]
                          [--keep DIR] [--monitor [--scrape S]] [--watch]

Backends (every launcher given the same line but its address):

- fixed: ``--cluster_node_ips 127.0.0.1,...,127.0.0.N --node_ip 127.0.0.K`` (node 0 keeps the channel);
- c10d: ``--nnodes N-1:N --rdzv-backend c10d --rdzv-endpoint 127.0.0.1:P`` (node 0: the first launcher);
- etcd: ``--nnodes N-1:N --rdzv-backend etcd --rdzv-endpoint HOST:PORT`` (the etcd given with --etcd);

both with ``--rdzv-conf last_call_timeout=5,heartbeat_timeout=30,keep_alive_interval=1`` (``--heartbeat`` S;
the heartbeats as often as by default, once a second): on 2 cores the N
launchers take a minute to start, and a round formed before the last came would be re-formed for each one
that comes after; and a round's start is N launchers and N workers starting at once on 2 cores (tens of
seconds of CPU), during which a launcher that waits for the CPU longer than a heartbeat timeout of 3 s
counts as lost. On a cluster each launcher has a machine of its own.

``--monitor``: every launcher with ``--monitor_port 0``, and (``--scrape S``, 5) a thread that reads every launcher's
/metrics every S seconds from the moment all are up to the end of the job (the ``scraped`` figures: answers and
failures: a launcher that had ended by then counts as one), as a Prometheus would while the job idles and stops. ``--watch``: every launcher with the same fixed
``--monitor_port`` instead, and node 0's job page watched from the moment all are up to the end (its /events stream
read, as a browser would): node 0's launcher then fetches every other launcher's view every 2 s (the ``watched``
figures: events read, and how many of the other nodes' rows in the last one came without an error). The fixed backend
only: the elastic ones' launchers share the address 127.0.0.1 here, so they cannot share a port.
``--side torchrun`` runs torchrun's agents instead, for c10d (``--rdzv-backend c10d``) and etcd (``etcd-v2``).
The first launcher starts 0.5 s before the others (it binds the endpoint; with etcd its key is the oldest).

Two jobs per backend, each figure from the workers' ready files (``scale_worker.py``) and their exits
(a pidfd each: the exit is seen as it happens, no polling):

1. up: from the first launcher's start to the last of the N workers ready (all in one round of N);
2. idle: node 0's launcher (and the median other launcher) over ``--idle`` seconds once all are up: its
   share of a core (user + system, all its threads) and its resident memory;
3. fail: the last node's worker is SIGKILLed; from then to the first, median and last other worker gone
   (``--max-restarts 0``: the job ends), and the spread of those (the fan-out and each node's stop);
4. silent (a second job): every process of the last node is SIGSTOPped; from then to the first other
   worker gone (the loss found), the last one gone, and (elastic) the N-1 workers of the next round ready.

Every wait is bounded; after each job every launcher gets SIGTERM, then whatever is left of it is killed.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import re
import select
import signal
import statistics
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path
from typing import Optional

import psutil

sys.path.insert(0, str(Path(__file__).resolve().parent))
import harness  # noqa: E402

WORKER = harness.BENCH / "scale_worker.py"
HEAD_START_S = 0.5
UP_BOUND_S = 300.0
EVENT_BOUND_S = 60.0
SETTLE_S = 3.0
LAST_CALL = "last_call_timeout=5"


class Nodes:
    """N launchers of one job and the workers they started."""

    def __init__(self, side: str, backend: str, count: int, folder: Path, etcd: Optional[str], ports,
                 heartbeat: float = 30.0, monitor: bool = False, watch: bool = False) -> None:
        self.side, self.backend, self.count, self.folder, self.heartbeat = side, backend, count, folder, heartbeat
        self.ready_dir = folder / "ready"
        self.ready_dir.mkdir(parents=True)
        block = ports.reserve_block(2 * count + 8)
        self.port = block + 1
        self.watch_port = block + 2 * count + 6 if watch and backend == "fixed" else None  # every launcher's monitor
        self.monitor = [] if side != "ours" else ["--monitor_port", str(self.watch_port)] if self.watch_port else \
            ["--monitor_port", "0"] if monitor else []  # every launcher serves its view
        self.etcd = etcd
        self.job_id = f"scale-{os.getpid()}-{time.monotonic_ns()}"
        self.runs: list = []

    def line(self, index: int) -> list:
        worker = [str(WORKER), str(self.ready_dir)]
        if self.side == "torchrun":
            backend = ["--rdzv-backend=c10d", f"--rdzv-endpoint=127.0.0.1:{self.port}"] if self.backend == "c10d" \
                else ["--rdzv-backend=etcd-v2", f"--rdzv-endpoint={self.etcd}"]
            return [sys.executable, "-m", "torch.distributed.run", f"--nnodes={self.count - 1}:{self.count}",
                    "--nproc-per-node=1", *backend,
                    f"--rdzv-conf={LAST_CALL},keep_alive_interval={self.heartbeat / 3:g},keep_alive_max_attempt=3",
                    f"--rdzv-id={self.job_id}", "--max-restarts=0", *worker]
        if self.backend == "fixed":
            ips = ",".join(harness.node_ips(self.count))
            return [sys.executable, "-m", "launcher", "--cluster_node_ips", ips, "--node_ip", f"127.0.0.{index + 1}",
                    "--started_port", str(self.port + 1), "--nproc_per_node", "1", *self.monitor, *worker]
        endpoint = f"127.0.0.1:{self.port}" if self.backend == "c10d" else self.etcd
        return [sys.executable, "-m", "launcher", f"--nnodes={self.count - 1}:{self.count}", "--nproc-per-node=1",
                f"--rdzv-backend={self.backend}", f"--rdzv-endpoint={endpoint}", f"--rdzv-id={self.job_id}",
                f"--rdzv-conf={LAST_CALL},heartbeat_timeout={self.heartbeat:g},keep_alive_interval=1",
                f"--started_port={self.port + 1}", "--max-restarts=0", *self.monitor, *worker]

    def start(self) -> float:
        began = time.time()
        for index in range(self.count):
            self.runs.append(harness.Run(self.line(index), self.folder, name=f"node{index}"))
            if index == 0:
                time.sleep(HEAD_START_S)
        return began

    def ready(self, world: int) -> dict:
        """pid -> rank of the workers ready in a round of ``world`` ranks."""
        found = {}
        for path in self.ready_dir.glob("*.ready"):
            try:
                rank, size = path.read_text().split()
            except (OSError, ValueError):
                continue
            if int(size) == world:
                found[int(path.stem)] = int(rank)
        return found

    def wait_ready(self, world: int, bound: float = 0.0) -> tuple:
        """(when the ``world`` workers of a round of that size were all ready, pid -> rank)."""
        deadline = time.monotonic() + bound
        while True:
            found = self.ready(world)
            if len(found) >= world:
                return time.time(), found
            exited = [r for r in self.runs if r.exited]
            if time.monotonic() > deadline or len(exited) > self.count // 2:
                raise harness.BenchError(f"{len(found)} of {world} workers ready; {len(exited)} launchers exited"
                                         f"{exited[0].stderr_tail() if exited else ''}")
            time.sleep(0.01)

    def node_of(self, pid: int) -> int:
        for index, run in enumerate(self.runs):
            if pid in harness.descendants(run.proc.pid):
                return index
        raise harness.BenchError(f"worker {pid} belongs to no launcher")

    def stop(self) -> int:
        for run in self.runs:
            if not run.exited:
                try:
                    os.killpg(run.proc.pid, signal.SIGCONT)
                    run.proc.send_signal(signal.SIGTERM)
                except OSError:
                    pass
        deadline = time.time() + 30
        for run in self.runs:
            run.exited_by(deadline)
        left = 0
        for run in self.runs:
            left += len(harness.tagged_processes(run.tag)) if run.exited else 1
            run.stop()
        return left


def exits(pids: list, bound: float) -> dict:
    """pid -> when it exited (``time.time()``), for those that did within ``bound``: a pidfd each."""
    fds, seen = {}, {}
    for pid in pids:
        try:
            fds[os.pidfd_open(pid)] = pid
        except OSError:
            seen[pid] = time.time()
    poller = select.poll()
    for fd in fds:
        poller.register(fd, select.POLLIN)
    deadline = time.monotonic() + bound
    while len(seen) < len(pids) and time.monotonic() < deadline:
        for fd, _ in poller.poll(max(1, int((deadline - time.monotonic()) * 1000))):
            seen[fds[fd]] = time.time()
            poller.unregister(fd)
    for fd in fds:
        os.close(fd)
    return seen


def spread(times: list, since: float) -> dict:
    after = sorted(t - since for t in times)
    if not after:
        return {"first": None, "median": None, "last": None}
    return {"first": round(after[0], 3), "median": round(statistics.median(after), 3), "last": round(after[-1], 3)}


def usage(pid: int, seconds: float) -> tuple:
    proc = psutil.Process(pid)
    before = proc.cpu_times()
    time.sleep(seconds)
    after = proc.cpu_times()
    return (after.user + after.system - before.user - before.system) / seconds, proc.memory_info().rss


class Scraper:
    """With --monitor: GET every launcher's /metrics every ``every`` seconds (as a Prometheus would), in a thread,
    until ``stop``; how many answers came, and how many failed."""

    def __init__(self, nodes: Nodes, every: float) -> None:
        self.urls = [u for u in (monitor_url(r.stderr_path) for r in nodes.runs) if u]
        self.every, self.ok, self.failed = every, 0, 0
        self.stopping = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while not self.stopping.is_set():
            began = time.monotonic()
            for url in self.urls:
                try:
                    with urllib.request.urlopen(url + "metrics", timeout=5) as answer:
                        answer.read()
                    self.ok += 1
                except OSError:
                    self.failed += 1
            self.stopping.wait(max(0.0, self.every - (time.monotonic() - began)))

    def stop(self) -> dict:
        self.stopping.set()
        self.thread.join(timeout=60)
        return {"nodes": len(self.urls), "ok": self.ok, "failed": self.failed}


class Watcher:
    """With --watch: node 0's /events read in a thread (as its page in a browser would), until ``stop``; the events
    read, and how many of the other nodes' rows in the last one came without an error."""

    def __init__(self, nodes: Nodes) -> None:
        self.connection = http.client.HTTPConnection("127.0.0.1", nodes.watch_port, timeout=30)
        self.events, self.last = 0, None
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        try:
            self.connection.request("GET", "/events")
            answer = self.connection.getresponse()
            for line in answer:
                if line.startswith(b"data: "):
                    self.events, self.last = self.events + 1, line
        except (OSError, http.client.HTTPException):
            pass

    def stop(self) -> dict:
        self.connection.close()
        self.thread.join(timeout=60)
        peers = json.loads(self.last[6:]).get("peers", []) if self.last else []
        return {"events": self.events, "peers_answering": sum(1 for p in peers if not p["error"]), "of": len(peers)}


def monitor_url(stderr_path: Path) -> Optional[str]:
    try:
        text = stderr_path.read_text(errors="replace")
    except OSError:
        return None
    found = re.search(r"monitor: (http://\S+/) ", text)
    return found.group(1) if found else None


def job_a(nodes: Nodes, args) -> dict:
    began = nodes.start()
    up_at, workers = nodes.wait_ready(nodes.count, args.up_bound)
    out = {"up_s": round(up_at - began, 2)}
    scraper = Scraper(nodes, args.scrape) if nodes.monitor and args.scrape and not nodes.watch_port else None
    watcher = Watcher(nodes) if nodes.watch_port and nodes.monitor else None
    if "idle" in args.only:
        time.sleep(SETTLE_S)
        zero = nodes.runs[0].proc.pid
        others = [r.proc.pid for r in nodes.runs[1:]]
        procs = [psutil.Process(p) for p in [zero, *others]]
        before = [p.cpu_times() for p in procs]
        time.sleep(args.idle)
        after = [p.cpu_times() for p in procs]
        shares = [(a.user + a.system - b.user - b.system) / args.idle for a, b in zip(after, before)]
        rss = [p.memory_info().rss / 2**20 for p in procs]
        out["idle"] = {"node0_core_pct": round(100 * shares[0], 2), "node0_rss_mib": round(rss[0], 1),
                       "other_core_pct_median": round(100 * statistics.median(shares[1:]), 3),
                       "other_rss_mib_median": round(statistics.median(rss[1:]), 1),
                       "all_core_pct": round(100 * sum(shares), 1)}
    if "fail" in args.only:
        victim = max(workers, key=workers.get)  # the last rank
        rest = [p for p in workers if p != victim]
        killed = time.time()
        os.kill(victim, signal.SIGKILL)
        gone = exits(rest, EVENT_BOUND_S + nodes.heartbeat)
        out["fail"] = {**spread(list(gone.values()), killed), "stopped": len(gone), "of": len(rest)}
    if scraper is not None:
        out["scraped"] = scraper.stop()
    if watcher is not None:
        out["watched"] = watcher.stop()
    return out


def job_b(nodes: Nodes, args) -> dict:
    nodes.start()
    _, workers = nodes.wait_ready(nodes.count, args.up_bound)
    victim = max(workers, key=workers.get)
    node = nodes.runs[nodes.node_of(victim)]
    procs = [node.proc.pid, *harness.descendants(node.proc.pid)]
    rest = [p for p in workers if p != victim]
    stopped = time.time()
    for pid in procs:
        os.kill(pid, signal.SIGSTOP)
    gone = exits(rest, EVENT_BOUND_S + nodes.heartbeat)
    out = {"silent": {**spread(list(gone.values()), stopped), "stopped": len(gone), "of": len(rest)}}
    if nodes.backend != "fixed" and gone:
        try:
            at, _ = nodes.wait_ready(nodes.count - 1, EVENT_BOUND_S + nodes.heartbeat)
            out["silent"]["reformed"] = round(at - stopped, 3)
        except harness.BenchError as e:
            out["silent"]["reformed"] = str(e)
    return out


def run_backend(backend: str, args, root: Path) -> dict:
    result = {}
    with harness.PortReservations() as ports:
        for name, job in (("a", job_a), ("b", job_b)):
            if name == "a" and not ({"up", "idle", "fail"} & set(args.only)) or name == "b" and "silent" not in args.only:
                continue
            nodes = Nodes(args.side, backend, args.nodes, root / f"{backend}-{name}", args.etcd, ports, args.heartbeat,
                          args.monitor, args.watch)
            try:
                result.update(job(nodes, args))
            except harness.BenchError as e:
                result[f"error_{name}"] = str(e)
            finally:
                left = nodes.stop()
                if left:
                    result[f"leftovers_{name}"] = left
            harness.progress(f"{args.side} {backend} job {name}: {json.dumps(result)}")
    return result


def parse_args(argv) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--nodes", type=int, default=128)
    p.add_argument("--backends", default="fixed,c10d,etcd")
    p.add_argument("--etcd", default=None, help="HOST:PORT of an etcd for the etcd backend")
    p.add_argument("--idle", type=float, default=20.0)
    p.add_argument("--heartbeat", type=float, default=30.0, help="heartbeat_timeout of the elastic backends")
    p.add_argument("--only", default="up,idle,fail,silent")
    p.add_argument("--up-bound", type=float, default=UP_BOUND_S, help="seconds the N workers may take to be up")
    p.add_argument("--side", choices=("ours", "torchrun"), default="ours")
    p.add_argument("--monitor", action="store_true", help="every launcher with --monitor_port 0 (ours only)")
    p.add_argument("--scrape", type=float, default=5.0, help="with --monitor: every launcher's /metrics read every S s")
    p.add_argument("--watch", action="store_true", help="every launcher with one fixed --monitor_port, node 0's page "
                   "watched (ours only)")
    p.add_argument("--json", default=None)
    p.add_argument("--keep", default=None)
    args = p.parse_args(argv)
    args.only = args.only.split(",")
    args.backends = args.backends.split(",")
    if "etcd" in args.backends and not args.etcd:
        p.error("the etcd backend needs --etcd HOST:PORT")
    return args


def main(argv: Optional[list] = None) -> int:
    args = parse_args(argv if argv is not None else sys.argv[1:])
    results = {}
    with tempfile.TemporaryDirectory(prefix="scale-") as tmp:
        root = Path(args.keep) if args.keep else Path(tmp)
        for backend in args.backends:
            results[backend] = run_backend(backend, args, root)
    print(json.dumps({"nodes": args.nodes, "side": args.side, "results": results}, indent=1))
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
