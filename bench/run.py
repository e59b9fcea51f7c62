#!/usr/bin/env python3
"""Our launcher against torchrun, side by side, on the same workloads.

    python bench/run.py [--quick | --tiny] [--only NAME,...] [--json FILE] [--plot FILE.png]

Runs each workload with ``python -m launcher`` and ``python -m torch.distributed.run`` in turn
(ours, torchrun, ours, torchrun, ...) and prints one table: the medians, the ratio ours/torchrun
and the goal of issue 4. ``--quick`` takes under a minute on 2 CPU cores, ``--tiny`` a few
seconds per workload (the test suite uses it); the default (full) mode takes a few minutes.

Everything is measured from the outside: wall times around the launcher process, CPU time and
resident memory of the launcher and of its helper processes (its process tree minus the workers
and what they started), with psutil. Workers are the small scripts next to this file. Every run
gets its own folder under one temporary folder, removed at the end; every process started is
bounded by a timeout and killed, with everything it started, when a run ends or fails.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import os
import platform
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Optional

import psutil

BENCH = Path(__file__).resolve().parent
REPO = BENCH.parent
sys.path.insert(0, str(BENCH))
import spew  # noqa: E402  (the log-volume worker: its line format is the check's reference)

TAG_VAR = "LAUNCHER_BENCH_TAG"  # marks every process of one run, to find what outlived it
STRIPPED_VARS = ("OMP_NUM_THREADS", "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE",
                 "GROUP_RANK", "MASTER_ADDR", "MASTER_PORT")
STRIPPED_PREFIXES = ("PADDLE_", "TORCHELASTIC_", "LAUNCHER_")
MiB = 1024 * 1024


class BenchError(Exception):
    """One run could not be measured; the message says why, in one line."""


# ---------------------------------------------------------------- sizes and launchers


@dataclass(frozen=True)
class Sizes:
    reps: int  # runs per launcher, for most workloads
    help_reps: int
    idle_s: float
    log_mb: float  # per worker
    scale_workers: int
    plan_nodes: int
    plan_repeats: int  # plans timed inside one planning run
    train_steps: int
    train_reps: int


MODES = {
    "full": Sizes(reps=3, help_reps=10, idle_s=10, log_mb=200, scale_workers=64,
                  plan_nodes=1000, plan_repeats=20, train_steps=150, train_reps=3),
    "quick": Sizes(reps=1, help_reps=3, idle_s=3, log_mb=20, scale_workers=64,
                   plan_nodes=1000, plan_repeats=5, train_steps=50, train_reps=1),
    "tiny": Sizes(reps=1, help_reps=1, idle_s=0.5, log_mb=0.5, scale_workers=4,
                  plan_nodes=10, plan_repeats=1, train_steps=2, train_reps=1),
}


@dataclass(frozen=True)
class Launcher:
    name: str  # "ours" or "torchrun"

    def help(self) -> list:
        return [sys.executable, "-m", self._module(), "--help"]

    def command(self, nproc: int, script: str, args: list, log_dir: Optional[Path] = None) -> list:
        """The command line that starts ``nproc`` workers of ``bench/<script> args`` on this node."""
        worker = [str(BENCH / script), *map(str, args)]
        if self.name == "ours":
            logs = ["--log_dir", str(log_dir)] if log_dir else []
            return [sys.executable, "-m", "launcher", "--nproc_per_node", str(nproc), *logs, *worker]
        logs = ["--log-dir", str(log_dir), "--redirects", "3", "--tee", "3",
                "--local-ranks-filter", "0"] if log_dir else []
        return [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(nproc),
                "--master-port", str(free_port()), *logs, *worker]

    def log_file(self, log_dir: Path, rank: int) -> Path:
        """Where the launcher put the stdout of worker ``rank``."""
        if self.name == "ours":
            return log_dir / f"workerlog.{rank}"
        found = sorted(log_dir.glob(f"**/attempt_*/{rank}/stdout.log"))
        if not found:
            raise BenchError(f"torchrun wrote no log file for rank {rank} under {log_dir}")
        return found[-1]

    def _module(self) -> str:
        return "launcher" if self.name == "ours" else "torch.distributed.run"


LAUNCHERS = (Launcher("ours"), Launcher("torchrun"))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def bench_env() -> dict:
    """The environment every launcher starts in: ours importable, no leftovers of an outer launch."""
    env = {k: v for k, v in os.environ.items()
           if k not in STRIPPED_VARS and not k.startswith(STRIPPED_PREFIXES)}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    return env


# ---------------------------------------------------------------- one launcher process


@dataclass
class Ctx:
    """What a workload function gets for one run."""

    sizes: Sizes
    tmp: Path  # an empty folder of its own
    notes: list = field(default_factory=list)  # what the run found worth telling, besides numbers


class Run:
    """One launcher process, in its own session, output to files, its exit seen as it happens."""

    def __init__(self, argv: list, ctx: Ctx):
        self.ctx, self.argv = ctx, argv
        self.tag = uuid.uuid4().hex
        self.stdout_path, self.stderr_path = ctx.tmp / "launcher.out", ctx.tmp / "launcher.err"
        env = {**bench_env(), TAG_VAR: self.tag}
        with open(self.stdout_path, "wb") as out, open(self.stderr_path, "wb") as err:
            self.start_time = time.time()
            self.proc = subprocess.Popen(argv, cwd=REPO, env=env, stdin=subprocess.DEVNULL,
                                         stdout=out, stderr=err, start_new_session=True)
        self.exit_time: Optional[float] = None
        self.exit_code: Optional[int] = None  # as subprocess has it: -N for a signal
        self._exited = threading.Event()
        threading.Thread(target=self._watch, daemon=True).start()

    def _watch(self) -> None:
        # Wait for the exit but leave the zombie: its CPU time can still be read.
        try:
            info = os.waitid(os.P_PID, self.proc.pid, os.WEXITED | os.WNOWAIT)
            self.exit_code = info.si_status if info.si_code == os.CLD_EXITED else -info.si_status
        except ChildProcessError:  # cleanup() killed and reaped it first
            self.exit_code = self.proc.returncode
        self.exit_time = time.time()
        self._exited.set()

    def wait(self, timeout: float) -> int:
        """Wait for the launcher's exit; its exit code."""
        if not self._exited.wait(timeout):
            raise BenchError(f"still running after {timeout:.0f} s{self.stderr_tail()}")
        return self.exit_code

    def self_cpu(self) -> float:
        """CPU seconds of the launcher process itself (also once it has exited, until reaped)."""
        t = psutil.Process(self.proc.pid).cpu_times()
        return t.user + t.system

    def stderr_tail(self) -> str:
        try:
            lines = self.stderr_path.read_text(errors="replace").strip().splitlines()
        except OSError:
            return ""
        return f": {lines[-1].strip()}" if lines else ""

    def cleanup(self) -> None:
        """Stop whatever is left of this run; note any process that outlived a launcher that exited."""
        if self._exited.is_set():
            left = tagged_processes(self.tag)
            if left:
                time.sleep(0.5)
                left = tagged_processes(self.tag)
            if left:
                self.ctx.notes.append(f"{len(left)} process(es) outlived the launcher")
        kill_all([self.proc.pid, *descendants(self.proc.pid), *tagged_processes(self.tag)])
        self.proc.wait(timeout=30)


