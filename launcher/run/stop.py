"""The stop after an internal error, when the event loop cannot be trusted: the same stop sequence
as always (the policy's: SIGTERM, the grace time, SIGKILL; a stop signal meanwhile kills at once),
carried out by the same hands (``launcher.run.actions``), with no loop but a bounded wait, silent,
so that nothing is left running."""

from __future__ import annotations

from launcher.plan import policy
from launcher.run.actions import carry_out
from launcher.run.workers import WorkerGroup

WAIT_STEP = 0.02  # how often the stop looks whether everything is gone


def stop_what_runs(group: WorkerGroup, received) -> None:
    """Whatever of ``group`` still runs is stopped, bounded. ``received``: the signals that came
    since the last call (``SignalIntake.received``). The workers' exits are not the policy's
    business here (the failure is the launcher's own): only its stop timeline is used."""
    if not group.anything_runs():
        return
    clock = group.clock
    try:
        state = policy.start(group.ranks, group.plan.shutdown_timeout)
        state = _step(state, policy.StopOrdered("the launcher failed"), group)
        while not policy.gave_up(state, clock.monotonic()):
            group.exits()
            if not _still_running(group, state):
                return
            stops = [policy.StopSignal(s) for s in received() if s in group.plan.stop_signals]
            for event in stops + [policy.TimePassed()]:
                state = _step(state, event, group)
            clock.sleep(WAIT_STEP)
    except BaseException:
        group.kill()  # the policy itself failed: nothing may be left running all the same
        raise


def _still_running(group: WorkerGroup, state: policy.State) -> bool:
    """Before SIGKILL: any process of the job; after it, the workers (their leftovers are not waited for)."""
    if state.killed_at is None:
        return group.anything_runs()
    return any(w.alive for w in group.workers.values())


def _step(state: policy.State, event, group: WorkerGroup) -> policy.State:
    after, actions = policy.decide(state, event, group.clock.monotonic())
    carry_out(group, [a for a in actions if not isinstance(a, policy.Say)])
    return after
