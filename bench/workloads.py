"""The eleven workloads: what each one runs, what it measures, and the goal for each figure.

A workload is a ``Workload``: a name, a title, a function that does one run with one launcher
(``Ctx`` -> a result dataclass) and the ``Metric``s read from that result. The worker scripts
are the small files next to this one. Sizes depend on the mode (``MODES``).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import sys
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

import spew  # the log-volume worker: its line format is the check's reference
from harness import (BENCH, BenchError, Ctx, Job, TreeSampler, gone_at, gone_by, ours_has_option, read_stamp,
                     wait_for_files)
from report import Goal, Metric, at_most_torchrun, ours_at_most, ours_equal, ratio_at_least, ratio_at_most, same_codes

MiB = 1024 * 1024


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
    cross_nproc: int  # workers per node, cross-node teardown
    cross_bound_s: float  # how long node 0 may take to stop before its figure is this bound
    ps_rows: int  # of the CTR model's embedding table (x 16)
    ps_steps: int
    ps_reps: int
    ddp_once: bool = False  # torchrun's DDP run of 8a is 8b's too (tiny: the harness is run, its figures not read)


MODES = {
    "full": Sizes(reps=3, help_reps=10, idle_s=10, log_mb=200, scale_workers=64,
                  plan_nodes=1000, plan_repeats=20, train_steps=150, train_reps=3,
                  cross_nproc=2, cross_bound_s=120, ps_rows=10_000_000, ps_steps=20, ps_reps=3),
    "quick": Sizes(reps=1, help_reps=3, idle_s=3, log_mb=20, scale_workers=64,
                   plan_nodes=1000, plan_repeats=5, train_steps=50, train_reps=1,
                   cross_nproc=2, cross_bound_s=20, ps_rows=1_000_000, ps_steps=10, ps_reps=1),
    "tiny": Sizes(reps=1, help_reps=1, idle_s=0.5, log_mb=0.5, scale_workers=4,
                  plan_nodes=10, plan_repeats=1, train_steps=2, train_reps=1,
                  cross_nproc=1, cross_bound_s=5, ps_rows=10_000, ps_steps=2, ps_reps=1, ddp_once=True),
}


# ---------------------------------------------------------------- 1. start-up


@dataclass
class Startup:
    seconds: float


def startup(ctx: Ctx, sizes: Sizes) -> Startup:
    """``--help``: wall time until exit."""
    with ctx.launch_help() as run:
        run.expect_success(60)
        return Startup(run.seconds())


# ---------------------------------------------------------------- 2. a 2-worker job


@dataclass
class JobTime:
    seconds: float


def job(ctx: Ctx, sizes: Sizes) -> JobTime:
    """Two workers: gloo init and one all-reduce, end to end."""
    with ctx.launch(Job(2, "allreduce.py")) as run:
        run.expect_success(180)
        return JobTime(run.seconds())


# ---------------------------------------------------------------- 3. teardown


@dataclass
class Teardown:
    seconds: float  # from the failing worker's exit to the launcher's exit
    exit_code: int


def teardown(ctx: Ctx, sizes: Sizes) -> Teardown:
    """One of 3 workers exits 7 while the others sleep."""
    ready, stamp = ctx.tmp / "ready", ctx.tmp / "stamp"
    ready.mkdir()
    with ctx.launch(Job(3, "fail.py", (ready, stamp))) as run:
        code = run.wait(120)
        if not stamp.exists():
            raise BenchError(f"the failing worker never exited (launcher exit code {code}){run.stderr_tail()}")
        return Teardown(run.exit_time - float(stamp.read_text()), code)


# ---------------------------------------------------------------- 4. idle


@dataclass
class Idle:
    cpu_s: float  # during the idle window
    rss_mib: float  # largest seen during the idle window: the launcher's and every helper's, summed


def idle(ctx: Ctx, sizes: Sizes) -> Idle:
    """Two sleeping workers: CPU time and resident memory over ``idle_s`` seconds of the launcher and
    of every process it added (TreeSampler: ours' watchdog, spares, any helper; torchrun's, if any)."""
    ready = ctx.tmp / "ready"
    ready.mkdir()
    with ctx.launch(Job(2, "sleeper.py", (sizes.idle_s + 120, ready))) as run:
        wait_for_files(ready, 2, 120, run)
        with TreeSampler(run.proc.pid, interval=0.5) as sampler:
            cpu0, _ = sampler.snapshot()
            time.sleep(sizes.idle_s)
            cpu1, _ = sampler.snapshot()
        if run.exited:
            raise BenchError(f"the launcher exited early ({run.wait(1)}){run.stderr_tail()}")
        return Idle(cpu1 - cpu0, sampler.max_rss / MiB)


# ---------------------------------------------------------------- 5. log volume


@dataclass
class LogVolume:
    seconds: float
    cpu_s: float  # the launcher's and its helpers', whole run
    bad_lines: int  # lines lost, cut or garbled, over both log files and the console
    floor_s: float  # the same two writers run straight, each to a file, no launcher (before and after: the mean)
    vs_floor: float  # seconds / floor_s


def logs(ctx: Ctx, sizes: Sizes) -> LogVolume:
    """Two workers writing ``log_mb`` MB each; logs to files, worker 0 also on the console; and, just
    before and just after, the same two writers with no launcher, each straight to a file: the
    floor is the mean of the two (whatever runs first on a busy machine is not favoured)."""
    writers = Job(2, "spew.py", (sizes.log_mb,))
    before = ctx.direct(writers)
    log_dir = ctx.tmp / "logs"
    with ctx.launch(Job(2, "spew.py", (sizes.log_mb,), log_dir)) as run, TreeSampler(run.proc.pid) as sampler:
        code = run.wait(600)
        cpu = run.self_cpu() + sampler.helpers_cpu()
        if code != 0:
            raise BenchError(f"exit code {code}{run.stderr_tail()}")
    expected = [expected_lines(rank, spew.line_count(sizes.log_mb)) for rank in (0, 1)]
    bad = sum(bad_lines(ctx.launcher.log_file(log_dir, r).read_bytes(), r, expected[r]) for r in (0, 1))
    bad += bad_lines(run.stdout_path.read_bytes(), 0, expected[0])
    shutil.rmtree(log_dir)  # not written back to disk during the second floor
    run.stdout_path.unlink()
    floor = (before + ctx.direct(writers)) / 2
    return LogVolume(run.seconds(), cpu, bad, floor, run.seconds() / floor)


def expected_lines(rank: int, n: int) -> list[bytes]:
    """The ``n`` lines worker ``rank`` writes, without their newline."""
    return [spew.line(rank, i)[:-1] for i in range(n)]


def bad_lines(data: bytes, rank: int, expected: list[bytes]) -> int:
    """How many of the ``expected`` lines of worker ``rank`` are missing from ``data`` or not whole.

    Other lines (headers, the launcher's messages) are ignored; a line may carry a prefix.
    """
    marker = f"bench r{rank} n".encode()
    found = [line[line.find(marker):] for line in data.split(b"\n") if marker in line]
    if found == expected:
        return 0
    good = set(expected).intersection(found)
    return (len(expected) - len(good)) + sum(1 for line in found if line not in good)


# ---------------------------------------------------------------- 6. scale


@dataclass
class Scale:
    running_s: float  # from the launcher's start until every worker runs
    stopped_s: float  # from SIGTERM to the launcher until the launcher and every worker are gone
    exit_code: int


def scale(ctx: Ctx, sizes: Sizes) -> Scale:
    """``scale_workers`` sleeping CPU workers: up, then SIGTERM to the launcher."""
    n, ready = sizes.scale_workers, ctx.tmp / "ready"
    ready.mkdir()
    with ctx.launch(Job(n, "sleeper.py", (600, ready))) as run:
        all_running = wait_for_files(ready, n, 180, run)
        pids = [int(f.read_text()) for f in ready.glob("*.ready")]
        sigterm = time.time()
        os.kill(run.proc.pid, signal.SIGTERM)
        code = run.wait(120)
        stopped = gone_at(pids, run.exit_time, 60)
        return Scale(all_running - run.start_time, stopped - sigterm, code)


# ---------------------------------------------------------------- 7. planning


@dataclass
class Planning:
    ms: float  # one plan for node 0
    env_kib: float  # variables the launcher adds for one worker


def planning(ctx: Ctx, sizes: Sizes) -> Planning:
    """The plan for ``plan_nodes`` nodes x 8 GPUs, computed in one process, nothing started."""
    argv = [sys.executable, str(BENCH / "plan_time.py"), ctx.launcher.name,
            str(sizes.plan_nodes), "8", str(sizes.plan_repeats)]
    with ctx.start(argv) as run:
        run.expect_success(120)
        result = json.loads(run.stdout_path.read_text().strip().splitlines()[-1])
    return Planning(result["seconds"] * 1000, result["env_bytes"] / 1024)


# ---------------------------------------------------------------- 8. training


@dataclass
class Training:
    steps_per_s: float  # rank 0's
    cpu_ms: float  # rank 0's CPU time per step, all threads: less sensitive to other load


_ddp_runs: dict = {}  # train_steps -> torchrun's DDP result, where Sizes.ddp_once


def training(api: str) -> Callable[[Ctx, Sizes], Training]:
    """The tutorial's MLP on 2 CPU workers: ours through fleet's ``api``, torchrun through DDP."""
    def measure(ctx: Ctx, sizes: Sizes) -> Training:
        if ctx.launcher.name == "ours":
            return train(ctx, sizes, api)
        if not sizes.ddp_once:
            return train(ctx, sizes, "ddp")
        if sizes.train_steps not in _ddp_runs:
            _ddp_runs[sizes.train_steps] = train(ctx, sizes, "ddp")
        return _ddp_runs[sizes.train_steps]
    return measure


def train(ctx: Ctx, sizes: Sizes, api: str) -> Training:
    """Rank 0's steps per second and CPU ms per step in one training run through ``api``."""
    out = ctx.tmp / api
    out.mkdir()
    with ctx.launch(Job(2, "train.py", (api, sizes.train_steps, out))) as run:
        run.expect_success(300)
    results = [json.loads((out / f"train.{r}.json").read_text()) for r in (0, 1)]
    a, b = (r["checksum"] for r in results)
    if abs(a - b) > 1e-6 * max(1.0, abs(a)):
        raise BenchError(f"{api}: the ranks' parameters differ after training ({a} != {b}): gradients not synchronised")
    return Training(results[0]["steps_per_s"], results[0]["cpu_ms_per_step"])


# ---------------------------------------------------------------- 9. cross-node teardown


RUNNING = "running"  # the exit code of a launcher that had not exited by the bound


@dataclass
class CrossNode:
    seconds: float  # from the failing worker's exit on node 1 until node 0's launcher and workers are gone
    code_0: Any  # node 0's launcher exit code, or RUNNING
    code_1: int  # node 1's (the failing worker's node)
    remarks: dict = field(default_factory=dict)  # metric field -> a footnote of the table
    at_bound: bool = False  # node 0 never stopped by itself: ``seconds`` is the bound


def cross_node(ctx: Ctx, sizes: Sizes) -> CrossNode:
    """Two nodes on loopback, ``cross_nproc`` sleeping workers each; the first worker of node 1
    exits 7 once all run. How long until node 0 (launcher and workers) is gone, and the exit codes."""
    n, bound = sizes.cross_nproc, sizes.cross_bound_s
    ready, stamp = ctx.tmp / "ready", ctx.tmp / "stamp"
    ready.mkdir()
    with ctx.launch_nodes(Job(n, "fail.py", (ready, stamp, n)), 2) as (node0, node1):
        failed = read_stamp(stamp, 180, node0, node1)  # written just before the exit
        workers0 = [int((ready / f"{rank}.ready").read_text()) for rank in range(n)]
        deadline = failed + bound
        workers_gone = gone_by(workers0, deadline)
        if workers_gone is not None and node0.exited_by(deadline):
            code_1 = node1.wait(max(30.0, bound))
            return CrossNode(max(workers_gone, node0.exit_time) - failed, node0.exit_code, code_1)
        code_1 = node1.wait(30)
        left = {(True, True): "its launcher and workers", (True, False): "its launcher",
                (False, True): "its workers"}[(not node0.exited, workers_gone is None)]
        remark = (f"node 0 ({left}) still ran {bound:g} s after the failing worker's exit on node 1; "
                  f"the figure is that bound, node 0 was then killed by the harness; not repeated")
        return CrossNode(bound, RUNNING, code_1, {"seconds": remark, "code_0": remark}, at_bound=True)


# ---------------------------------------------------------------- 10. restart round trip


@dataclass
class RestartTrip:
    seconds: float  # from the failing worker's exit until every worker of attempt 2 runs
    started_s: float  # from that exit until every worker process of attempt 2 was created
    exit_code: int  # the launcher's, once attempt 2 has finished


def restart(ctx: Ctx, sizes: Sizes) -> RestartTrip:
    """One node, 2 workers, one restart allowed: rank 1 fails once; the job runs again."""
    ready, stamp, marker = ctx.tmp / "ready", ctx.tmp / "stamp", ctx.tmp / "failed-once"
    ready.mkdir()
    with ctx.launch(Job(2, "restart.py", (ready, stamp, marker), max_restarts=1)) as run:
        code = run.wait(180)
    if not stamp.exists():
        raise BenchError(f"the failing worker never exited (launcher exit code {code}){run.stderr_tail()}")
    second = sorted(ready.glob("1.*.ready"))
    if len(second) != 2:
        raise BenchError(f"{len(second)} of 2 workers of attempt 2 became ready (TORCHELASTIC_RESTART_COUNT=1 "
                         f"expected; launcher exit code {code}){run.stderr_tail()}")
    failed = float(stamp.read_text())
    times = [f.read_text().split() for f in second]  # pid, ready, created
    return RestartTrip(max(float(t[1]) for t in times) - failed, max(float(t[2]) for t in times) - failed, code)


# ---------------------------------------------------------------- 11. parameter server


@dataclass
class PSTraining:
    steps_per_s: float  # trainer 0's
    peak_rss_mib: float  # the larger of the two trainers' peak resident memory (VmHWM), whole run
    timed_peak_rss_mib: float  # the same, over the timed steps only
    cpu_ms: float  # trainer 0's CPU time per step
    loss: float  # trainer 0's, at the last step: the same batches and weights give the same


# ours' parameter-server runs by (kind, rows, steps), in order: a workload whose PS side is another's
# (11c is 11a's PS run against another DDP) takes those instead of running the same job again
_ps_runs: dict = {}
_ps_reused: dict = {}


def ps_training(kind: str, ddp: str = "ddp", reuse: bool = False) -> Callable[[Ctx, Sizes], PSTraining]:
    """The model of ``ctr.py`` (``kind``: sparse or dense), 2 trainers: ours as 2 trainers and
    2 servers in sync mode, torchrun as 2 workers through ``ddp`` (ddp or ddp-sparse), on the same batches.
    ``reuse``: ours' side is the runs an earlier workload made of the same PS job, when there are some."""
    def measure(ctx: Ctx, sizes: Sizes) -> PSTraining:
        key = (kind, sizes.ps_rows, sizes.ps_steps)
        if ctx.launcher.name != "ours" or not reuse:
            result = ps_train(ctx, sizes, kind, ddp)
            if ctx.launcher.name == "ours":
                _ps_runs.setdefault(key, []).append(result)
            return result
        taken = _ps_reused.get(key, 0)
        earlier = _ps_runs.get(key, [])
        if taken < len(earlier):
            _ps_reused[key] = taken + 1
            return earlier[taken]
        return ps_train(ctx, sizes, kind, ddp)
    return measure


def ps_train(ctx: Ctx, sizes: Sizes, kind: str, ddp: str) -> PSTraining:
    ours = ctx.launcher.name == "ours"
    if ours and not ours_has_option("--server_num"):
        raise BenchError("python -m launcher has no --server_num (parameter-server mode): not measured")
    out = ctx.tmp / "out"
    out.mkdir()
    args = ("ps" if ours else ddp, kind, sizes.ps_rows, sizes.ps_steps, out)
    with ctx.launch(Job(2, "ctr.py", args, servers=2 if ours else 0)) as run:
        run.expect_success(600)
    results = [json.loads((out / f"ctr.{r}.json").read_text()) for r in (0, 1)]
    a, b = (r["checksum"] for r in results)
    if abs(a - b) > 1e-6 * max(1.0, abs(a)):
        raise BenchError(f"{args[0]}: the trainers' dense parameters differ after training ({a} != {b})")
    first = results[0]
    return PSTraining(first["steps_per_s"], max(r["peak_rss_mib"] for r in results),
                      max(r["timed_peak_rss_mib"] for r in results), first["cpu_ms_per_step"], first["loss"])


def ps_metrics(steps_goal: Optional[Goal] = None, memory_goal: Optional[Goal] = None) -> tuple[Metric, ...]:
    return (
        Metric("steps_per_s", "trainer steps/s", steps_goal),
        Metric("peak_rss_mib", "trainer peak resident memory (MiB)", memory_goal),
        Metric("timed_peak_rss_mib", "the same, timed steps only (MiB)"),
        Metric("cpu_ms", "trainer CPU per step (ms)"),
        Metric("loss", "loss at the last step"),
    )


# ---------------------------------------------------------------- the table's rows


@dataclass(frozen=True)
class Workload:
    name: str  # for --only
    title: Callable[[Sizes], str]
    run: Callable[[Ctx, Sizes], Any]
    metrics: tuple[Metric, ...]
    reps: Callable[[Sizes], int] = lambda s: s.reps


WORKLOADS = (
    Workload("startup", lambda s: "1. start-up: --help", startup, (
        Metric("seconds", "wall time (s)", ratio_at_most(0.1)),
    ), reps=lambda s: s.help_reps),
    Workload("job", lambda s: "2. 2-worker job: gloo + all-reduce", job, (
        Metric("seconds", "wall time (s)", ratio_at_most(0.65)),
    )),
    Workload("teardown", lambda s: "3. teardown: 1 of 3 workers exits 7", teardown, (
        Metric("seconds", "worker exit -> launcher exit (s)", ratio_at_most(0.15)),
        Metric("exit_code", "launcher exit code", ours_equal(7), summary=same_codes, ratio=False),
    )),
    Workload("idle", lambda s: f"4. idle: 2 sleeping workers, {s.idle_s:g} s", idle, (
        Metric("cpu_s", "launcher + helpers CPU, idle window (s)", at_most_torchrun()),
        Metric("rss_mib", "launcher + helpers resident memory (MiB)", ratio_at_most(0.25)),
    )),
    Workload("logs", lambda s: f"5. log volume: 2 workers x {s.log_mb:g} MB", logs, (
        Metric("seconds", "wall time (s)", ratio_at_most(0.5)),
        Metric("vs_floor", "wall time / direct-write floor", ours_at_most(1.1), ratio=False),
        Metric("cpu_s", "launcher CPU (s)"),
        Metric("bad_lines", "lines lost or cut", ours_equal(0), summary=max, ratio=False),
    )),
    Workload("scale", lambda s: f"6. scale: {s.scale_workers} sleeping CPU workers", scale, (
        Metric("running_s", "start -> all running (s)"),
        Metric("stopped_s", "SIGTERM -> all stopped (s)"),
        Metric("exit_code", "launcher exit code after SIGTERM", summary=same_codes, ratio=False),
    )),
    Workload("planning", lambda s: f"7. planning: {s.plan_nodes} nodes x 8 GPUs", planning, (
        Metric("ms", "plan of node 0 (ms)"),
        Metric("env_kib", "env added per worker (KiB)"),
    )),
    Workload("train-optimizer", lambda s: f"8a. training, {s.train_steps} steps: distributed_optimizer vs DDP",
             training("optimizer"), (
        Metric("steps_per_s", "steps/s", ratio_at_least(1.0)),
        Metric("cpu_ms", "worker CPU per step (ms)"),
    ), reps=lambda s: s.train_reps),
    Workload("train-model", lambda s: f"8b. training, {s.train_steps} steps: distributed_model vs DDP",
             training("model"), (
        Metric("steps_per_s", "steps/s", ratio_at_least(1.0)),
        Metric("cpu_ms", "worker CPU per step (ms)"),
    ), reps=lambda s: s.train_reps),
    Workload("cross-node", lambda s: f"9. cross-node teardown: 2 nodes x {s.cross_nproc}, rank {s.cross_nproc} exits 7",
             cross_node, (
        Metric("seconds", "worker exit on node 1 -> node 0 gone (s)", ratio_at_most(0.1)),
        Metric("code_0", "node 0 launcher exit code", ours_equal(7), summary=same_codes, ratio=False),
        Metric("code_1", "node 1 launcher exit code", ours_equal(7), summary=same_codes, ratio=False),
    )),
    Workload("restart", lambda s: "10. restart round trip: 2 workers, 1 restart", restart, (
        Metric("seconds", "failure -> attempt 2 all running (s)", ratio_at_most(0.5)),
        Metric("started_s", "failure -> attempt 2 all created (s)"),
        Metric("exit_code", "launcher exit code after attempt 2", ours_equal(0), summary=same_codes, ratio=False),
    )),
    Workload("ps-sparse", lambda s: f"11a. CTR, {s.ps_rows:,} x 16 sparse table, {s.ps_steps} steps: PS sync vs DDP",
             ps_training("sparse"), ps_metrics(ratio_at_least(3.0), ratio_at_most(0.5)), reps=lambda s: s.ps_reps),
    Workload("ps-dense", lambda s: f"11b. dense MLP, {s.ps_steps} steps: PS sync vs DDP",
             ps_training("dense"), ps_metrics(), reps=lambda s: s.ps_reps),
    Workload("ps-ddp-sparse", lambda s: "11c. CTR as 11a: PS sync vs DDP with sparse=True (gloo)",
             ps_training("sparse", "ddp-sparse", reuse=True), ps_metrics(), reps=lambda s: s.ps_reps),
)