@contextmanager
def running(argv: list, ctx: Ctx):
    run = Run(argv, ctx)
    try:
        yield run
    finally:
        run.cleanup()


def descendants(pid: int) -> list:
    try:
        return [p.pid for p in psutil.Process(pid).children(recursive=True)]
    except psutil.Error:
        return []


def tagged_processes(tag: str) -> list:
    found = []
    for p in psutil.process_iter():
        try:
            if p.status() != psutil.STATUS_ZOMBIE and p.environ().get(TAG_VAR) == tag:
                found.append(p.pid)
        except psutil.Error:
            continue
    return found


def kill_all(pids: list) -> None:
    for pid in pids:
        try:
            psutil.Process(pid).kill()
        except psutil.Error:
            pass


def alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


class TreeSampler:
    """CPU seconds and resident memory of a launcher and its helpers, never of its workers.

    A worker is a process whose environment has RANK (both launchers set it for workers only;
    the harness removes it from theirs); it and everything below it are left out. snapshot()
    reads the tree now; while entered, a thread also samples it every ``interval`` seconds,
    keeping the largest resident memory seen and each helper's last CPU time (a helper may
    exit before the launcher).
    """

    def __init__(self, pid: int, interval: float = 0.2):
        self.pid, self.interval = pid, interval
        self.max_rss = 0
        self.helper_cpu: dict = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()

    def _loop(self) -> None:
        while not self._stop.wait(self.interval):
            self.snapshot()

    def snapshot(self) -> tuple:
        """(CPU seconds, resident bytes) of the launcher and its helpers, now."""
        with self._lock:
            cpu, rss = 0.0, 0
            for p in self._launcher_side():
                try:
                    with p.oneshot():
                        t, mem = p.cpu_times(), p.memory_info().rss
                except psutil.Error:
                    continue
                cpu += t.user + t.system
                rss += mem
                if p.pid != self.pid:
                    self.helper_cpu[p.pid] = t.user + t.system
            self.max_rss = max(self.max_rss, rss)
            return cpu, rss

    def helpers_cpu(self) -> float:
        with self._lock:
            return sum(self.helper_cpu.values())

    def _launcher_side(self) -> list:
        try:
            root = psutil.Process(self.pid)
            tree = root.children(recursive=True)
        except psutil.Error:
            return []
        parent, workers = {}, set()
        for p in tree:
            try:
                parent[p.pid] = p.ppid()
                if "RANK" in p.environ():
                    workers.add(p.pid)
            except psutil.Error:
                workers.add(p.pid)  # gone: nothing to count
        return [root] + [p for p in tree if not self._below(p.pid, workers, parent)]

    def _below(self, pid: int, workers: set, parent: dict) -> bool:
        while pid in parent:
            if pid in workers:
                return True
            pid = parent[pid]
        return False


