#!/usr/bin/env python3
"""An elastic job of 10,000 nodes x 8 ranks: node 0 real, the other nodes simulated by one process.

    python bench/scale_sim.py [--nodes 10000] [--workers 8] [--idle 20] [--json FILE] [--keep DIR]

Node 0 is a real launcher, the membership's keeper (``python -m launcher --nnodes N-1:N --nproc-per-node W
--rdzv-backend c10d --rdzv-endpoint 127.0.0.1:P``), and its W workers are real (``scale_worker.py``). The
N-1 other launchers are this one process: a connection each to node 0, speaking what a launcher's link
speaks (``launcher.nodes.elastic.c10d.member.MemberLink``): a hello answering node 0's challenge (an id of its
own, a host 10.x.y.z of its own, W workers; no job token), an answer to each of node 0's heartbeats, ``stopped`` when told to stop its workers. It
starts no worker. Each message is framed as the launcher frames it; of a round only the type and number
are read (one node decodes it whole and checks its members), so that the simulation costs less than
the launchers it stands for.

1. join: from the first hello to every node holding round 1 of N nodes (world size N x W) and node 0's
   W workers of it ready;
2. idle: node 0's launcher over ``--idle`` seconds: its share of a core, its resident memory, and each
   per node;
3. loss: one simulated node's connection closed (its launcher killed); from then to every other node
   told to stop its workers (the fan-out), to every other node holding round 2 of N-1 nodes, and to node
   0's workers of it ready; with the bytes node 0 sent the nodes meanwhile.

Every wait is bounded; node 0's launcher gets SIGTERM at the end, then whatever is left of it is killed.
"""

from __future__ import annotations

import argparse
import json
import re
import resource
import selectors
import socket
import sys
import tempfile
import time
from pathlib import Path
from typing import Optional

import psutil

sys.path.insert(0, str(Path(__file__).resolve().parent))
import harness  # noqa: E402
from scale import WORKER  # noqa: E402

sys.path.insert(0, str(harness.REPO))
from launcher.nodes.transport import messages as m  # noqa: E402
from launcher.nodes.transport import wire  # noqa: E402
from launcher.plan.health import Checkup, Facts  # noqa: E402

# every simulated node's checkup: healthy, its facts not compared (node 0 skips versions, script and clock)
CHECKUP = Checkup(Facts("-", "-", None, None, 0.0)).to_wire()

NUMBER = re.compile(rb'"(?:number|round)":(\d+)')
BEAT = wire.encode(m.to_wire(m.Beat()))
JOIN_BOUND_S = 600.0
EVENT_BOUND_S = 120.0
CONNECT_BATCH = 500  # connections opened before the next batch (node 0's accept queue holds 4,096)


class Node:
    """One simulated launcher: its connection, its reader, the last round it was given."""

    __slots__ = ("index", "sock", "framer", "round", "round_at", "members", "hello", "stop_at")

    def __init__(self, index: int, sock: socket.socket, limit: int, hello: bytes) -> None:
        self.index, self.sock, self.framer = index, sock, wire.Framer(limit)
        self.round, self.round_at, self.members = 0, 0.0, None
        self.hello: Optional[bytes] = hello  # sent once node 0's challenge came
        self.stop_at = 0.0  # when node 0's last order to stop its workers came


