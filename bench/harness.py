"""How a launcher under test is run and measured, from the outside.

A workload gets a ``Ctx``: the launcher under test (``Ours`` or ``Torchrun``, same interface),
an empty folder of its own and the ports reserved for this run. ``ctx.launch(job)`` starts the
launcher in its own session, output to files, and sees its exit as it happens (``waitid``,
leaving the zombie so that its CPU time can still be read); ``ctx.launch_nodes(job, n)`` starts
one launcher per "node" of a job of ``n`` nodes on loopback (127.0.0.1, 127.0.0.2, ...). When the
run ends, everything it started is killed, and any process that outlived a launcher which had
exited is counted. ``measure`` runs one workload with each launcher in turn and collects the
results; a result with ``at_bound`` set (the side never got there within the workload's bound)
is not repeated, since every run would give the same bound.

This module is the only one that starts, signals or inspects processes.
"""

from __future__ import annotations

import functools
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, ContextManager, Iterator, Optional, Protocol

import psutil

BENCH = Path(__file__).resolve().parent
REPO = BENCH.parent
TAG_VAR = "LAUNCHER_BENCH_TAG"  # marks every process of one run, to find what outlived it
STRIPPED_VARS = ("OMP_NUM_THREADS", "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE",
                 "GROUP_RANK", "MASTER_ADDR", "MASTER_PORT")
STRIPPED_PREFIXES = ("PADDLE_", "TORCHELASTIC_", "LAUNCHER_")


class BenchError(Exception):
    """One run could not be measured; the message says why, in one line."""


# ---------------------------------------------------------------- ports


class PortReservations:
    """Ports picked for one run, each held by a socket until the run ends.

    A reservation socket is bound to the port on every address, then given SO_REUSEADDR, and
    never listens. The kernel picks the port among those nothing else holds; from then on its
    ephemeral-port choice and any bind without SO_REUSEADDR avoid it, while a server that sets
    SO_REUSEADDR itself (torch's TCPStore does) can still bind and listen on it. So the port
    cannot be taken between the moment it is picked and the moment the launcher uses it.
    """

    def __init__(self) -> None:
        self._sockets: list[socket.socket] = []

    def reserve(self) -> int:
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.bind(("", 0))
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._sockets.append(sock)
        return sock.getsockname()[1]

    def reserve_block(self, count: int, tries: int = 100) -> int:
        """``count`` consecutive ports, each held as ``reserve`` holds one; the first of them.

        The kernel picks the first; the next ones are bound by number, without SO_REUSEADDR, so
        that a port anything else holds (or a connection in TIME_WAIT uses) makes this try fail
        and the next try pick another block.
        """
        for _ in range(tries):
            held: list[socket.socket] = []
            try:
                for i in range(count):
                    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
                    held.append(sock)
                    sock.bind(("", held[0].getsockname()[1] + i if i else 0))
            except (OSError, OverflowError):
                for sock in held:
                    sock.close()
                continue
            for sock in held:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            self._sockets += held
            return held[0].getsockname()[1]
        raise BenchError(f"found no {count} consecutive free ports in {tries} tries")

    def close(self) -> None:
        for sock in self._sockets:
            sock.close()
        self._sockets.clear()

    def __enter__(self) -> PortReservations:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


# ---------------------------------------------------------------- launchers under test


@dataclass(frozen=True)
class Job:
    """``nproc`` workers of ``bench/<script> args`` on each node; with ``servers``, a
    parameter-server job instead: ``nproc`` trainers and that many servers, all running the script."""

    nproc: int
    script: str
    args: tuple = ()
    log_dir: Optional[Path] = None  # logs to files there, worker 0 also on the console
    max_restarts: int = 0  # restarts of the whole job after a failure
    servers: int = 0  # parameter servers (ours only)

    def worker(self) -> list[str]:
        return [str(BENCH / self.script), *map(str, self.args)]


def node_ips(nodes: int) -> list[str]:
    """The "nodes" of a job on this one machine: 127.0.0.1, 127.0.0.2, ..."""
    return [f"127.0.0.{i + 1}" for i in range(nodes)]


