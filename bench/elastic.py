#!/usr/bin/env python3
"""Elastic jobs (``--nnodes MIN:MAX``) under our launcher and torchrun, side by side.

    python bench/elastic.py [--only startup,poweroff,silent,join,norestart,spare] [--runs N] [--json FILE]
                            [--repo PATH] [--rdzv-conf KEY=VALUE,...] [--bound S] [--keep DIR]
                            [--etcd HOST:PORT|local] [--lose other|first] [--sides ours,inprocess,torchrun,example]

Every "node" is one launcher on 127.0.0.1, each given the same line, ours (``python -m launcher``; as
"ours", its workers restarted at each membership change, and as "inprocess", the same launcher with workers that
re-enter in place through ``launcher.runtime.elastic``, given ``--inprocess``)
and torchrun's (``python -m torch.distributed.run``) alike (``--rdzv-conf`` passed on when given):

    --nnodes=2:3 --nproc-per-node=1 --rdzv-backend=c10d --rdzv-endpoint=127.0.0.1:PORT --rdzv-id=ID
    --max-restarts=3 bench/elastic_train.py OUT_DIR ...

The first launcher starts 0.5 s before the others, so that it binds the endpoint and hosts the
rendezvous (torchrun's c10d store, our node 0); the node lost is always another one, never the one
found listening on the endpoint. Every figure is read from the workers' step lines (elastic_train.py; the side
"example" runs the project's examples/elastic_inprocess.py instead, as docs/elastic.md shows it: each node with a
``--log_dir`` of its own, the steps read from the ``time=... step=... world=...`` lines of its worker logs; it is
ours with the workers kept, as "inprocess", with the example's model, optimizer and imports):

1. startup: 3 launchers; from the first one's start to the first step of any rank, and to the first
   step that all 3 ranks wrote;
2. poweroff: every process of one node SIGKILLed at once; from the kill to the next step at world
   size 2, or "lost" (the survivors ended without one: their exit codes), "hung" (no step and the
   same workers ``--bound`` seconds later, 90 by default) or "no step in 90 s" (workers restarted);
3. silent: the same with SIGSTOP (a partition); the stopped processes are SIGKILLed afterwards;
4. join: 2 launchers running, then a third: from its start to its worker's first step (world 3),
   or "never";
5. norestart: as 2 with ``--max-restarts=0``;
6. spare: ``--nnodes=1:2``, two launchers running and a third waiting for a place (ours: a standby, with
   ``--warm_start`` on the side "inprocess", so that its workers wait ready; torchrun: its agent in the rendezvous's
   redundancy list); every process of the second one SIGKILLed; from the kill to the first step that both ranks
   of world size 2 wrote, and whether the survivors' workers were new.

Each scenario runs ``--runs`` times per launcher (ours, torchrun, ours, ...): the median (min-max),
and how often each other outcome came. After a run every launcher still running gets SIGTERM (30 s
bound); every process of the run still alive then (the harness's tag in its environment) is
reported and killed. Every wait is bounded. ``--repo`` is the repository whose ``python -m launcher``
is measured (first on our launchers' PYTHONPATH only; default: the one holding this file);
``--keep`` keeps every run's folder (the launchers' output, the steps). With ``--etcd HOST:PORT`` the
membership is in that etcd: ours ``--rdzv-backend=etcd``, torchrun's ``--rdzv-backend=etcd-v2`` (etcd's v2
API: start etcd with ``--enable-v2``, and install python-etcd); ``--lose first`` loses the first node
instead (ours with etcd: the launcher that keeps the membership); ``--etcd local`` starts a one-member etcd of the
run's own on 127.0.0.1 (``etcd`` on PATH; ours only: torchrun's etcd-v2 needs etcd's v2 API).

A joiner as a new user sees it (issue 44): ``--only join --sides example --runs 5``, and the same with ``--etcd
local``; ``--sides inprocess,example`` puts the benchmark's own program beside the example, run for run.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import sys
import time
from contextlib import nullcontext
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable, Optional

sys.path.insert(0, str(Path(__file__).resolve().parent))
import harness  # noqa: E402
from elastic_job import EVENT_BOUND_S, Figure, Job, Side, first_full_step, first_step, sides, signal_node  # noqa: E402
from elastic_job import local_etcd, rendezvous_host, said, stop_all, victim  # noqa: E402

NODES_MAX = 3
RUNNING_BOUND_S = 120.0  # for the job to run (torchrun's last call alone is 30 s)
EXIT_BOUND_S = 60.0  # for a job of a step count to end by itself
JOB_SLACK_S = 120.0  # the workers' own deadline is this far past the longest a run can take
STARTUP_STEPS = 10
SIDES = ("ours", "inprocess", "torchrun", "example")
SPARE_MAX = 2  # the spare scenario's MAX: two members, and one launcher more waiting
TORCHRUN_STANDBY_S = 5.0  # for torchrun's third agent to reach its rendezvous and wait (it says nothing when it does)


# ---------------------------------------------------------------- the scenarios


def running(job: Job, nodes: int = NODES_MAX) -> Optional[Figure]:
    """Start ``nodes`` launchers and wait for a step that all their ranks wrote; a Figure if that fails."""
    job.start(nodes)
    at, why = job.wait(first_full_step(nodes), RUNNING_BOUND_S, job.nodes)
    if at is None:
        return Figure(verdict="error", detail=f"no step of all {nodes} ranks ({why}; {job.codes(job.nodes)})",
                      said=said(job.nodes))
    time.sleep(1.0)  # a few steps, a checkpoint
    return None


def startup(job: Job) -> dict:
    job.start(NODES_MAX)
    began = job.nodes[0].start_time
    figures = {}
    any_at, why = job.wait(lambda records: min((r["t"] for r in records), default=None), job.bound, job.nodes)
    figures["startup-any"] = (Figure(any_at - began) if any_at is not None else
                              Figure(verdict="never", detail=f"{why}; {job.codes(job.nodes)}", said=said(job.nodes)))
    all_at, why = job.wait(first_full_step(NODES_MAX), job.bound, job.nodes)
    figures["startup-all"] = (Figure(all_at - began) if all_at is not None else
                              Figure(verdict="never", detail=f"{why}; {job.codes(job.nodes)}", said=said(job.nodes)))
    exit_by = time.time() + EXIT_BOUND_S
    for node in job.nodes:
        node.exited_by(exit_by)  # a job of a step count: it ends by itself
    return figures


def lose_a_node(job: Job, sig: int) -> tuple:
    """Signal every process of one node that does not host the rendezvous; (when, that node, its pids)."""
    lost = victim(job)
    when = time.time()
    return when, lost, signal_node(lost, sig)


def after_loss(job: Job, when: float, lost: harness.Run, found: Optional[Callable] = None) -> Figure:
    """The figure of a loss at ``when``: until ``found`` (default: the first step at world size 2) gives a time."""
    survivors = [n for n in job.nodes if n is not lost]
    before = job.workers(survivors)
    at, why = job.wait(found or first_step(2, after=when), job.bound, survivors)
    if at is not None:
        started = len(job.workers_seen - before)
        return Figure(at - when, detail=f"lost {job.name(lost)}; "
                                        + (f"{started} new worker(s)" if started else "the survivors' processes kept"))
    detail = f"lost {job.name(lost)}; {job.codes(survivors)}"
    if why == "ended":
        return Figure(verdict="lost", detail=detail, said=said(survivors))
    started = len(job.workers_seen - before)
    if not started:  # the same workers, no step: stuck where the loss found them
        return Figure(verdict=f"hung {job.bound:.0f} s", detail=detail + ", the same workers")
    return Figure(verdict=f"no step in {job.bound:.0f} s", detail=detail + f", {started} worker start(s) meanwhile")


def poweroff(job: Job) -> dict:
    failed = running(job)
    if failed:
        return {"poweroff": failed}
    when, lost, _ = lose_a_node(job, signal.SIGKILL)
    return {"poweroff": after_loss(job, when, lost)}


def silent(job: Job) -> dict:
    failed = running(job)
    if failed:
        return {"silent": failed}
    when, lost, pids = lose_a_node(job, signal.SIGSTOP)
    figure = after_loss(job, when, lost)
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    if harness.gone_by(pids, time.time() + 10) is None or not lost.exited_by(time.time() + 10):
        figure.detail += f"; {sum(map(harness.alive, pids))} stopped processes still alive after SIGKILL"
    return {"silent": figure}


def join(job: Job) -> dict:
    failed = running(job, NODES_MAX - 1)
    if failed:
        return {"join": failed}
    (late,) = job.start(1)
    at, why = job.wait(first_step(NODES_MAX, host=late.proc.pid), job.bound, [late])
    if at is not None:
        return {"join": Figure(at - late.start_time)}
    going = first_step(NODES_MAX - 1, after=time.time() - 2)(job.refresh()) is not None
    detail = f"{why}; {job.codes([late])}; the job {'went on' if going else 'stopped'}"
    return {"join": Figure(verdict="never", detail=detail, said=said([late]))}


def spare(job: Job) -> dict:
    """``--nnodes 1:2``: two launchers running, a third waiting (ours: a standby, started warm where the workers
    re-enter in place; torchrun: its agent waits for a place); every process of the second one killed at once; from the
    kill to the first step that both ranks of the full world size wrote."""
    failed = running(job, SPARE_MAX)
    if failed:
        return {"spare": failed}
    (standby,) = job.start(1)
    waiting = standing_by(job, standby)
    if waiting:
        return {"spare": waiting}
    host = rendezvous_host(job)  # under load the second launcher may bind the endpoint first
    lost = [n for n in job.nodes[:SPARE_MAX] if n is not host][-1]  # a member, never the host nor the standby
    when = time.time()
    killed = set(signal_node(lost, signal.SIGKILL))  # its worker may write a step line while the sweep runs
    return {"spare": after_loss(job, when, lost, first_full_step(SPARE_MAX, after=when, without=killed))}


def standing_by(job: Job, standby: harness.Run) -> Optional[Figure]:
    """Wait until ``standby`` waits for a place (ours says so; torchrun's agent says nothing, it is given
    ``TORCHRUN_STANDBY_S``), then a second more; a Figure if it ended first."""
    def said_so() -> bool:
        text = standby.stderr_path.read_text(errors="replace")
        return "this launcher waits as a standby" in text or standby.exited
    if job.side.module == "launcher":
        deadline = time.monotonic() + job.bound
        while not said_so() and time.monotonic() < deadline:
            time.sleep(0.05)
    else:
        time.sleep(TORCHRUN_STANDBY_S)
    time.sleep(1.0)
    if standby.exited or (job.side.module == "launcher" and not said_so()):
        return Figure(verdict="error", detail=f"no standby ({job.codes([standby])})", said=said([standby]))
    return None


@dataclass(frozen=True)
class Scenario:
    name: str
    rows: tuple  # (figure key, label) of its rows
    run: Callable[[Job], dict]
    max_restarts: int = 3
    worker_args: tuple = ()
    nnodes: str = "2:3"
    warm: bool = False  # ours with workers kept in place: --warm_start


SCENARIOS = (
    Scenario("startup", (("startup-any", "1. start-up: first launcher start -> first step (any rank)"),
                         ("startup-all", "1. start-up: first launcher start -> first step of all 3 ranks")),
             startup, worker_args=("--steps", STARTUP_STEPS)),
    Scenario("poweroff", (("poweroff", "2. power-off (SIGKILL) of a node -> next step at world 2"),), poweroff),
    Scenario("silent", (("silent", "3. silent node (SIGSTOP) -> next step at world 2"),), silent),
    Scenario("join", (("join", "4. join: 3rd launcher start -> its first step (world 3)"),), join),
    Scenario("norestart", (("poweroff", "5. --max-restarts=0, power-off -> next step at world 2"),), poweroff,
             max_restarts=0),
    Scenario("spare", (("spare", "6. spare: --nnodes 1:2 + a standby, power-off -> next step of both ranks at world 2"),),
             spare, nnodes=f"1:{SPARE_MAX}", warm=True),
)


# ---------------------------------------------------------------- runs and the table


@dataclass
class RunResult:
    figures: dict
    exits: str = ""
    leftovers: list = field(default_factory=list)


def run_once(scenario: Scenario, side: Side, folder: Path, conf: Optional[str], bound: float,
             etcd: Optional[str] = None, lose_first: bool = False) -> RunResult:
    def failed(e: Exception) -> dict:
        return {key: Figure(verdict="error", detail=f"{type(e).__name__}: {e}") for key, _ in scenario.rows}

    folder.mkdir()
    with harness.PortReservations() as ports:
        until = ("--until", f"{time.time() + RUNNING_BOUND_S + 2 * bound + JOB_SLACK_S:.0f}")
        try:
            job = Job(side, folder, ports, scenario.max_restarts, conf, [*scenario.worker_args, *until], bound,
                      etcd, lose_first, scenario.nnodes, scenario.warm)
        except (OSError, harness.BenchError) as e:  # no ports, no folder: nothing started
            return RunResult(failed(e))
        try:
            figures = scenario.run(job)
        except Exception as e:  # one run failing must not end the benchmark
            figures = failed(e)
        finally:
            exits, left = stop_all(job)
    return RunResult(figures, exits, left)


def cell(figures: list) -> str:
    """Median (min-max) of the seconds, then how often each verdict came, with the first one's detail."""
    seconds = [f.seconds for f in figures if f.seconds is not None]
    parts = []
    if seconds:
        text = f"{statistics.median(seconds):.3g} s"
        if len(seconds) > 1:
            text += f" ({min(seconds):.3g}-{max(seconds):.3g})"
        parts.append(text + (f" in {len(seconds)} of {len(figures)}" if len(seconds) < len(figures) else ""))
    for verdict in dict.fromkeys(f.verdict for f in figures if f.seconds is None):
        same = [f for f in figures if f.seconds is None and f.verdict == verdict]
        count = f" x{len(same)}" if len(figures) > 1 else ""
        parts.append(f"{verdict}{count} ({same[0].detail})" if same[0].detail else f"{verdict}{count}")
    return "; ".join(parts).replace("|", "/")