class Simulation:
    def __init__(self, nodes: int, workers: int, port: int, job_id: str) -> None:
        self.count, self.workers, self.port, self.job_id = nodes - 1, workers, port, job_id
        self.selector = selectors.DefaultSelector()
        self.nodes: dict = {}  # fd -> Node
        self.problems: list = []
        self.received = 0  # bytes

    def hello(self, i: int) -> bytes:
        host = f"10.{1 + i // 65536}.{i // 256 % 256}.{i % 256}"
        return wire.encode(m.to_wire(m.Hello({"job_id": self.job_id}, None, f"{i:032x}", None, node_id=f"sim-{i}",
                                             host=host, workers=self.workers, checkup=CHECKUP)))

    def connect_all(self) -> None:
        """Every node connects without waiting (a launcher of its own would not wait for the others), a
        batch at a time, the nodes connected meanwhile answering node 0 as they would."""
        limit = wire.sized_for(self.count + 1)
        for start in range(0, self.count, CONNECT_BATCH):
            for i in range(start, min(self.count, start + CONNECT_BATCH)):
                sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
                sock.setblocking(False)
                sock.connect_ex(("127.0.0.1", self.port))
                node = Node(i, sock, limit, self.hello(i))
                self.nodes[sock.fileno()] = node
                self.selector.register(sock, selectors.EVENT_WRITE, node)
            deadline = time.monotonic() + 30
            while any(n.hello is not None for n in self.nodes.values()) and time.monotonic() < deadline:
                self.serve(0.05)

    def serve(self, timeout: float) -> None:
        for key, mask in self.selector.select(timeout):
            node = key.data
            if mask & selectors.EVENT_WRITE:  # connected (or refused: the read says so)
                self.selector.modify(node.sock, selectors.EVENT_READ, node)
                continue
            try:
                data = node.sock.recv(1 << 20)
            except (BlockingIOError, InterruptedError):
                continue
            except OSError:
                data = b""
            if not data:
                self.problems.append(f"node {node.index}: node 0 closed its connection")
                self.drop(node)
                continue
            self.received += len(data)
            for body in node.framer.bodies(data):
                self.on_message(node, body)

    def on_message(self, node: Node, body: bytes) -> None:
        head = body[:40]
        if head.startswith(b'{"type":"challenge"') and node.hello is not None:
            self.send(node, node.hello)
            node.hello = None
        elif head.startswith(b'{"type":"beat"'):
            self.send(node, BEAT)
        elif head.startswith(b'{"type":"round"'):
            node.round, node.round_at = int(NUMBER.search(head).group(1)), time.time()
            if node.index == 0:
                node.members = len(json.loads(body)["members"])
        elif head.startswith(b'{"type":"stop_workers"'):
            number = int(NUMBER.search(body[:200]).group(1))
            node.stop_at = time.time()
            self.send(node, wire.encode(m.to_wire(m.Stopped(number))))
        elif head.startswith((b'{"type":"dropped"', b'{"type":"refused"')):
            self.problems.append(f"node {node.index}: {body[:300]!r}")

    def send(self, node: Node, data: bytes) -> None:
        try:
            node.sock.send(data)  # a few bytes: the kernel's buffer takes them
        except OSError:
            pass

    def drop(self, node: Node) -> None:
        self.selector.unregister(node.sock)
        self.nodes.pop(node.sock.fileno())
        node.sock.close()

    def wait_round(self, number: int, bound: float) -> Optional[float]:
        """Serve until every node holds round ``number``; when the last got it (None: not within ``bound``, or too
        few nodes left for a round, node 0 having closed their connections: ``problems`` says why)."""
        deadline = time.monotonic() + bound
        while time.monotonic() < deadline and self.nodes and len(self.nodes) >= self.count - 1:  # MIN: all but one
            if all(n.round >= number for n in self.nodes.values()):
                return max(n.round_at for n in self.nodes.values())
            self.serve(0.2)
        return None

    def idle(self, seconds: float) -> None:
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            self.serve(0.2)


def node_0(nodes: int, workers: int, port: int, job_id: str, folder: Path) -> harness.Run:
    ready = folder / "ready"
    ready.mkdir(parents=True)
    line = [sys.executable, "-m", "launcher", f"--nnodes={nodes - 1}:{nodes}", f"--nproc-per-node={workers}",
            "--rdzv-backend=c10d", f"--rdzv-endpoint=127.0.0.1:{port}", f"--rdzv-id={job_id}",
            "--rdzv-conf=last_call_timeout=5,join_timeout=900", f"--started_port={port + 1}",
            "--skip_health_checks=versions,script,clock", str(WORKER), str(ready)]  # facts the simulation has not
    return harness.Run(line, folder, name="node0")


def listening(port: int, run: harness.Run, bound: float) -> bool:
    """Whether node 0's launcher listens on ``port`` within ``bound`` (a node connecting before it does is refused,
    and the simulation does not try again: fewer than MIN would join)."""
    deadline = time.monotonic() + bound
    while time.monotonic() < deadline and not run.exited:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1.0).close()
            return True
        except OSError:
            time.sleep(0.1)
    return False