class LauncherUnderTest(Protocol):
    name: str  # "ours" or "torchrun": the column of the table

    def help_command(self) -> list[str]: ...

    def job_command(self, job: Job, ports: PortReservations) -> list[str]: ...

    def node_commands(self, job: Job, nodes: int, ports: PortReservations) -> list[list[str]]:
        """One command per node (node rank order) of a job of ``nodes`` nodes on loopback."""
        ...

    def log_file(self, log_dir: Path, rank: int) -> Path:
        """Where the launcher put the stdout of worker ``rank``."""
        ...


class Ours:
    """``python -m launcher``, as a user runs it on one node: it picks its own free ports."""

    name = "ours"

    def help_command(self) -> list[str]:
        return [sys.executable, "-m", "launcher", "--help"]

    def job_command(self, job: Job, ports: PortReservations) -> list[str]:
        return [sys.executable, "-m", "launcher", *self._options(job), *job.worker()]

    def node_commands(self, job: Job, nodes: int, ports: PortReservations) -> list[list[str]]:
        """``--cluster_node_ips 127.0.0.1,127.0.0.2 --node_ip ... --started_port P``; node 0's
        control port is P - 1 (the default), reserved with the worker ports P ... P + nproc - 1."""
        started = ports.reserve_block(job.nproc + 1) + 1
        ips = node_ips(nodes)
        return [[sys.executable, "-m", "launcher", "--cluster_node_ips", ",".join(ips), "--node_ip", ip,
                 "--started_port", str(started), *self._options(job), *job.worker()] for ip in ips]

    @staticmethod
    def _options(job: Job) -> list[str]:
        logs = ["--log_dir", str(job.log_dir)] if job.log_dir else []
        restarts = ["--max_restarts", str(job.max_restarts)] if job.max_restarts else []
        workers = (["--server_num", str(job.servers), "--worker_num", str(job.nproc)] if job.servers
                   else ["--nproc_per_node", str(job.nproc)])
        return [*workers, *restarts, *logs]

    def log_file(self, log_dir: Path, rank: int) -> Path:
        return log_dir / f"workerlog.{rank}"


class Torchrun:
    """``python -m torch.distributed.run`` with a reserved ``--master-port`` (static rendezvous)."""

    name = "torchrun"

    def help_command(self) -> list[str]:
        return [sys.executable, "-m", "torch.distributed.run", "--help"]

    def job_command(self, job: Job, ports: PortReservations) -> list[str]:
        return [sys.executable, "-m", "torch.distributed.run", "--master-port", str(ports.reserve()),
                *self._options(job), *job.worker()]

    def node_commands(self, job: Job, nodes: int, ports: PortReservations) -> list[list[str]]:
        """Static rendezvous: ``--nnodes N --node-rank R --master-addr 127.0.0.1 --master-port P``,
        node rank 0 hosting the store on the reserved port P (c10d rendezvous would rank the
        nodes by arrival, not by ``--node-rank``)."""
        port = str(ports.reserve())
        return [[sys.executable, "-m", "torch.distributed.run", "--nnodes", str(nodes), "--node-rank", str(rank),
                 "--master-addr", node_ips(nodes)[0], "--master-port", port, *self._options(job), *job.worker()]
                for rank in range(nodes)]

    @staticmethod
    def _options(job: Job) -> list[str]:
        if job.servers:
            raise BenchError("torchrun has no parameter servers")
        logs = ["--log-dir", str(job.log_dir), "--redirects", "3", "--tee", "3",
                "--local-ranks-filter", "0"] if job.log_dir else []
        restarts = ["--max-restarts", str(job.max_restarts)] if job.max_restarts else []
        return ["--nproc-per-node", str(job.nproc), *restarts, *logs]

    def log_file(self, log_dir: Path, rank: int) -> Path:
        found = sorted(log_dir.glob(f"**/attempt_*/{rank}/stdout.log"))
        if not found:
            raise BenchError(f"torchrun wrote no log file for rank {rank} under {log_dir}")
        return found[-1]


LAUNCHERS: tuple[LauncherUnderTest, ...] = (Ours(), Torchrun())


@functools.cache
def ours_has_option(option: str) -> bool:
    """Whether ``python -m launcher --help`` lists ``option`` (parts of it may not be merged yet)."""
    done = subprocess.run([sys.executable, "-m", "launcher", "--help"], cwd=REPO, env=bench_env(),
                          stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=60)
    return option in done.stdout