def wait_for_files(folder: Path, count: int, timeout: float, run: Run) -> float:
    """Wait until ``folder`` holds ``count`` *.ready files; the time it happened."""
    deadline = time.monotonic() + timeout
    while len(list(folder.glob("*.ready"))) < count:
        if run.exit_time is not None:
            raise BenchError(f"the launcher exited ({run.wait(1)}) before all workers were ready{run.stderr_tail()}")
        if time.monotonic() > deadline:
            raise BenchError(f"only {len(list(folder.glob('*.ready')))} of {count} workers ready after {timeout:.0f} s")
        time.sleep(0.002)
    return time.time()


def expect_success(run: Run, code: int) -> None:
    if code != 0:
        raise BenchError(f"exit code {code}{run.stderr_tail()}")


# ---------------------------------------------------------------- the workloads


@dataclass
class Startup:
    seconds: float


def bench_startup(launcher: Launcher, ctx: Ctx) -> Startup:
    """1. ``--help``: wall time until exit."""
    with running(launcher.help(), ctx) as run:
        expect_success(run, run.wait(60))
        return Startup(run.exit_time - run.start_time)


@dataclass
class Job:
    seconds: float


def bench_job(launcher: Launcher, ctx: Ctx) -> Job:
    """2. Two workers: gloo init and one all-reduce, end to end."""
    with running(launcher.command(2, "allreduce.py", []), ctx) as run:
        expect_success(run, run.wait(180))
        return Job(run.exit_time - run.start_time)


