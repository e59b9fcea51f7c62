"""The attempt driver: run the plan on this node, attempt after attempt (a restart after a
failure, up to ``--max_restarts``, as the coordinator decides), and end with the launcher's exit
code and the root cause every node shows.

It takes its process starter and clock as arguments (``launcher.run.starter``): the real ones by
default, fakes in tests (tests/test_attempts.py), which replay histories without processes.
"""

from __future__ import annotations

from typing import Callable, Optional

from launcher import envvars as ev
from launcher.errors import LaunchError
from launcher.nodes.static import job as job_module
from launcher.output import error_file
from launcher.output.console import console
from launcher.output.messages import log
from launcher.plan import policy
from launcher.plan.model import Plan
from launcher.run.coordination import Coordinator
from launcher.run.loop import Loop
from launcher.run.session import Launch
from launcher.run.starter import Clock, ProcessStarter, SubprocessStarter, SystemClock
from launcher.run.stop import stop_what_runs
from launcher.run.supervise import supervise
from launcher.run.workers import StartFailed, WorkerGroup

PARK_WAIT = 5.0  # seconds a worker kept for the next round has to leave its round
STORE_DRAIN = 60.0  # seconds node 0's store serves the workers of a node not yet joined, after a job that ended well


def run(plan: Plan, reserved: tuple = (), starter: Optional[ProcessStarter] = None,
        clock: Optional[Clock] = None, coordinator: Optional[Callable[[Plan], Coordinator]] = None,
        warm=None, on_end: Optional[Callable] = None) -> int:
    """Start the plan's workers, supervise them to the end (and again after a failure, up to
    ``plan.max_restarts`` times), and return the launcher's exit code.

    ``reserved``: sockets holding ports for the workers (rank 0's store), kept until the end. ``warm``: the workers
    started ahead of the first round (``launcher.run.warm``), woken as its workers. ``on_end(code, cause)``: told the end.
    ``starter``, ``clock``: the real ones by default. ``coordinator``: makes the job's coordinator
    across nodes, once the launch is set up (``launcher.nodes.static.job.for_plan`` by default).
    """
    launch = Launch(plan, starter or SubprocessStarter(), clock or SystemClock(), reserved)
    launch.warm = warm
    job = None
    try:
        launch.open()
        job = (coordinator or job_module.for_plan)(plan)
        launch.job_label = job.node_label()
        launch.records.rounds = job.history or None
        launch.records.health = job.health_states
        try:
            code = job.gate(Loop(launch, job).turn_until)  # every node joined and fit, or no worker starts anywhere
        except LaunchError as e:  # a node failed its health checks: the state file says which, and why
            launch.records.record("ended", e.exit_code)
            raise
        if code is not None:
            _tell_the_end(job, code, (launch.clock.monotonic(), 0), launch.clock)
            launch.records.record("ended", code, console=console.note)
            return code
        _note_start(launch, job)
        if job.reform_wait:
            launch.open_worker_channel(lambda: {"reform_wait": job.reform_wait})
        launch.start_watchdog()
        while True:
            started = _run_attempt(launch, job)
            _await_kept(launch, job)
            what, code = job.finish_attempt(Loop(launch, job).turn)
            if what == "end":
                _tell_the_end(job, code, started, launch.clock)
                cause = job.final_cause()
                launch.events.write("job_ended", code=code, cause=cause.text if cause is not None else None)
                if on_end is not None:
                    on_end(code, cause)
                console.finish()  # bounded: a console nobody reads never holds the end
                launch.records.record("ended", code, console=console.note)
                if code == 0 and launch.plan.control is not None:
                    launch.store.drain(min(launch.plan.control.join_timeout, STORE_DRAIN))
                return code
            if job.plan is not launch.plan:  # an elastic job's next round: its own plan
                launch.replan(job.plan)
                _note_round(launch, job)
                launch.spares.keep_matching({spec.rank: launch.worker_env(spec, job.attempt) for spec in job.plan.workers})
                launch.records.rounds = job.history
            else:  # the cause is the stop's, just before
                launch.events.write("restart", attempt=job.attempt, max_restarts=launch.plan.max_restarts)
            launch.records.record("restarting")
    finally:
        try:
            _stop_kept(launch)
        finally:
            if job is not None:
                job.close()
            launch.close()


