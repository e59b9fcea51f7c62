"""One attempt on this node, from its first worker to the end of its last process: the event loop's
events fed to the policy (``launcher.plan.policy``, pure), its actions carried out, and each cause
to stop that this node finds told to the coordinator (``launcher.nodes``)."""

from __future__ import annotations

import json
from typing import Optional

from launcher.output import error_file
from launcher.output import reports
from launcher.output.messages import log
from launcher.plan import policy
from launcher.run import processes
from launcher.run.actions import carry_out
from launcher.run.loop import Loop
from launcher.run.coordination import Coordinator
from launcher.run.session import Launch
from launcher.run.workers import StartFailed, WorkerGroup


def supervise(launch: Launch, group: WorkerGroup, job: Coordinator,
              start_failure: Optional[StartFailed] = None) -> policy.State:
    """One attempt on this node, to the end of its last process; the policy's final state."""
    state = policy.start(group.ranks, launch.plan.shutdown_timeout, stacks=launch.plan.dump_stacks,
                         names=group.names(), trainers=group.trainers(), opted_in=group.adopted)
    loop = Loop(launch, job, group)
    try:
        return _run_loop(state, loop, start_failure)
    finally:
        loop.forget_pipes()


def _run_loop(state: policy.State, loop: Loop, start_failure: Optional[StartFailed]) -> policy.State:
    launch, group, job, clock = loop.launch, loop.group, loop.job, loop.clock
    if start_failure is not None:
        event = policy.StartFailed(start_failure.rank, str(start_failure))
        state = _step(state, event, loop)
    trainers_told = False
    while True:
        events = loop.turn(state)
        for event in events + [policy.TimePassed()]:
            state = _step(state, event, loop)
        if any(isinstance(e, policy.WorkerExited) for e in events) and _record_now(state, launch):
            launch.records.record_processes(group.snapshot, group.attempt)
        if state.trainers_done and not state.stopping and not trainers_told:
            trainers_told = True
            for event in job.trainers_done():
                state = _step(state, event, loop)
        if policy.gave_up(state, clock.monotonic()):
            log.warning("process(es) %s did not end after SIGKILL (uninterruptible sleep?); giving up on them",
                        ",".join(map(str, group.running_pids())) or "?")
            break
        if not state.running:  # the workers are done: what they left, and their last output
            found = group.leftovers()
            processes.close_all(found)
            helpers = all(processes.is_self_ending(p.pid) for p in found)
            if found and not (helpers and loop.helpers_may_end()):
                state = _step(state, policy.LeftoversRunning(len(found), helpers), loop)
            elif not found and loop.drained():
                break
    return state


def _record_now(state: policy.State, launch: Launch) -> bool:
    """After an exit: at once, except during a stop, when many end together (then at most every
    STATE_INTERVAL, and at the last one)."""
    return not state.stopping or not state.running or launch.records.due()


def _step(state: policy.State, event, loop: Loop) -> policy.State:
    """Decide, carry out, and tell the job when this node found a cause to stop."""
    if isinstance(event, policy.StopSignal) and (state.stopping or not state.running):
        loop.abandon()  # a stop signal on top of a stop: the console is not waited for either
    after, actions = policy.decide(state, event, loop.clock.monotonic())
    carry_out(loop.group, actions)
    _note(event, loop)
    cause = _new_cause(state, after, loop)
    if cause is not None:
        loop.launch.events.write("stop", kind=cause.kind, cause=cause.text, code=cause.code,
                                 rank=after.failure[0] if cause.kind == "worker" and after.failure else None)
    if cause is not None and cause.kind == "worker" and state.failure is not None:
        loop.job.revise_cause(cause)  # a server's failure came first (policy.SERVER_FIRST)
    elif cause is not None:
        loop.job.local_cause(cause)
    return after


def _note(event, loop: Loop) -> None:
    """The event log's line for a worker's exit, or a stop ordered from elsewhere (a cause found here is noted with it)."""
    events = loop.launch.events
    if isinstance(event, policy.WorkerExited):
        worker = loop.group.workers.get(event.rank)
        events.write("worker_exited", rank=event.rank, pid=worker.pid if worker is not None else None,
                     code=event.returncode, exit=policy.describe_exit(event.returncode))
    elif isinstance(event, policy.StopOrdered):
        events.write("stop", kind="elsewhere", cause=event.reason)
    elif isinstance(event, policy.RoundOver):
        events.write("stop", kind="membership", cause=event.reason)


def _new_cause(before: policy.State, after: policy.State, loop: Loop) -> Optional[policy.Cause]:
    job, group = loop.job, loop.group
    node, label = job.plan.node_rank, job.node_label()
    on = f" on {label}" if label else ""
    if after.failure is not None and after.failure != before.failure:
        rank, returncode = after.failure
        failure = group.failure(rank)
        text = f"{after.name(rank)}{on} failed ({policy.describe_exit(returncode)})"
        error = json.dumps(error_file.bounded(failure.error)) if failure.error else ""
        return policy.Cause(node, "worker", policy.shell_code(returncode), text, reports.format_failure(failure), error)
    if after.stop_signal is not None and before.stop_signal is None:  # after a failure too (an elastic node leaves)
        return job.signal_cause(after.stop_signal)
    if after.start_failure is not None and before.start_failure is None:
        return policy.Cause(node, "start", 1, f"{after.start_failure}{on}")
    if after.hung is not None and before.hung is None:
        return policy.Cause(node, "hang", 1, f"{policy.hang_text(after, on)} (--hang_timeout)")
    return None