@dataclass
class Teardown:
    seconds: float  # from the failing worker's exit to the launcher's exit
    exit_code: int


def bench_teardown(launcher: Launcher, ctx: Ctx) -> Teardown:
    """3. One of 3 workers exits 7 while the others sleep."""
    ready, stamp = ctx.tmp / "ready", ctx.tmp / "stamp"
    ready.mkdir()
    with running(launcher.command(3, "fail.py", [ready, stamp]), ctx) as run:
        code = run.wait(120)
        if not stamp.exists():
            raise BenchError(f"the failing worker never exited (launcher exit code {code}){run.stderr_tail()}")
        return Teardown(run.exit_time - float(stamp.read_text()), code)


@dataclass
class Idle:
    cpu_s: float  # during the idle window
    rss_mib: float  # largest seen during the idle window


def bench_idle(launcher: Launcher, ctx: Ctx) -> Idle:
    """4. Two sleeping workers: the launcher's CPU time and memory over ``idle_s`` seconds."""
    ready = ctx.tmp / "ready"
    ready.mkdir()
    argv = launcher.command(2, "sleeper.py", [ctx.sizes.idle_s + 120, ready])
    with running(argv, ctx) as run:
        wait_for_files(ready, 2, 120, run)
        with TreeSampler(run.proc.pid, interval=0.5) as sampler:
            cpu0, _ = sampler.snapshot()
            time.sleep(ctx.sizes.idle_s)
            cpu1, _ = sampler.snapshot()
        if run.exit_time is not None:
            raise BenchError(f"the launcher exited early ({run.wait(1)}){run.stderr_tail()}")
        return Idle(cpu1 - cpu0, sampler.max_rss / MiB)


@dataclass
class LogVolume:
    seconds: float
    cpu_s: float  # the launcher's and its helpers', whole run
    bad_lines: int  # lines lost, cut or garbled, over both log files and the console


def bench_logs(launcher: Launcher, ctx: Ctx) -> LogVolume:
    """5. Two workers writing ``log_mb`` MB each; logs to files, worker 0 also on the console."""
    log_dir = ctx.tmp / "logs"
    argv = launcher.command(2, "spew.py", [ctx.sizes.log_mb], log_dir=log_dir)
    with running(argv, ctx) as run, TreeSampler(run.proc.pid) as sampler:
        code = run.wait(600)
        cpu = run.self_cpu() + sampler.helpers_cpu()
        expect_success(run, code)
        seconds = run.exit_time - run.start_time
    n = spew.line_count(ctx.sizes.log_mb)
    bad = sum(bad_lines(launcher.log_file(log_dir, r).read_bytes(), r, n) for r in (0, 1))
    bad += bad_lines(run.stdout_path.read_bytes(), 0, n)
    return LogVolume(seconds, cpu, bad)


_expected_cache: dict = {}


def expected_lines(rank: int, n: int) -> list:
    if (rank, n) not in _expected_cache:
        _expected_cache[(rank, n)] = [spew.line(rank, i)[:-1] for i in range(n)]
    return _expected_cache[(rank, n)]


def bad_lines(data: bytes, rank: int, n: int) -> int:
    """How many of the ``n`` lines of worker ``rank`` are missing from ``data`` or not whole.

    Other lines (headers, the launcher's messages) are ignored; a line may carry a prefix.
    """
    marker = f"bench r{rank} n".encode()
    found = [line[line.find(marker):] for line in data.split(b"\n") if marker in line]
    expected = expected_lines(rank, n)
    if found == expected:
        return 0
    good = set(expected).intersection(found)
    return (n - len(good)) + sum(1 for line in found if line not in good)


@dataclass
class Scale:
    running_s: float  # from the launcher's start until every worker runs
    stopped_s: float  # from SIGTERM to the launcher until the launcher and every worker are gone
    exit_code: int