def ready_at(folder: Path, world: int, count: int, bound: float, run: harness.Run) -> Optional[float]:
    deadline = time.monotonic() + bound
    while time.monotonic() < deadline and not run.exited:
        found = []
        for path in (folder / "ready").glob("*.ready"):
            try:
                if int(path.read_text().split()[1]) == world:
                    found.append(path.stat().st_mtime)
            except (OSError, ValueError, IndexError):
                continue
        if len(found) >= count:
            return max(found)
        time.sleep(0.05)
    return None


def since(at: Optional[float], began: float) -> Optional[float]:
    return None if at is None else round(at - began, 2)


def measure(args, folder: Path) -> dict:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, min(hard, 2 * args.nodes + 1024)), hard))
    out: dict = {"nodes": args.nodes, "workers": args.workers, "world": args.nodes * args.workers}
    with harness.PortReservations() as ports:
        port = ports.reserve_block(args.workers + 4) + 1
        job_id = f"sim-{time.monotonic_ns()}"
        run = node_0(args.nodes, args.workers, port, job_id, folder)
        sim = Simulation(args.nodes, args.workers, port, job_id)
        try:
            if not listening(port, run, EVENT_BOUND_S):
                raise harness.BenchError(f"node 0 never listened on port {port}{run.stderr_tail()}")
            began = time.time()
            sim.connect_all()
            out["connected_s"] = since(time.time(), began)
            last = sim.wait_round(1, JOIN_BOUND_S)
            zero = ready_at(folder, args.nodes * args.workers, args.workers, EVENT_BOUND_S, run)
            out["join"] = {"all_hold_round_1_s": since(last, began), "node0_workers_ready_s": since(zero, began),
                           "members_in_round": next((n.members for n in sim.nodes.values()), None)}
            if last is None:
                raise harness.BenchError(f"round 1 never reached every node: {sim.problems[:3]}{run.stderr_tail()}")
            sim.idle(3.0)
            proc = psutil.Process(run.proc.pid)
            before, received = proc.cpu_times(), sim.received
            sim.idle(args.idle)
            after = proc.cpu_times()
            share = (after.user + after.system - before.user - before.system) / args.idle
            rss = proc.memory_info().rss
            out["idle"] = {"node0_core_pct": round(100 * share, 1), "node0_rss_mib": round(rss / 2**20, 1),
                           "per_node_core_pct": round(100 * share / args.nodes, 5),
                           "per_node_kib": round(rss / 1024 / args.nodes, 2),
                           "beat_bytes_per_s": round((sim.received - received) / args.idle)}
            lost = next(n for n in sim.nodes.values() if n.index == args.nodes // 2)
            received = sim.received
            gone = time.time()
            sim.drop(lost)
            last = sim.wait_round(2, EVENT_BOUND_S)
            zero = ready_at(folder, (args.nodes - 1) * args.workers, args.workers, EVENT_BOUND_S, run)
            told = max(n.stop_at for n in sim.nodes.values())
            out["loss"] = {"all_told_to_stop_s": since(told, gone), "all_hold_round_2_s": since(last, gone),
                           "node0_workers_ready_s": since(zero, gone),
                           "bytes_to_nodes": sim.received - received}
            out["problems"] = sim.problems[:5]
        except harness.BenchError as e:
            out["error"] = str(e)
        finally:
            for node in list(sim.nodes.values()):
                sim.drop(node)
            run.proc.terminate()
            if not run.exited_by(time.time() + 60):
                out["node0_left_running"] = True
            run.stop()
    return out


def main(argv: Optional[list] = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--nodes", type=int, default=10000)
    p.add_argument("--workers", type=int, default=8)
    p.add_argument("--idle", type=float, default=20.0)
    p.add_argument("--json", default=None)
    p.add_argument("--keep", default=None)
    args = p.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="scale-sim-") as tmp:
        out = measure(args, Path(args.keep) if args.keep else Path(tmp))
    print(json.dumps(out, indent=1))
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1))
    return 0 if "error" not in out else 1


if __name__ == "__main__":
    sys.exit(main())
