#!/usr/bin/env python3
"""Goodput of an elastic job under a seeded schedule of faults: ours in place, ours with restarts, torchrun.

    sudo python bench/goodput.py [--seeds N] [--first-seed S] [--duration S] [--sides inplace,restarts,torchrun]
                                 [--backend c10d|etcd] [--scenario faults|spare] [--keep DIR] [--json FILE]

Three nodes (and a spare, idle until a ``join`` fault starts it), each a launcher in a network namespace and a
cgroup of its own (``faults.py``: veths into a bridge, 10.213.0.N), run bench/goodput_train.py for ``--duration``
seconds with the same line on every node:

    inplace:  python -m launcher --nnodes=2:3 --nproc-per-node=1 --rdzv-backend=B --rdzv-endpoint=E ...
              --max-restarts=50 --log_dir=... --straggler_policy=leave --warm_start goodput_train.py OUT --until T
              --inprocess
    restarts: the same without --inprocess (the program checkpoints every 10 steps and resumes from it)
    torchrun: python -m torch.distributed.run --nnodes=2:3 --nproc-per-node=1 --rdzv-backend=c10d
              --rdzv-endpoint=10.213.0.1:29400 --local-addr=10.213.0.N --max-restarts=50 goodput_train.py OUT ...

The endpoint is node 0's address (c10d: our node 0 and torchrun's store host), or, with ``--backend etcd``, an etcd
3.4 this bench starts in the bridge's namespace (10.213.0.254:2379) for our two sides; torchrun stays on c10d
(its etcd-v2 backend needs etcd's v2 API and python-etcd). Each seed's schedule (goodput_schedule.py) runs on
every side; each side also runs once without faults, the denominator of its goodput. After each run the
invariants are checked (goodput_check.py) over the step lines, what the launchers kept of them, and the
processes left in the nodes' cgroups. Prints a table: goodput per side, median (min-max) over the seeds, the
invariants broken, and, where our launcher has ``--straggler_policy`` (then ``leave`` on the inplace side), how
soon the slowed node was named and the job back at 90% of the fault-free rate.

Needs root, ``ip`` and nftables or iptables; every namespace, cgroup and process made is removed at the end,
also on an error or Ctrl-C.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator, Optional

sys.path.insert(0, str(Path(__file__).resolve().parent))
import faults  # noqa: E402
import goodput_check as check  # noqa: E402
import goodput_schedule as plan  # noqa: E402
import harness  # noqa: E402

SCRIPT = harness.BENCH / "goodput_train.py"
SIDES = ("inplace", "restarts", "torchrun")
PORT = 29400  # the rendezvous port on node 0's address (every node has a network of its own)
ETCD_PORT = 2379
BATCH = 2400  # samples per step: 6-10 ms of compute a rank (3 ranks), so that a slowed node stands out of the noise
MIN_WORLD = 2
MAX_RESTARTS = 50
STAGGER_S = 0.5  # node 0's head start: it binds the endpoint
REVIVE_EVERY_S = 5.0  # a node whose launcher exited is started again at most this often
END_WAIT_S = 30.0  # for the launchers to end by themselves once the workers stop at --until
STOP_BOUND_S = 30.0  # for the launchers to stop after SIGTERM
TICK_S = 0.1


# ---------------------------------------------------------------- the sides


@functools.lru_cache(maxsize=None)
def warm_start() -> bool:
    """Whether our launcher has --warm_start (then on the inplace side: a joiner's workers start before it joins)."""
    return harness.ours_has_option("--warm_start")


@dataclass(frozen=True)
class Side:
    name: str

    def command(self, node: int, backend: str, job: str, out: Path, logs: Path, until: float,
                straggler: bool, batch: int = BATCH) -> list:
        endpoint = f"{faults.Network.address(0)}:{PORT}"
        worker = [str(SCRIPT), str(out), "--until", f"{until:.3f}", "--batch", str(batch)]
        common = ["--nnodes=2:3", "--nproc-per-node=1", f"--rdzv-id={job}", f"--max-restarts={MAX_RESTARTS}"]
        if self.name == "torchrun":
            # is_host: torchrun finds the store's host by its host name, which no namespace's address matches
            return [sys.executable, "-m", "torch.distributed.run", *common, "--rdzv-backend=c10d",
                    f"--rdzv-endpoint={endpoint}", f"--rdzv-conf=is_host={int(node == 0)}",
                    f"--local-addr={faults.Network.address(node)}", *worker]
        if backend == "etcd":
            endpoint = f"{faults.BRIDGE_IP}:{ETCD_PORT}"
        extra = []
        if self.name == "inplace":  # what our in-place side runs with, where our launcher has it
            extra = [*(["--straggler_policy=leave"] if straggler else []), *(["--warm_start"] if warm_start() else [])]
        return [sys.executable, "-m", "launcher", *common, f"--rdzv-backend={backend}", f"--rdzv-endpoint={endpoint}",
                f"--log_dir={logs}", *extra, *worker, *(["--inprocess"] if self.name == "inplace" else [])]

    def env(self, node: int) -> dict:
        env = harness.bench_env()
        if self.name == "torchrun":  # torchrun as its users run it: without this repository on the path
            env.pop("PYTHONPATH", None)
            if os.environ.get("PYTHONPATH"):
                env["PYTHONPATH"] = os.environ["PYTHONPATH"]
        return {**env, "GOODPUT_NODE": f"n{node}", "GLOO_SOCKET_IFNAME": faults.IFNAME}


# ---------------------------------------------------------------- one node: its launchers over time


class Node:
    """One node of a run: its namespace and cgroup, and the launchers started on it (one at a time)."""

    def __init__(self, index: int, ns: str, group: faults.CpuGroup, folder: Path):
        self.index, self.ns, self.group, self.folder = index, ns, group, folder
        self.runs: list = []
        self.started_at = float("-inf")

    @property
    def name(self) -> str:
        return f"n{self.index}"

    def running(self) -> bool:
        return bool(self.runs) and not self.runs[-1].exited

    def start(self, side: Side, backend: str, job: str, out: Path, until: float, straggler: bool,
              batch: int = BATCH) -> None:
        label = f"{self.name}-{len(self.runs)}"
        argv = side.command(self.index, backend, job, out, self.folder / "logs" / label, until, straggler, batch)
        self.runs.append(harness.Run(faults.enter_command(argv, self.ns, self.group), self.folder, label,
                                     env=side.env(self.index), cwd=self.folder))
        self.started_at = time.monotonic()

    def kept_text(self) -> str:
        """What this node's launchers kept of their workers' output: their standard output and their log folders."""
        parts = [run.stdout_path.read_text(errors="replace") for run in self.runs if run.stdout_path.exists()]
        logs = self.folder / "logs"
        parts += [p.read_text(errors="replace") for p in sorted(logs.glob(f"{self.name}-*/**/*")) if p.is_file()]
        return "\n".join(parts)


def events_of(folder: Path, node: str) -> list:
    """The events in the event logs of a node's launchers (ours)."""
    found = []
    for path in sorted((folder / "logs").glob(f"{node}-*/**/events.jsonl")):
        for raw in path.read_text(errors="replace").splitlines():
            try:
                found.append(json.loads(raw))
            except ValueError:
                continue
    return found


# ---------------------------------------------------------------- the machine: network, etcd


@contextmanager
def network_of(nodes: int, backend: str, folder: Path) -> Iterator[faults.Network]:
    """The nodes' namespaces (and an etcd in the bridge's, with ``backend`` etcd), removed on the way out."""
    with faults.Network() as net, ExitStack() as stack:
        for i in range(nodes):
            net.add_node(i)
        if backend == "etcd":
            stack.enter_context(etcd_in(net.bridge_ns, folder))
        yield net


@contextmanager
def etcd_in(ns: str, folder: Path) -> Iterator[None]:
    faults.require_tool("etcd", "--backend etcd")
    url = f"http://{faults.BRIDGE_IP}"
    data = Path(tempfile.mkdtemp(prefix="etcd-", dir=folder))
    env = {k: v for k, v in os.environ.items() if not k.startswith("ETCD")}
    argv = ["etcd", "--name", "gp", "--data-dir", str(data), "--listen-client-urls", f"{url}:{ETCD_PORT}",
            "--advertise-client-urls", f"{url}:{ETCD_PORT}", "--listen-peer-urls", f"{url}:{ETCD_PORT + 1}",
            "--initial-advertise-peer-urls", f"{url}:{ETCD_PORT + 1}", "--initial-cluster", f"gp={url}:{ETCD_PORT + 1}"]
    with open(folder / "etcd.log", "wb") as log:
        proc = subprocess.Popen(faults.enter_command(argv, ns), env=env, stdin=subprocess.DEVNULL, stdout=log,
                                stderr=log, start_new_session=True)
    try:
        deadline = time.monotonic() + 30
        while b"ready to serve client requests" not in (folder / "etcd.log").read_bytes():
            if proc.poll() is not None or time.monotonic() > deadline:
                raise harness.BenchError(f"etcd did not start (see {folder / 'etcd.log'})")
            time.sleep(0.1)
        yield
    finally:
        proc.kill()
        proc.wait(10)


# ---------------------------------------------------------------- one run


@dataclass
class RunResult:
    side: str
    seed: Optional[int]  # None: the fault-free run
    start: float
    duration: float
    lines: list = field(default_factory=list)
    violations: list = field(default_factory=list)
    exits: str = ""
    straggler_named_s: Optional[float] = None
    straggler_back_s: Optional[float] = None
    faults: tuple = ()
    fault_times: list = field(default_factory=list)  # (kind, node, absolute start, absolute end)

    def samples(self) -> tuple:
        return check.trained(self.lines, self.start, self.start + self.duration)


class Run:
    """One side's run under one schedule (or none): starts, faults, revivals, the stop and what is left."""

    def __init__(self, side: Side, schedule: tuple, duration: float, net: faults.Network, backend: str,
                 folder: Path, straggler: bool):
        self.side, self.schedule, self.duration, self.net = side, schedule, duration, net
        self.backend, self.folder, self.straggler = backend, folder, straggler
        self.out = folder / "out"
        self.out.mkdir(parents=True)
        self.job = f"gp-{uuid.uuid4().hex[:8]}"
        self.nodes: list = []
        self.begun: set = set()  # the faults begun
        self.ended: set = set()  # the faults undone
        self.exempt: list = []  # (node, from, to): lines that a power-off may take from a launcher's pipe
        self.partitions: list = []  # (node, cut, healed)
        self.t0 = 0.0

    def execute(self) -> RunResult:
        with ExitStack() as stack:
            for i in range(plan.NODES + 1):
                group = faults.CpuGroup.create(f"{self.net.prefix}-{self.side.name}-n{i}")
                stack.callback(group.remove)
                self.nodes.append(Node(i, self.net.ns(i), group, self.folder))
            try:
                self.t0 = time.time()
                self.until = self.t0 + self.duration
                self.loop()
            finally:
                self.release_faults()
                exits, left = self.stop()
        result = RunResult(self.side.name, None, self.t0, self.duration, exits=exits)
        result.lines = [line for path in sorted(self.out.glob("steps.*.jsonl"))
                        for line in check.parse(path.read_text(errors="replace"))]
        captured = {n.name: {(l.pid, l.seq) for l in check.parse(n.kept_text())} for n in self.nodes}
        result.violations = check.violations(result.lines, BATCH, MIN_WORLD, self.partitions, captured, self.exempt,
                                             left)
        result.faults = self.schedule
        result.fault_times = [(f.kind, f.node, self.t0 + f.start, self.t0 + f.end) for f in self.schedule]
        return result

    def loop(self) -> None:
        for node in self.nodes[:plan.NODES]:
            self.start(node)
            if node.index == 0:
                time.sleep(STAGGER_S)
        while (now := time.time()) < self.until:
            at = now - self.t0
            for i, fault in enumerate(self.schedule):
                if i not in self.begun and at >= fault.start:
                    self.begin(i, fault)
                if i in self.begun and i not in self.ended and at >= fault.end and fault.end > fault.start:
                    self.end(i, fault)
            self.revive(at)
            time.sleep(TICK_S)

    def start(self, node: Node) -> None:
        node.start(self.side, self.backend, self.job, self.out, self.until, self.straggler)

    def begin(self, i: int, fault: plan.Fault) -> None:
        self.begun.add(i)
        node, now = self.nodes[fault.node], time.time()
        harness.progress(f"    {now - self.t0:5.1f} s: {fault.kind} {node.name}")
        if fault.kind == "slow":
            node.group.limit(plan.SLOW_CPUS)
        elif fault.kind == "poweroff":
            self.exempt.append((node.name, now - 2.0, now + 1.0))
            node.group.kill_all()
        elif fault.kind == "freeze":
            node.group.signal(signal.SIGSTOP)
        elif fault.kind == "partition":
            self.net.cut(fault.node)
            self.partitions.append((node.name, now, float("inf")))
        elif fault.kind == "join":
            self.start(node)
            self.ended.add(i)

    def end(self, i: int, fault: plan.Fault) -> None:
        self.ended.add(i)
        node = self.nodes[fault.node]
        harness.progress(f"    {time.time() - self.t0:5.1f} s: {fault.kind} {node.name} undone")
        if fault.kind == "slow":
            node.group.lift()
        elif fault.kind == "freeze":
            node.group.signal(signal.SIGCONT)
        elif fault.kind == "partition":
            self.net.heal(fault.node)
            self.partitions = [(n, cut, time.time() if n == node.name and healed == float("inf") else healed)
                               for n, cut, healed in self.partitions]

    def revive(self, at: float) -> None:
        """Start again, as a node agent would, every node whose launcher exited while no fault holds it."""
        if self.until - time.time() < 10:
            return
        for node in self.nodes:
            held = any(f.holds(node.index, at) for f in self.schedule)
            if node.runs and not node.running() and not held and time.monotonic() - node.started_at > REVIVE_EVERY_S:
                harness.progress(f"    {at:5.1f} s: {node.name} started again (its launcher exited "
                                 f"{node.runs[-1].exit_code})")
                self.start(node)

    def release_faults(self) -> None:
        """Every fault still on undone: quotas lifted, frozen nodes thawed, partitions healed."""
        for i, fault in enumerate(self.schedule):
            if i in self.begun and i not in self.ended and fault.end > fault.start:
                try:
                    self.end(i, fault)
                except Exception as e:  # the stop must go on
                    harness.progress(f"    could not undo {fault.kind}: {e}")

    def stop(self) -> tuple:
        """Wait for the launchers to end (the workers stop at --until), SIGTERM those that do not, then what is
        left in the nodes' cgroups is named and killed: (exit codes, the processes left)."""
        runs = [run for node in self.nodes for run in node.runs]
        deadline = time.time() + END_WAIT_S
        for run in runs:
            run.exited_by(deadline)
        termed = [run for run in runs if not run.exited]
        for run in termed:
            run.proc.send_signal(signal.SIGTERM)
        deadline = time.time() + STOP_BOUND_S
        for run in runs:
            run.exited_by(deadline)
        time.sleep(0.5)
        left = [describe(pid) for node in self.nodes for pid in node.group.pids()]
        left += [describe(pid) for run in runs for pid in harness.tagged_processes(run.tag)
                 if describe(pid) not in left]
        for node in self.nodes:
            node.group.kill_all()
        for run in runs:
            run.stop()
        exits = ", ".join(f"{node.name}: " + " ".join(
            ("TERM->" if run in termed else "") + str(run.exit_code) for run in node.runs)
            for node in self.nodes if node.runs)
        return exits, left


def describe(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            command = f.read().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return str(pid)
    return f"{pid} {command[:100].strip()}"


# ---------------------------------------------------------------- the figures and the table


def straggler_figures(result: RunResult, nodes_events: list, rate: float) -> None:
    slow = next((f for f in result.fault_times if f[0] == "slow"), None)
    if slow is None:
        return
    _, node, start, _ = slow
    result.straggler_named_s = check.named_after(nodes_events, faults.Network.address(node), start)
    if result.straggler_named_s is not None:
        result.straggler_back_s = check.back_after(check.commit_times(result.lines),
                                                   start + result.straggler_named_s, rate)


def summary(values: list) -> str:
    values = [v for v in values if v is not None]
    if not values:
        return "-"
    text = f"{statistics.median(values):.3g}"
    return text + (f" ({min(values):.3g}-{max(values):.3g})" if len(values) > 1 else "")


def table(results: dict, baselines: dict, straggler: bool) -> str:
    head = "| side | goodput | samples (fault-free) | redone | invariants broken |"
    if straggler:
        head += " straggler named (s) | back at 90% (s) |"
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    for side, runs in results.items():
        free = baselines[side].samples()[0]
        goods = [check.goodput(r.samples()[0], free) for r in runs]
        broken = sum(len(r.violations) for r in runs) + len(baselines[side].violations)
        row = (f"| {side} | {summary(goods)} | {summary([r.samples()[0] for r in runs])} ({free}) | "
               f"{summary([r.samples()[1] for r in runs])} | {broken} |")
        if straggler:
            row += f" {summary([r.straggler_named_s for r in runs])} | {summary([r.straggler_back_s for r in runs])} |"
        lines.append(row)
    return "\n".join(lines)


def broken_note(results: dict, baselines: dict) -> str:
    notes = []
    for side, runs in results.items():
        for r in [baselines[side], *runs]:
            for v in r.violations:
                notes.append(f"{side} {'fault-free' if r.seed is None else f'seed {r.seed}'}: {v.kind}: {v.detail}")
    return "Invariants broken: " + ("; ".join(notes) if notes else "none.")


# ---------------------------------------------------------------- main


SCENARIOS = {"faults": plan.schedule, "spare": plan.spare_schedule}


def parse_args(argv: list) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description="Goodput of an elastic job under seeded faults.")
    parser.add_argument("--seeds", type=int, default=3, help="schedules run (default 3)")
    parser.add_argument("--first-seed", type=int, default=1)
    parser.add_argument("--duration", type=float, default=120.0, help="seconds of each run (default 120)")
    parser.add_argument("--sides", default=",".join(SIDES), help="of: " + ",".join(SIDES))
    parser.add_argument("--backend", choices=("c10d", "etcd"), default="c10d",
                        help="our sides' membership (torchrun stays on c10d)")
    parser.add_argument("--scenario", choices=tuple(SCENARIOS), default="faults",
                        help="faults: one of each kind; spare: a standby waits from the start, members powered off")
    parser.add_argument("--keep", type=Path, help="keep every run's folder there (launchers' output, step lines)")
    parser.add_argument("--json", type=Path, help="write every run's figures there")
    args = parser.parse_args(argv)
    if set(args.sides.split(",")) - set(SIDES) or args.seeds < 1 or not 30 <= args.duration <= 3600:
        parser.error(f"--sides takes {','.join(SIDES)}; --seeds from 1; --duration 30 to 3600 s")
    return args


def measure(args: argparse.Namespace, root: Path, straggler: bool) -> tuple:
    sides = [Side(name) for name in args.sides.split(",")]
    seeds = list(range(args.first_seed, args.first_seed + args.seeds))
    results: dict = {s.name: [] for s in sides}
    baselines: dict = {}
    with network_of(plan.NODES + 1, args.backend, root) as net:
        for seed in [None, *seeds]:
            schedule = () if seed is None else SCENARIOS[args.scenario](seed, args.duration)
            if seed is not None:
                harness.progress(f"seed {seed}: {plan.describe(schedule)}")
            for side in sides:
                began = time.monotonic()
                folder = root / f"{side.name}-{'free' if seed is None else seed}"
                try:
                    result = Run(side, schedule, args.duration, net, args.backend, folder, straggler).execute()
                except (OSError, RuntimeError, harness.BenchError) as e:  # one run failing must not end the bench
                    result = RunResult(side.name, seed, time.time(), args.duration, faults=schedule,
                                       violations=[check.Violation("error", f"{type(e).__name__}: {e}")])
                result.seed = seed
                if seed is None:
                    baselines[side.name] = result
                else:
                    rate = baselines[side.name].samples()[0] / args.duration
                    events = [e for node in range(plan.NODES + 1) for e in events_of(folder, f"n{node}")]
                    straggler_figures(result, events, rate)
                    results[side.name].append(result)
                samples, redone = result.samples()
                harness.progress(f"  {side.name} {'fault-free' if seed is None else f'seed {seed}'}: {samples} samples"
                                 f" ({redone} redone), {len(result.violations)} invariant(s) broken, exits "
                                 f"[{result.exits}] ({time.monotonic() - began:.0f} s)")
    return results, baselines


def as_json(args: argparse.Namespace, argv: list, results: dict, baselines: dict, text: str) -> dict:
    def run(r: RunResult) -> dict:
        samples, redone = r.samples()
        free = baselines[r.side].samples()[0]
        return {"seed": r.seed, "samples": samples, "redone": redone,
                "goodput": check.goodput(samples, free) if r.seed is not None else 1.0,
                "violations": [v.__dict__ for v in r.violations], "exits": r.exits,
                "faults": [f.as_dict() for f in r.faults], "straggler_named_s": r.straggler_named_s,
                "straggler_back_s": r.straggler_back_s}
    return {"command": ["bench/goodput.py", *argv], "backend": args.backend, "duration": args.duration,
            "fault_free": {side: run(b) for side, b in baselines.items()},
            "runs": {side: [run(r) for r in runs] for side, runs in results.items()}, "table": text}


def stop_on_sigterm(signum: int, _frame) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def main(argv: Optional[list] = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = parse_args(argv)
    try:
        faults.require_root("bench/goodput.py (namespaces, cgroups)")
        faults.firewall()
    except faults.Unavailable as e:
        print(f"goodput: {e}", file=sys.stderr)
        return 2
    signal.signal(signal.SIGTERM, stop_on_sigterm)  # the namespaces, cgroups and processes removed on the way out
    straggler = harness.ours_has_option("--straggler_policy")
    if args.keep:
        args.keep.mkdir(parents=True, exist_ok=True)
    with ExitStack() as stack:
        root = args.keep or stack.enter_context(harness.temp_root())
        results, baselines = measure(args, root, straggler)
    text = table(results, baselines, straggler)
    print(f"{text}\n\n{broken_note(results, baselines)}", flush=True)
    if args.json:
        args.json.write_text(json.dumps(as_json(args, argv, results, baselines, text), indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