def bench_scale(launcher: Launcher, ctx: Ctx) -> Scale:
    """6. ``scale_workers`` sleeping CPU workers: up, then SIGTERM to the launcher."""
    n, ready = ctx.sizes.scale_workers, ctx.tmp / "ready"
    ready.mkdir()
    with running(launcher.command(n, "sleeper.py", [600, ready]), ctx) as run:
        all_running = wait_for_files(ready, n, 180, run)
        pids = [int(f.read_text()) for f in ready.glob("*.ready")]
        sigterm = time.time()
        os.kill(run.proc.pid, signal.SIGTERM)
        code = run.wait(120)
        stopped, deadline = run.exit_time, time.monotonic() + 60
        while any(alive(pid) for pid in pids):
            if time.monotonic() > deadline:
                raise BenchError(f"{sum(map(alive, pids))} workers still alive 60 s after the launcher exited")
            time.sleep(0.002)
            stopped = time.time()
        return Scale(all_running - run.start_time, stopped - sigterm, code)


@dataclass
class Planning:
    ms: float  # one plan for node 0
    env_kib: float  # variables the launcher adds for one worker


def bench_planning(launcher: Launcher, ctx: Ctx) -> Planning:
    """7. The plan for ``plan_nodes`` nodes x 8 GPUs, computed in one process, nothing started."""
    s = ctx.sizes
    argv = [sys.executable, str(BENCH / "plan_time.py"), launcher.name, str(s.plan_nodes), "8", str(s.plan_repeats)]
    with running(argv, ctx) as run:
        expect_success(run, run.wait(120))
        result = json.loads(run.stdout_path.read_text().strip().splitlines()[-1])
    return Planning(result["seconds"] * 1000, result["env_bytes"] / 1024)


@dataclass
class Training:
    steps_per_s: float  # rank 0's
    cpu_ms: float  # rank 0's CPU time per step, all threads: less sensitive to other load


def bench_training(api: str) -> Callable[[Launcher, Ctx], Training]:
    """8. The seed's MLP on 2 CPU workers through our fleet ``api``; torchrun: hand-written DDP."""
    return lambda launcher, ctx: Training(*train(launcher, ctx, api if launcher.name == "ours" else "ddp"))


def train(launcher: Launcher, ctx: Ctx, api: str) -> tuple:
    """(steps per second, CPU ms per step) of rank 0 in one training run through ``api``."""
    out = ctx.tmp / api
    out.mkdir()
    with running(launcher.command(2, "train.py", [api, ctx.sizes.train_steps, out]), ctx) as run:
        expect_success(run, run.wait(300))
    results = [json.loads((out / f"train.{r}.json").read_text()) for r in (0, 1)]
    a, b = (r["checksum"] for r in results)
    if abs(a - b) > 1e-6 * max(1.0, abs(a)):
        raise BenchError(f"{api}: the ranks' parameters differ after training ({a} != {b}): gradients not synchronised")
    return results[0]["steps_per_s"], results[0]["cpu_ms_per_step"]


# ---------------------------------------------------------------- what is reported


@dataclass(frozen=True)
class Goal:
    text: str
    met: Callable[[Any, Any, Optional[float]], bool]  # (ours, torchrun, ratio) -> met?


def at_most(limit: float) -> Goal:
    return Goal(f"<= {limit:g}", lambda o, t, r: r is not None and r <= limit)


def at_least(limit: float) -> Goal:
    return Goal(f">= {limit:g}", lambda o, t, r: r is not None and r >= limit)


def same_codes(xs: list):
    """An exit code, or all of them when the runs disagree."""
    return xs[0] if len(set(xs)) == 1 else "/".join(map(str, sorted(set(xs))))


@dataclass(frozen=True)
class Metric:
    field: str
    label: str
    goal: Optional[Goal] = None
    summary: Callable[[list], Any] = statistics.median
    ratio: bool = True
    digits: int = 3


