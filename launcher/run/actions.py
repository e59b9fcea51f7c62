"""The policy's actions carried out on a worker group: messages, signals, SIGKILL, and the
workers' stacks and NCCL flight records taken before a stop."""

from __future__ import annotations

import os

from launcher.output.console import console
from launcher.output import reports
from launcher.output.messages import log
from launcher.plan import policy
from launcher.run import flight
from launcher.run.workers import WorkerGroup

STACK_TIMEOUT = 10.0  # how long taking the workers' stacks may hold up a stop


def carry_out(group: WorkerGroup, actions) -> None:
    for action in actions:
        if isinstance(action, policy.Say):
            log.log(action.level, "%s", action.text)
        elif isinstance(action, policy.TakeStacks):
            dumps = _ask_flight_recorders(group)
            _show_stacks(group)
            _report_flight_records(dumps, flight.wait_seconds(group.plan.base_env))
        elif isinstance(action, policy.Send):
            group.send(action.sig, action.leftovers)
        elif isinstance(action, policy.Kill):
            group.kill()
        elif isinstance(action, policy.Keep):
            group.keep(action.ranks, "the round is over")


def _ask_flight_recorders(group: WorkerGroup) -> dict:
    """Ask each surviving worker's NCCL flight recorder for a dump; {rank: the file it will write}."""
    alive = [w.spec for w in group.workers.values() if w.alive]
    base = group.plan.base_env
    return {rank: path for spec in alive for rank, path in flight.request([spec.rank], {**base, **spec.env}).items()}


def _report_flight_records(dumps: dict, timeout: float) -> None:
    if dumps:
        written = flight.wait(dumps, timeout)
        for rank in sorted(dumps):
            log.info("rank %d: NCCL flight recorder %s", rank,
                     f"dump: {written[rank]}" if rank in written else f"wrote no dump within {timeout:g} s")


def _show_stacks(group: WorkerGroup) -> None:
    """Where each surviving worker was, before it is stopped (py-spy; a note where it cannot)."""
    try:
        from launcher.run import stacks
    except ImportError:
        return
    alive = {w.spec.rank: w.pid for w in group.workers.values() if w.alive}
    if not alive:
        return
    found = stacks.take(alive, timeout=STACK_TIMEOUT)
    label = group.launch.job_label or "this node"
    names = group.names()
    console.write(2, (reports.format_stacks(found, label, names) + "\n").encode(errors="replace"))
    if group.plan.log_dir:
        path = os.path.join(group.plan.log_dir, "stacks.txt")
        reports.write_stacks(path, found, f"stacks of {label}, attempt {group.attempt + 1}", names)
        log.info("full stacks: %s", path)
    else:
        console.write(2, reports.format_dumps(found, f"stacks of {label}", names).encode(errors="replace"))