def table(results: dict, names: list, loads: dict) -> str:
    lines = [f"| scenario | {' | '.join(names)} | load average at the start |", "|---" * (len(names) + 2) + "|"]
    for scenario in SCENARIOS:
        if scenario.name not in results:
            continue
        for key, label in scenario.rows:
            cells = [cell([r.figures[key] for r in results[scenario.name][name]]) for name in names]
            lines.append(f"| {label} | {' | '.join(cells)} | {loads[scenario.name]:.2f} |")
    return "\n".join(lines)


def leftovers_note(results: dict) -> str:
    notes = [f"{name}, {scenario} run {i + 1}: {len(r.leftovers)} left ({'; '.join(r.leftovers)}), killed"
             for scenario, by_side in results.items() for name, runs in by_side.items()
             for i, r in enumerate(runs) if r.leftovers]
    return "Left running after a run: " + ("; ".join(notes) if notes else "nothing.")


def parse_args(argv: list) -> argparse.Namespace:
    names = [s.name for s in SCENARIOS]
    parser = argparse.ArgumentParser(description="Elastic jobs under our launcher and torchrun.")
    parser.add_argument("--only", default=",".join(names), help="comma-separated, of: " + ",".join(names))
    parser.add_argument("--runs", type=int, default=1, help="runs per scenario and launcher (default 1)")
    parser.add_argument("--json", type=Path, help="write every run's figures there")
    parser.add_argument("--repo", type=Path, default=harness.REPO, help="the repository whose launcher is measured")
    parser.add_argument("--bound", type=float, default=EVENT_BOUND_S,
                        help=f"seconds to wait for a figure after its event (default {EVENT_BOUND_S:.0f})")
    parser.add_argument("--rdzv-conf", help="passed on to both launchers as --rdzv-conf")
    parser.add_argument("--sides", default="ours,inprocess,torchrun",
                        help="the launchers measured: ours (workers restarted), inprocess (ours, workers kept: "
                             "launcher.runtime.elastic), torchrun (default these three), example (ours, running "
                             "examples/elastic_inprocess.py as docs/elastic.md shows)")
    parser.add_argument("--etcd", metavar="HOST:PORT", help="the membership in this etcd (started with --enable-v2 "
                        "for torchrun's etcd-v2, which needs python-etcd): ours --rdzv-backend=etcd, torchrun's "
                        "etcd-v2; 'local': a one-member etcd started for the benchmark on 127.0.0.1")
    parser.add_argument("--lose", choices=("other", "first"), default="other",
                        help="the node lost: another one (default), or the first (with --etcd, our keeper)")
    parser.add_argument("--keep", type=Path, help="keep every run's folder (the launchers' output, the steps) there")
    args = parser.parse_args(argv)
    if set(args.only.split(",")) - set(names) or args.runs < 1 or not 1 <= args.bound <= 3600:
        parser.error(f"--only takes {','.join(names)}, --runs a whole number from 1, --bound 1 to 3600 s "
                     f"(got --only {args.only}, --runs {args.runs}, --bound {args.bound:g})")
    if not (args.repo / "launcher").is_dir():
        parser.error(f"--repo {args.repo} holds no launcher/ package; give the repository's root folder")
    if args.keep and args.keep.exists() and any(args.keep.iterdir()):
        parser.error(f"--keep {args.keep} is not empty; give a new or empty folder")
    if set(args.sides.split(",")) - set(SIDES):
        parser.error(f"--sides takes {', '.join(SIDES)}, comma-separated, not {args.sides}")
    if args.etcd == "local" and "torchrun" in args.sides.split(","):
        parser.error("--etcd local is for our sides only (torchrun's etcd-v2 needs etcd's v2 API): give --sides")
    return args