@dataclass(frozen=True)
class Workload:
    name: str
    title: Callable[[Sizes], str]
    run: Callable[[Launcher, Ctx], Any]
    metrics: tuple
    reps: Callable[[Sizes], int] = lambda s: s.reps


WORKLOADS = (
    Workload("startup", lambda s: "1. start-up: --help", bench_startup,
             (Metric("seconds", "wall time (s)", at_most(0.1)),), reps=lambda s: s.help_reps),
    Workload("job", lambda s: "2. 2-worker job: gloo + all-reduce", bench_job,
             (Metric("seconds", "wall time (s)", at_most(0.75)),)),
    Workload("teardown", lambda s: "3. teardown: 1 of 3 workers exits 7", bench_teardown, (
        Metric("seconds", "worker exit -> launcher exit (s)", at_most(0.15)),
        Metric("exit_code", "launcher exit code", Goal("= 7", lambda o, t, r: o == 7),
               summary=same_codes, ratio=False),
    )),
    Workload("idle", lambda s: f"4. idle: 2 sleeping workers, {s.idle_s:g} s", bench_idle, (
        Metric("cpu_s", "launcher CPU in the idle window (s)", Goal("<= torchrun", lambda o, t, r: o <= t)),
        Metric("rss_mib", "launcher resident memory (MiB)", at_most(0.25)),
    )),
    Workload("logs", lambda s: f"5. log volume: 2 workers x {s.log_mb:g} MB", bench_logs, (
        Metric("seconds", "wall time (s)", at_most(0.5)),
        Metric("cpu_s", "launcher CPU (s)"),
        Metric("bad_lines", "lines lost or cut", Goal("0", lambda o, t, r: o == 0), summary=max, ratio=False),
    )),
    Workload("scale", lambda s: f"6. scale: {s.scale_workers} sleeping CPU workers", bench_scale, (
        Metric("running_s", "start -> all running (s)"),
        Metric("stopped_s", "SIGTERM -> all stopped (s)"),
        Metric("exit_code", "launcher exit code after SIGTERM", summary=same_codes, ratio=False),
    )),
    Workload("planning", lambda s: f"7. planning: {s.plan_nodes} nodes x 8 GPUs", bench_planning, (
        Metric("ms", "plan of node 0 (ms)"),
        Metric("env_kib", "env added per worker (KiB)"),
    )),
    Workload("train-optimizer", lambda s: f"8a. training, {s.train_steps} steps: distributed_optimizer vs DDP",
             bench_training("optimizer"), (
        Metric("steps_per_s", "steps/s", at_least(1.0)),
        Metric("cpu_ms", "worker CPU per step (ms)"),
    ), reps=lambda s: s.train_reps),
    Workload("train-model", lambda s: f"8b. training, {s.train_steps} steps: distributed_model vs DDP",
             bench_training("model"), (
        Metric("steps_per_s", "steps/s", at_least(1.0)),
        Metric("cpu_ms", "worker CPU per step (ms)"),
    ), reps=lambda s: s.train_reps),
)


@dataclass
class Row:
    workload: str
    metric: str
    ours: Any
    torchrun: Any
    ratio: Optional[float]
    goal: str
    met: Optional[bool]  # None: no goal, or a side has no figure
    samples: dict  # launcher name -> every run's value
    errors: dict = field(default_factory=dict)  # launcher name -> footnote number


@dataclass
class Outcome:
    samples: dict  # launcher name -> list of results
    errors: dict  # launcher name -> why it could not be measured
    notes: list