def bench_env() -> dict[str, str]:
    """The environment every launcher starts in: ours importable, no leftovers of an outer launch."""
    env = {k: v for k, v in os.environ.items()
           if k not in STRIPPED_VARS and not k.startswith(STRIPPED_PREFIXES)}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    return env


# ---------------------------------------------------------------- one launcher process


class Run:
    """One launcher process, in its own session, output to files, its exit seen as it happens."""

    def __init__(self, argv: list[str], folder: Path, name: str = "launcher",
                 env: Optional[dict[str, str]] = None, cwd: Path = REPO):
        """``env``: the environment to start in (default ``bench_env()``), the run's tag added."""
        self.argv = argv
        self.tag = uuid.uuid4().hex
        self.stdout_path, self.stderr_path = folder / f"{name}.out", folder / f"{name}.err"
        env = {**(bench_env() if env is None else env), TAG_VAR: self.tag}
        with open(self.stdout_path, "wb") as out, open(self.stderr_path, "wb") as err:
            self.start_time = time.time()
            self.proc = subprocess.Popen(argv, cwd=cwd, env=env, stdin=subprocess.DEVNULL,
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
        except ChildProcessError:  # stop() killed and reaped it first
            self.exit_code = self.proc.returncode
        self.exit_time = time.time()
        self._exited.set()

    @property
    def exited(self) -> bool:
        return self._exited.is_set()

    def wait(self, timeout: float) -> int:
        """Wait for the launcher's exit; its exit code."""
        if not self._exited.wait(timeout):
            raise BenchError(f"still running after {timeout:.0f} s{self.stderr_tail()}")
        return self.exit_code

    def exited_by(self, deadline: float) -> bool:
        """Wait until the launcher exits or ``deadline`` (``time.time()``) passes; whether it exited."""
        return self._exited.wait(max(0.0, deadline - time.time()))

    def seconds(self) -> float:
        """From the start to the exit of the launcher."""
        return self.exit_time - self.start_time

    def expect_success(self, timeout: float) -> None:
        code = self.wait(timeout)
        if code != 0:
            raise BenchError(f"exit code {code}{self.stderr_tail()}")

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

    def leftovers(self) -> int:
        """Processes of this run still alive after the launcher exited (0 while it runs)."""
        if not self.exited:
            return 0
        if tagged_processes(self.tag):
            time.sleep(0.5)  # the launcher's own stop sequence may still be finishing
        return len(tagged_processes(self.tag))

    def stop(self) -> None:
        """Kill whatever is left of this run and reap the launcher."""
        kill_all([self.proc.pid, *descendants(self.proc.pid), *tagged_processes(self.tag)])
        self.proc.wait(timeout=30)


def descendants(pid: int) -> list[int]:
    try:
        return [p.pid for p in psutil.Process(pid).children(recursive=True)]
    except psutil.Error:
        return []


def tagged_processes(tag: str) -> list[int]:
    found = []
    for p in psutil.process_iter():
        try:
            if p.status() != psutil.STATUS_ZOMBIE and p.environ().get(TAG_VAR) == tag:
                found.append(p.pid)
        except psutil.Error:
            continue
    return found


def kill_all(pids: list[int]) -> None:
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


def wait_for_files(folder: Path, count: int, timeout: float, *runs: Run) -> float:
    """Wait until ``folder`` holds ``count`` *.ready files; the time it happened."""
    deadline = time.monotonic() + timeout
    while len(list(folder.glob("*.ready"))) < count:
        for run in runs:
            if run.exited:
                raise BenchError(f"a launcher exited ({run.wait(1)}) before all workers were ready{run.stderr_tail()}")
        if time.monotonic() > deadline:
            raise BenchError(f"only {len(list(folder.glob('*.ready')))} of {count} workers ready after {timeout:.0f} s")
        time.sleep(0.002)
    return time.time()


def gone_at(pids: list[int], since: float, timeout: float) -> float:
    """Wait until none of ``pids`` is alive; when that was seen (``since`` if none is alive now)."""
    seen, deadline = since, time.monotonic() + timeout
    while any(alive(pid) for pid in pids):
        if time.monotonic() > deadline:
            raise BenchError(f"{sum(map(alive, pids))} workers still alive {timeout:.0f} s after the launcher exited")
        time.sleep(0.002)
        seen = time.time()
    return seen


def gone_by(pids: list[int], deadline: float) -> Optional[float]:
    """When none of ``pids`` was seen alive any more (``time.time()``), or None if some still are
    at ``deadline``. Polls every 2 ms for the first second, then every 20 ms."""
    began = time.monotonic()
    while True:
        now = time.time()
        if not any(alive(pid) for pid in pids):
            return now
        if now > deadline:
            return None
        time.sleep(0.002 if time.monotonic() - began < 1 else 0.02)


def read_stamp(path: Path, timeout: float, *runs: Run) -> float:
    """The ``time.time()`` a worker wrote to ``path`` (waiting for it), e.g. just before exiting."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            return float(path.read_text())
        except (OSError, ValueError):  # not there yet, or being written
            pass
        if all(run.exited for run in runs):
            codes = ", ".join(str(run.wait(1)) for run in runs)
            raise BenchError(f"the launchers exited ({codes}) before {path.name} was written{runs[-1].stderr_tail()}")
        if time.monotonic() > deadline:
            raise BenchError(f"no {path.name} after {timeout:.0f} s")
        time.sleep(0.005)


class TreeSampler:
    """CPU seconds and resident memory of a launcher and every helper process it added, never of its workers.

    A worker is a process whose environment has RANK (both launchers set it for workers only;
    the harness removes it from theirs) and the lowest TORCHELASTIC_RESTART_COUNT among those: a
    process with RANK started for a later attempt (one of our spare interpreters, waiting for a
    restart) is a helper. A worker and everything below it are left out; every other process of
    the launcher's tree (our watchdog and spares, any helper of either launcher) is counted.
    snapshot() reads the tree now; while entered, a thread also samples it every ``interval``
    seconds, keeping the largest resident memory seen (the sum over the launcher and its helpers)
    and each helper's last CPU time (a helper may exit before the launcher).
    """

    def __init__(self, pid: int, interval: float = 0.2):
        self.pid, self.interval = pid, interval
        self.max_rss = 0
        self.helper_cpu: dict[int, float] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def __enter__(self) -> TreeSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def _loop(self) -> None:
        while not self._stop.wait(self.interval):
            self.snapshot()

    def snapshot(self) -> tuple[float, int]:
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

    def _launcher_side(self) -> list[psutil.Process]:
        try:
            root = psutil.Process(self.pid)
            tree = root.children(recursive=True)
        except psutil.Error:
            return []
        parent, ranked, workers = {}, {}, set()
        for p in tree:
            try:
                parent[p.pid] = p.ppid()
                env = p.environ()
                if "RANK" in env:
                    ranked[p.pid] = int(env.get("TORCHELASTIC_RESTART_COUNT") or 0)
            except (psutil.Error, ValueError):
                workers.add(p.pid)  # gone: nothing to count
        attempt = min(ranked.values(), default=0)
        workers |= {pid for pid, count in ranked.items() if count == attempt}
        return [root] + [p for p in tree if not _below(p.pid, workers, parent)]


def _below(pid: int, workers: set[int], parent: dict[int, int]) -> bool:
    while pid in parent:
        if pid in workers:
            return True
        pid = parent[pid]
    return False


# ---------------------------------------------------------------- one run of a workload


@dataclass
class Ctx:
    """What a workload gets for one run of one launcher."""

    launcher: LauncherUnderTest
    tmp: Path  # an empty folder of its own
    ports: PortReservations
    leftovers: int = 0  # processes that outlived a launcher of this run

    @contextmanager
    def start(self, argv: list[str], name: str = "launcher") -> Iterator[Run]:
        """Run ``argv``; on the way out, count what outlived it, then kill whatever is left."""
        run = Run(argv, self.tmp, name)
        try:
            yield run
        finally:
            self.leftovers += run.leftovers()
            run.stop()

    def launch(self, job: Job) -> ContextManager[Run]:
        return self.start(self.launcher.job_command(job, self.ports))

    @contextmanager
    def launch_nodes(self, job: Job, nodes: int) -> Iterator[list[Run]]:
        """One launcher per node of a job of ``nodes`` nodes on loopback, node 0 started first;
        their output in ``node<R>.out`` and ``.err``."""
        with ExitStack() as stack:
            yield [stack.enter_context(self.start(argv, f"node{rank}"))
                   for rank, argv in enumerate(self.launcher.node_commands(job, nodes, self.ports))]

    def launch_help(self) -> ContextManager[Run]:
        return self.start(self.launcher.help_command())

    def direct(self, job: Job, timeout: float = 600) -> float:
        """The job's workers run straight, no launcher: ``job.nproc`` processes of the worker script
        (RANK 0, 1, ...), each writing its stdout to a file of its own and in a session of its own, as
        both launchers start their workers (with the kernel's autogroup scheduling a session has its
        own share of the CPU); wall seconds from the first start to the last exit (the floor a
        launcher is measured against). The files are removed at once, so that the kernel does not
        write them back to disk during the launcher's run."""
        folder = Path(tempfile.mkdtemp(prefix="direct-", dir=self.tmp))
        procs = []
        began = time.perf_counter()
        try:
            for rank in range(job.nproc):
                env = {**bench_env(), "RANK": str(rank), "LOCAL_RANK": str(rank), "WORLD_SIZE": str(job.nproc)}
                with open(folder / f"stdout.{rank}", "wb") as out:
                    procs.append(subprocess.Popen([sys.executable, "-u", *job.worker()], cwd=REPO, env=env,
                                                  stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.DEVNULL,
                                                  start_new_session=True))
            codes = [p.wait(timeout) for p in procs]
        finally:
            kill_all([p.pid for p in procs if p.poll() is None])
            for p in procs:
                p.wait()
            shutil.rmtree(folder, ignore_errors=True)
        if any(codes):
            raise BenchError(f"the workers run straight exited {codes}")
        return time.perf_counter() - began


@dataclass
class Outcome:
    """Every run of one workload: results, and per launcher, why it stopped and what it left."""

    samples: dict[str, list[Any]] = field(default_factory=lambda: {l.name: [] for l in LAUNCHERS})
    errors: dict[str, str] = field(default_factory=dict)
    leftovers: dict[str, int] = field(default_factory=dict)


def measure(name: str, run_once: Callable[[Ctx], Any], reps: int, root: Path) -> Outcome:
    """Run ``run_once`` with each launcher in turn, ``reps`` times; a side that fails once stops,
    and so does a side whose result was the workload's bound (``at_bound``)."""
    outcome = Outcome()
    bounded: set[str] = set()  # sides whose last result was the workload's bound
    for rep in range(reps):
        for launcher in LAUNCHERS:
            if launcher.name not in outcome.errors and launcher.name not in bounded:
                began = time.monotonic()
                _run_once(outcome, launcher, run_once, root / f"{name}-{launcher.name}-{rep}")
                state = "failed" if launcher.name in outcome.errors else "done"
                samples = outcome.samples[launcher.name]
                if samples and getattr(samples[-1], "at_bound", False):
                    bounded.add(launcher.name)
                    state = "reached the bound, not repeated"
                progress(f"  {name}: {launcher.name} run {rep + 1} {state} ({time.monotonic() - began:.1f} s)")
    return outcome


def _run_once(outcome: Outcome, launcher: LauncherUnderTest, run_once: Callable[[Ctx], Any], folder: Path) -> None:
    folder.mkdir()
    with PortReservations() as ports:
        ctx = Ctx(launcher, folder, ports)
        try:
            outcome.samples[launcher.name].append(run_once(ctx))
        except Exception as e:  # one side failing must not end the whole benchmark
            outcome.errors[launcher.name] = str(e) if isinstance(e, BenchError) else f"{type(e).__name__}: {e}"
        finally:
            if ctx.leftovers:
                outcome.leftovers[launcher.name] = outcome.leftovers.get(launcher.name, 0) + ctx.leftovers
            shutil.rmtree(folder, ignore_errors=True)


@contextmanager
def temp_root() -> Iterator[Path]:
    """The folder that holds every run's folder, removed at the end."""
    with tempfile.TemporaryDirectory(prefix="launcher-bench-") as root:
        yield Path(root)


def progress(text: str) -> None:
    print(text, file=sys.stderr, flush=True)
