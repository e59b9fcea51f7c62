"""One run's elastic job for bench/elastic.py: its launchers, the steps their workers wrote, the processes of a node.

A ``Side`` is one launcher measured (its module, its environment, its workers' program); a ``Job`` starts that
side's launchers on one endpoint, all with the same line, and reads the step lines of the workers as they come
(``elastic_train.py``'s files; or, run as docs/elastic.md shows, examples/elastic_inprocess.py's ``time=... step=...
world=...`` lines in each node's worker logs); ``signal_node`` signals every process of one node in one sweep;
``stop_all`` ends a run: SIGTERM to every launcher still running, then whatever is left of the run
(the harness's tag in its environment) is reported and killed.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator, Optional

import psutil

sys.path.insert(0, str(Path(__file__).resolve().parent))
import harness  # noqa: E402
import faults  # noqa: E402

SCRIPT = harness.BENCH / "elastic_train.py"
EXAMPLE = Path("examples") / "elastic_inprocess.py"  # in the repository measured
EXAMPLE_LINE = re.compile(rb"^time=(\S+) step=(\d+) world=(\d+) rank=(\d+) pid=(\d+) ", re.M)
STAGGER_S = 0.5  # the first launcher's head start
EVENT_BOUND_S = 90.0  # for the figure, after the event
STOP_BOUND_S = 30.0  # for the launchers to stop after SIGTERM
POLL_S = 0.05
PORTS = 8  # the block reserved: our control channel one below the endpoint, a few above it


# ---------------------------------------------------------------- the launchers


@dataclass(frozen=True)
class Side:
    """One launcher measured: its module and the environment its launchers start in."""

    name: str
    module: str
    env: dict
    worker_flags: tuple = ()  # given to every worker (``--inprocess``)
    script: Path = SCRIPT  # the workers' program
    example: bool = False  # examples/elastic_inprocess.py: given ``--steps`` only, its lines read from the worker logs

    def command(self, port: int, rdzv_id: str, max_restarts: int, conf: Optional[str], worker: list,
                etcd: Optional[str] = None, nnodes: str = "2:3", warm: bool = False) -> list:
        """The line of every node: around an endpoint on ``port``, or with ``etcd`` (HOST:PORT) keeping the
        membership: ours ``--rdzv-backend=etcd`` (the workers' ports from ``port`` on), torchrun's ``etcd-v2``.
        ``warm``: ours with workers kept in place also ``--warm_start`` (a joiner's or a standby's workers wait
        ready in ``launcher.runtime.elastic.run``)."""
        extra = [f"--rdzv-conf={conf}"] if conf else []
        if warm and self.module == "launcher" and (self.example or "--inprocess" in self.worker_flags):
            extra.append("--warm_start")
        if etcd is None:
            rendezvous = ["--rdzv-backend=c10d", f"--rdzv-endpoint=127.0.0.1:{port}"]
        elif self.module == "launcher":
            rendezvous = ["--rdzv-backend=etcd", f"--rdzv-endpoint={etcd}", f"--started_port={port}"]
        else:
            rendezvous = ["--rdzv-backend=etcd-v2", f"--rdzv-endpoint={etcd}"]
        if self.example:  # its own options only: the step to stop at (it takes no folder and no deadline)
            worker = [value for i in range(len(worker) - 1) if worker[i] == "--steps" for value in worker[i:i + 2]]
        return [sys.executable, "-m", self.module, f"--nnodes={nnodes}", "--nproc-per-node=1", *rendezvous,
                f"--rdzv-id={rdzv_id}", f"--max-restarts={max_restarts}", *extra, str(self.script),
                *map(str, worker), *self.worker_flags]


def sides(repo: Path) -> list:
    """Ours with ``repo`` first on PYTHONPATH (its workers restarted at a membership change, and "inprocess": kept,
    ``launcher.runtime.elastic``); torchrun with the caller's PYTHONPATH; "example": ours running ``repo``'s
    examples/elastic_inprocess.py, each node with a ``--log_dir`` of its own, as docs/elastic.md shows it."""
    base = harness.bench_env()
    outer = os.environ.get("PYTHONPATH")
    ours = {**base, "PYTHONPATH": os.pathsep.join(filter(None, [str(repo), outer]))}
    theirs = {k: v for k, v in base.items() if k != "PYTHONPATH"}
    if outer:
        theirs["PYTHONPATH"] = outer
    return [Side("ours", "launcher", ours), Side("inprocess", "launcher", ours, ("--inprocess",)),
            Side("torchrun", "torch.distributed.run", theirs),
            Side("example", "launcher", ours, script=repo / EXAMPLE, example=True)]


# ---------------------------------------------------------------- one run's job and its steps


@dataclass
class Figure:
    """One run's figure: seconds, or a verdict ("lost", "hung", "never", "error") and what explains it."""

    seconds: Optional[float] = None
    verdict: str = ""
    detail: str = ""  # shown in the table
    said: str = ""  # the last line of what the launchers wrote to stderr (in the JSON file only)


class Job:
    """The launchers of one run of one side, all on one endpoint, and the steps their workers wrote."""

    def __init__(self, side: Side, folder: Path, ports: harness.PortReservations, max_restarts: int,
                 conf: Optional[str], worker_args: list, bound: float = EVENT_BOUND_S, etcd: Optional[str] = None,
                 lose_first: bool = False, nnodes: str = "2:3", warm: bool = False):
        self.side, self.folder, self.bound, self.lose_first = side, folder, bound, lose_first
        self.out = folder / "out"
        self.out.mkdir()
        self.port = ports.reserve_block(PORTS) + 1
        self.argv = side.command(self.port, f"bench-{uuid.uuid4().hex[:8]}", max_restarts, conf,
                                 [self.out, *worker_args], etcd, nnodes, warm)
        self.nodes: list[harness.Run] = []
        self.records: list[dict] = []
        self.workers_seen: set = set()  # pids of the training script's processes under ``watched`` in the last wait
        self._offsets: dict[Path, int] = {}

    def start(self, count: int) -> list:
        """``count`` more launchers; with none running yet, the first one 0.5 s ahead of the others."""
        started = []
        for _ in range(count):
            if len(self.nodes) == 1 and len(started) == 1:
                time.sleep(STAGGER_S)
            node = harness.Run(self.node_argv(len(self.nodes)), self.folder, f"node{len(self.nodes)}",
                               env=self.side.env, cwd=self.folder)
            self.nodes.append(node)
            started.append(node)
        return started

    def node_argv(self, index: int) -> list:
        """Node ``index``'s line: the job's, and with the example a log folder of its own (``node<index>-log``)."""
        if not self.side.example:
            return self.argv
        at = self.argv.index(str(self.side.script))
        return [*self.argv[:at], f"--log_dir={self.log_dir(index)}", *self.argv[at:]]

    def log_dir(self, index: int) -> Path:
        return self.folder / f"node{index}-log"

    def refresh(self) -> list:
        """Every step line written so far (complete lines only), in the order read."""
        if self.side.example:
            return self._refresh_logs()
        for path in sorted(self.out.glob("steps.*.jsonl")):
            with open(path, "rb") as f:
                f.seek(self._offsets.get(path, 0))
                data = f.read()
            complete = data[:data.rfind(b"\n") + 1]
            self._offsets[path] = self._offsets.get(path, 0) + len(complete)
            self.records += [json.loads(line) for line in complete.splitlines()]
        return self.records

    def _refresh_logs(self) -> list:
        """The example's step lines, from every node's worker logs (a worker kept from one round to the next writes
        to its new rank's log), as ``elastic_train.py``'s records; ``host_pid``: the launcher of the node whose log
        it is."""
        for index, node in enumerate(self.nodes):
            for path in sorted(self.log_dir(index).glob("workerlog.*")):
                with open(path, "rb") as f:
                    f.seek(self._offsets.get(path, 0))
                    data = f.read()
                complete = data[:data.rfind(b"\n") + 1]
                self._offsets[path] = self._offsets.get(path, 0) + len(complete)
                self.records += [{"t": float(t), "step": int(step), "world": int(world), "rank": int(rank),
                                  "pid": int(pid), "host_pid": node.proc.pid}
                                 for t, step, world, rank, pid in EXAMPLE_LINE.findall(complete)]
        return self.records

    def wait(self, found: Callable[[list], Optional[float]], bound: float, watched: list) -> tuple:
        """Poll the steps until ``found`` gives a time: (that time, ""); or ``(None, "ended")`` once every
        launcher of ``watched`` has exited, ``(None, "timeout")`` after ``bound`` seconds."""
        deadline = time.monotonic() + bound
        looked, self.workers_seen = 0.0, set()
        while True:
            if time.monotonic() - looked > 1.0:
                self.workers_seen |= self.workers(watched)
                looked = time.monotonic()
            at = found(self.refresh())
            if at is not None:
                return at, ""
            if watched and all(node.exited for node in watched):
                at = found(self.refresh())  # a last line may have come just before the exit
                return (at, "") if at is not None else (None, "ended")
            if time.monotonic() > deadline:
                return None, "timeout"
            time.sleep(POLL_S)

    def workers(self, nodes: list) -> set:
        """The pids of the processes that run the training script under ``nodes``, now."""
        found = set()
        for pid in (pid for node in nodes if not node.exited for pid in harness.descendants(node.proc.pid)):
            try:
                if str(self.side.script) in psutil.Process(pid).cmdline():
                    found.add(pid)
            except psutil.Error:
                continue
        return found

    def codes(self, nodes: list) -> str:
        return ", ".join(f"{self.name(n)} {'running' if not n.exited else f'exit {n.exit_code}'}" for n in nodes)

    def name(self, node: harness.Run) -> str:
        return f"node{self.nodes.index(node)}"


def first_step(world: int, after: float = 0.0, host: Optional[int] = None) -> Callable[[list], Optional[float]]:
    """The time of the first step at ``world`` written after ``after`` (by a worker of launcher ``host``)."""
    def found(records: list) -> Optional[float]:
        times = [r["t"] for r in records if r["world"] == world and r["t"] > after
                 and (host is None or r["host_pid"] == host)]
        return min(times, default=None)
    return found


def first_full_step(world: int, after: float = 0.0, without: frozenset = frozenset()) -> Callable[[list], Optional[float]]:
    """When the first step that every one of ``world`` ranks wrote (at that world size, after ``after``, none of
    its lines by a process of ``without``) was complete."""
    def found(records: list) -> Optional[float]:
        ranks: dict = {}
        for r in records:
            if r["world"] == world and r["t"] > after and r["pid"] not in without:
                ranks.setdefault(r["step"], {})[r["rank"]] = r["t"]
        done = [max(by_rank.values()) for by_rank in ranks.values() if len(by_rank) == world]
        return min(done, default=None)
    return found


# ---------------------------------------------------------------- an etcd of the benchmark's own


@contextlib.contextmanager
def local_etcd(folder: Path, bound: float = 20.0) -> Iterator[str]:
    """A one-member etcd on 127.0.0.1 (``etcd`` on PATH), its data and log under ``folder``, for as long as the
    block runs; its client endpoint (HOST:PORT)."""
    etcd = shutil.which("etcd")
    if etcd is None:
        raise harness.BenchError("--etcd local needs etcd on PATH")
    folder.mkdir(parents=True, exist_ok=True)
    with harness.PortReservations() as ports:  # released before etcd binds them
        client = ports.reserve_block(2)
    peer = client + 1
    url = "http://127.0.0.1"
    argv = [etcd, "--name", "bench", "--data-dir", str(folder / "data"),
            "--listen-client-urls", f"{url}:{client}", "--advertise-client-urls", f"{url}:{client}",
            "--listen-peer-urls", f"{url}:{peer}", "--initial-advertise-peer-urls", f"{url}:{peer}",
            "--initial-cluster", f"bench={url}:{peer}"]
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ETCD_", "ETCDCTL_"))}
    with open(folder / "etcd.log", "wb") as log:
        proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    try:
        deadline = time.monotonic() + bound
        while b"ready to serve client requests" not in (folder / "etcd.log").read_bytes():
            if proc.poll() is not None or time.monotonic() > deadline:
                raise harness.BenchError(f"etcd did not start (see {folder / 'etcd.log'})")
            time.sleep(POLL_S)
        yield f"127.0.0.1:{client}"
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


# ---------------------------------------------------------------- processes of a node


def node_pids(node: harness.Run) -> list:
    """The launcher of a node and every process below it or carrying its tag."""
    pids = [node.proc.pid, *harness.descendants(node.proc.pid), *harness.tagged_processes(node.tag)]
    return list(dict.fromkeys(pids))


def signal_node(node: harness.Run, sig: int) -> list:
    """Send ``sig`` to every process of a node, collected first and then signalled in one sweep
    (again for any process started in between, three sweeps at most); the pids signalled."""
    return faults.signal_sweeps(lambda: node_pids(node), sig)


def rendezvous_host(job: Job) -> Optional[harness.Run]:
    """The node one of whose processes listens on the endpoint, if any is found."""
    try:
        listening = {c.pid for c in psutil.net_connections("tcp")
                     if c.status == psutil.CONN_LISTEN and c.laddr.port == job.port and c.pid}
    except psutil.Error:
        return None
    return next((n for n in job.nodes if listening & set(node_pids(n))), None)


def victim(job: Job) -> harness.Run:
    """The node to lose: the last one that is neither the first nor the rendezvous's host; the first one (with
    etcd, ours: the launcher that keeps the membership) when the job says so."""
    if job.lose_first:
        return job.nodes[0]
    host = rendezvous_host(job)
    return [n for n in job.nodes[1:] if n is not host][-1]


def stop_all(job: Job) -> tuple:
    """SIGTERM every launcher still running, wait for them (bounded), then kill what is left of the
    run; (exit codes, descriptions of the processes that were left)."""
    termed = [node for node in job.nodes if not node.exited]
    for node in termed:
        node.proc.send_signal(signal.SIGTERM)
    deadline = time.time() + STOP_BOUND_S
    for node in job.nodes:
        node.exited_by(deadline)
    codes = ", ".join(f"{job.name(n)} {'SIGTERM, then ' if n in termed else ''}"
                      f"{f'exit {n.exit_code}' if n.exited else 'running'}" for n in job.nodes)
    left = [pid for node in job.nodes for pid in harness.tagged_processes(node.tag)]
    if left:
        time.sleep(0.5)  # a stop sequence may still be finishing
        left = [pid for node in job.nodes for pid in harness.tagged_processes(node.tag)]
    described = [describe(pid) for pid in left]
    for node in job.nodes:
        node.stop()
    return codes, described


def said(nodes: list) -> str:
    """What each launcher last said on stderr, each line once: its last line naming an error (torchrun
    ends on a summary table), else its last line."""
    return "; ".join(dict.fromkeys(filter(None, map(last_words, nodes))))


def last_words(node: harness.Run) -> str:
    try:
        lines = [line.strip() for line in node.stderr_path.read_text(errors="replace").splitlines() if line.strip()]
    except OSError:
        return ""
    return next((line for line in reversed(lines) if "Error" in line or "error:" in line), lines[-1] if lines else "")


def describe(pid: int) -> str:
    try:
        return f"{pid} {' '.join(psutil.Process(pid).cmdline())[:120]}"
    except psutil.Error:
        return str(pid)