def measure(workload: Workload, sizes: Sizes, root: Path) -> Outcome:
    """Run ``workload`` with each launcher in turn, ``reps`` times; a side that fails once stops."""
    outcome = Outcome({l.name: [] for l in LAUNCHERS}, {}, [])
    for rep in range(workload.reps(sizes)):
        for launcher in LAUNCHERS:
            if launcher.name in outcome.errors:
                continue
            ctx = Ctx(sizes, root / f"{workload.name}-{launcher.name}-{rep}")
            ctx.tmp.mkdir()
            began = time.monotonic()
            try:
                outcome.samples[launcher.name].append(workload.run(launcher, ctx))
            except Exception as e:  # one side failing must not end the whole benchmark
                outcome.errors[launcher.name] = str(e) if isinstance(e, BenchError) else f"{type(e).__name__}: {e}"
            finally:
                outcome.notes += [f"{launcher.name}: {n}" for n in ctx.notes]
                remove_tree(ctx.tmp)
            state = "failed" if launcher.name in outcome.errors else "done"
            progress(f"  {workload.name}: {launcher.name} run {rep + 1} {state} ({time.monotonic() - began:.1f} s)")
    return outcome


def rows_of(workload: Workload, outcome: Outcome, title: str) -> list:
    rows = []
    for m in workload.metrics:
        values = {name: [getattr(r, m.field) for r in results] for name, results in outcome.samples.items()}
        ours, theirs = (m.summary(values[l.name]) if values[l.name] else None for l in LAUNCHERS)
        ratio = ours / theirs if m.ratio and ours is not None and theirs else None
        met = None
        if m.goal and ours is not None and theirs is not None:
            met = bool(m.goal.met(ours, theirs, ratio))
        rows.append(Row(title, m.label, ours, theirs, ratio, m.goal.text if m.goal else "", met, values))
    return rows


def fmt(value: Any, digits: int = 3) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.{digits}g}" if abs(value) >= 1e-3 or value == 0 else f"{value:.1e}"
    return str(value)