def _note_start(launch: Launch, job: Coordinator) -> None:
    plan = launch.plan
    launch.events.write("job_started", nodes=len(plan.node_ips), world_size=plan.world_size, workers=len(plan.workers),
                        run_id=launch.run_id, max_restarts=plan.max_restarts)
    _note_round(launch, job)


def _note_round(launch: Launch, job: Coordinator) -> None:
    """An elastic job's round begun here: the round, then each change of the membership it follows."""
    for event in job.round_events():
        launch.events.round = event.get("round", launch.events.round)
        launch.events.write(**event)


def _await_kept(launch: Launch, job: Coordinator) -> None:
    """The workers kept for the next round leave their round (each says so) before this node says its workers of the
    round are gone; one that does not within PARK_WAIT (a collective that could not be interrupted) is killed, and
    started afresh in the next round, where it takes the state from a survivor."""
    deadline = launch.clock.monotonic() + PARK_WAIT
    group = WorkerGroup(launch)
    loop = Loop(launch, job)
    while group.unparked() and launch.clock.monotonic() < deadline:
        for event in loop.turn_until(deadline):
            if isinstance(event, policy.StopSignal):
                job.local_cause(job.signal_cause(event.sig))
                deadline = 0.0
    for kept in group.unparked():
        log.warning("%s did not leave its round within %g s (blocked in a collective that could not be interrupted): "
                    "it is started afresh", kept.spec.label, PARK_WAIT)
        group.drop_kept(kept)
        del launch.kept[kept.spec.local_rank]


def _stop_kept(launch: Launch) -> None:
    """Workers kept for a round that never came (the job ended between two rounds): stopped as any others are."""
    if not launch.kept:
        return
    group = WorkerGroup(launch)
    group.workers = {w.spec.rank: w for w in launch.kept.values()}
    launch.kept.clear()
    try:
        stop_what_runs(group, launch.intake.received)
    finally:
        group.close()


def _run_attempt(launch: Launch, job: Coordinator) -> tuple:
    """One attempt of the job on this node; (when it started, how many workers)."""
    group = WorkerGroup(launch, job.attempt)
    try:
        group.open_logs()
        try:
            launch.store.begin_attempt()
            group.start()
            launch.records.record_processes(group.snapshot, group.attempt)
            if job.attempt < launch.plan.max_restarts:
                launch.spares.make(launch.plan.workers, lambda spec: launch.worker_env(spec, group.attempt + 1),
                                   lambda spec: launch.progress.fds(spec.local_rank))
        except StartFailed as e:
            supervise(launch, group, job, start_failure=e)
        else:
            supervise(launch, group, job)
        return group.started_at, len(group.workers)
    finally:
        try:
            stop_what_runs(group, launch.intake.received)  # after an internal error: nothing is left running
        finally:
            group.close()


def _tell_the_end(job: Coordinator, code: int, started: tuple, clock: Clock) -> None:
    """Every node shows the same root cause: the one node 0 decided on."""
    cause = job.final_cause()
    if cause is None:
        if code == 0:
            what = "process(es)" if job.plan.parameter_server else "worker(s)"
            log.info("all %d %s finished in %.1f s", started[1], what, clock.monotonic() - started[0])
        return
    if cause.kind == "leave":  # on purpose: the job goes on without this node
        log.warning("%s; the job goes on without this node; exit code %d", cause.text, code)
        return
    if job.plan.error_file:
        _write_root_cause(job.plan.error_file, cause, code, clock)
    lines = []
    if job.node_label():
        lines.append(f"launcher: the job stopped: {cause.text}; exit code {code}")
    if cause.summary:
        lines.append(cause.summary)
    if lines:
        console.write(2, ("\n".join(lines) + "\n").encode(errors="replace"))


def _write_root_cause(path: str, cause: policy.Cause, code: int, clock: Clock) -> None:
    """For whoever gave the launcher TORCHELASTIC_ERROR_FILE (a scheduler, as to torchrun): the failing
    worker's own @record, else the cause in the same format."""
    data = error_file.loads(cause.error) or error_file.of_cause(cause.text, cause.summary, code, clock.time())
    problem = error_file.write(path, error_file.for_parent(data, code))
    if problem:
        log.warning("could not write the root cause to %s=%s (%s)", ev.ERROR_FILE, path, problem)