def measure(args: argparse.Namespace, root: Path) -> tuple:
    """Every run of every scenario chosen, sides alternating; (results, load average at each scenario's start)."""
    measured = [s for s in sides(args.repo.resolve()) if s.name in args.sides.split(",")]
    results: dict = {}
    loads: dict = {}
    for scenario in (s for s in SCENARIOS if s.name in args.only.split(",")):
        loads[scenario.name] = os.getloadavg()[0]
        results[scenario.name] = {side.name: [] for side in measured}
        for rep in range(args.runs):
            for side in measured:
                began = time.monotonic()
                folder = root / f"{scenario.name}-{side.name}-{rep}"
                result = run_once(scenario, side, folder, args.rdzv_conf, args.bound, args.etcd, args.lose == "first")
                results[scenario.name][side.name].append(result)
                figures = "; ".join(cell([f]) for f in result.figures.values())
                harness.progress(f"  {scenario.name}: {side.name} run {rep + 1}: {figures} [{result.exits}] "
                                 f"({time.monotonic() - began:.0f} s)")
    return results, loads


def main(argv: Optional[list] = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = parse_args(argv)
    if args.keep:
        args.keep.mkdir(parents=True, exist_ok=True)
    with nullcontext(args.keep) if args.keep else harness.temp_root() as root:
        with local_etcd(root / "etcd") if args.etcd == "local" else nullcontext(args.etcd) as args.etcd:
            results, loads = measure(args, root)
    text = table(results, [s for s in SIDES if s in args.sides.split(",")], loads)
    print(f"{text}\n\n{leftovers_note(results)}", flush=True)
    if args.json:
        runs = {sc: {name: [asdict(r) for r in rs] for name, rs in by_side.items()} for sc, by_side in results.items()}
        args.json.write_text(json.dumps({"command": ["bench/elastic.py", *argv], "repo": str(args.repo.resolve()),
                                         "load_average": loads, "results": runs, "table": text}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