def table(rows: list, errors: list) -> str:
    header = ("workload", "metric", "ours", "torchrun", "ratio", "goal", "met?")
    lines, last = [], None
    for r in rows:
        ours, theirs = (f"error [{r.errors[l.name]}]" if l.name in r.errors else fmt(getattr(r, l.name))
                        for l in LAUNCHERS)
        met = {True: "yes", False: "NO", None: "-"}[r.met]
        lines.append((r.workload if r.workload != last else "", r.metric, ours, theirs, fmt(r.ratio), r.goal, met))
        last = r.workload
    widths = [max(len(c) for c in col) for col in zip(header, *lines)]
    out = ["  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip() for row in [header, *lines]]
    out.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(out + [f"  [{i}] {e}" for i, e in enumerate(errors, 1)])


def machine() -> str:
    model = "unknown CPU"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    cpus = len(os.sched_getaffinity(0))
    mem = psutil.virtual_memory().total / 2**30
    return f"{model}, {cpus} CPUs (nproc), {mem:.0f} GiB RAM, Linux {platform.release()}"


def versions() -> str:
    try:
        torch_version = importlib.metadata.version("torch")
    except importlib.metadata.PackageNotFoundError:
        torch_version = "not installed"
    return f"Python {platform.python_version()}, torch {torch_version}"


# ---------------------------------------------------------------- plot


def plot(rows: list, path: str, subtitle: str) -> None:
    """Bar chart of the ratios ours/torchrun (log scale) against the ratio goals."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    shown = [r for r in rows if r.ratio is not None]
    floor = 1e-3  # a ratio of 0 (ours used no CPU at all) still gets a visible bar on a log scale
    fig, ax = plt.subplots(figsize=(10, 0.45 * len(shown) + 1.8))
    ys = list(range(len(shown)))
    colors = [{True: "tab:green", False: "tab:red", None: "tab:gray"}[r.met] for r in shown]
    ax.barh(ys, [max(r.ratio, floor) for r in shown], color=colors)
    for y, r in zip(ys, shown):
        ax.text(max(r.ratio, floor) * 1.05, y, fmt(r.ratio), va="center", fontsize=7)
        limit = goal_limit(r.goal)
        if limit is not None:
            ax.plot([limit, limit], [y - 0.4, y + 0.4], color="black", linewidth=2)
    ax.axvline(1.0, color="gray", linestyle=":", linewidth=1)
    ax.set_yticks(ys, [f"{r.workload.split(':')[0]} {r.metric}" for r in shown], fontsize=8)
    ax.invert_yaxis()
    ax.set_xscale("log")
    ax.set_xlabel("ours / torchrun (black mark: goal; green: met, red: missed, gray: no goal)")
    ax.set_title("launcher vs torchrun\n" + subtitle.replace("; ", "\n"), fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def goal_limit(goal: str) -> Optional[float]:
    if goal == "<= torchrun":
        return 1.0
    for sign in ("<= ", ">= "):
        if goal.startswith(sign):
            return float(goal[len(sign):])
    return None


def require_matplotlib() -> None:
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        sys.exit("--plot needs matplotlib, which is not installed: pip install 'launcher[bench]' "
                 "(or pip install matplotlib)")


# ---------------------------------------------------------------- main


def progress(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def remove_tree(path: Path) -> None:
    subprocess.run(["rm", "-rf", str(path)], check=False, timeout=120)


def parse_args(argv: Optional[list] = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    mode = p.add_mutually_exclusive_group()
    mode.add_argument("--quick", action="store_const", dest="mode", const="quick",
                      help="fewer repetitions and smaller sizes: under a minute on 2 cores")
    mode.add_argument("--tiny", action="store_const", dest="mode", const="tiny",
                      help="the smallest sizes, one run each: keeps the harness from rotting")
    p.add_argument("--only", metavar="NAMES", help="comma-separated workloads to run: " + ",".join(w.name for w in WORKLOADS))
    p.add_argument("--json", metavar="FILE", help="also write the rows and raw samples as JSON")
    p.add_argument("--plot", metavar="FILE.png", help="draw the ratios against the goals (needs matplotlib)")
    args = p.parse_args(argv)
    args.mode = args.mode or "full"
    names = {w.name for w in WORKLOADS}
    args.only = args.only.split(",") if args.only else sorted(names)
    unknown = set(args.only) - names
    if unknown:
        p.error(f"unknown workload(s) {','.join(sorted(unknown))}; choose among {','.join(w.name for w in WORKLOADS)}")
    return args


def main(argv: Optional[list] = None) -> int:
    args = parse_args(argv)
    if args.plot:
        require_matplotlib()
    sizes = MODES[args.mode]
    load = os.getloadavg()[0]  # others' work on the machine skews every figure: say how busy it was
    started = time.monotonic()
    rows, errors, notes = [], [], []
    with tempfile.TemporaryDirectory(prefix="launcher-bench-") as root:
        for w in WORKLOADS:
            if w.name not in args.only:
                continue
            progress(f"{w.title(sizes)} ...")
            outcome = measure(w, sizes, Path(root))
            new_rows = rows_of(w, outcome, w.title(sizes))
            for name, error in outcome.errors.items():
                errors.append(f"{name}, {w.name}: {error}")
                for r in new_rows:
                    r.errors[name] = len(errors)
            rows += new_rows
            notes += [f"{w.name}: {n}" for n in dict.fromkeys(outcome.notes)]
    wall = time.monotonic() - started
    subtitle = f"{args.mode} mode on {machine()}; {versions()}; load average {load:.2f} at start"
    print(f"launcher vs torchrun ({subtitle})\n")
    print(table(rows, errors))
    for n in notes:
        print(f"  note: {n}")
    print(f"\nwall time {wall:.0f} s: python bench/run.py" + ("" if args.mode == "full" else f" --{args.mode}"))
    if args.json:
        Path(args.json).write_text(json.dumps({
            "mode": args.mode, "machine": machine(), "wall_s": wall, "errors": errors, "notes": notes,
            "rows": [asdict(r) for r in rows]}, indent=1, default=str))
    if args.plot:
        plot(rows, args.plot, subtitle)
        print(f"plot: {args.plot}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
