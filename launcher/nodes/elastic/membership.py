"""The membership of an elastic job as node 0's launcher keeps it: a pure function of (state, event, time).

Node 0's launcher is the keeper: it is the first member and node rank 0 of every round (its own
loss ends the job elsewhere, not here). Every other launcher asks to join with an identity it made
(``Node``: an id of its own, its host, its number of workers). The event loop feeds ``decide`` what
the control channel reports and what the nodes say, and carries out the actions it returns; nothing
here touches a socket or reads the clock (``now`` is given), so every rule is tested by replaying
histories (tests/test_membership.py). The settings are an ``ElasticSpec``'s (``launcher.plan.elastic``).

The rules:

- The job starts (round 1) when MAX nodes are in, or MIN nodes and ``last_call_timeout`` has passed
  since the MIN-th came.
- A node is lost when its connection closes, when node 0 has heard nothing from it for
  ``heartbeat_timeout``, or when it has not reported its workers stopped within ``close_timeout`` of
  a re-form's start. While at least MIN remain, the round is re-formed at once: every surviving
  member stops its workers (``StopWorkers``), and once they all report them stopped the next round
  starts with the survivors. Losses and joins meanwhile go into that same round.
- A node that joins a running job below MAX is admitted and the round re-formed at once; at MAX it
  is admitted as a standby (any number of them, in the order they came), which takes the place of the next member
  lost.
- Nodes may run different numbers of workers (as under torchrun). In each round node ranks stay as
  stable as they can: the survivors keep their order, newcomers go last; global ranks are contiguous,
  each node's block as long as its number of workers (its first rank the sum of those before it). A
  lost member's place goes to the first standby of its size, at its node rank, so that every rank and
  the world size stay; with no standby of its size, the first standby joins last, as a newcomer (the
  ranks after the lost node's move, and the world size changes).
- A membership change spends no restart: ``max_restarts`` counts worker failures only. A worker
  failure of the running round spends one and re-forms the round with the same members; none left,
  the job ends with the failure's code. With ``failed_node_leaves`` (Paddle's ``--elastic_level 0``)
  the failing node leaves instead (its launcher ends with that code) and the others re-form. Where the
  backend finds some losses late (``spec.failure_grace``: etcd's leases), the verdict waits that long,
  since a loss found meanwhile explains the failure and spends no restart.
- Below MIN, node 0 waits up to ``join_timeout`` for nodes to join (a lost node comes back as a new
  one, with a new id), then ends the job with code 1, naming the nodes lost.

The cost at 10,000 nodes: a join, a report and ``next_deadline`` cost O(1) each (amortised), a batch of
heartbeats O(1) per node in it (the oldest heartbeat found again once when the batch renews it), not O(N): the
state keeps its nodes, their last heartbeats and the ids it knows in the model's persistent containers
(``Row``, ``PMap``, ``PSet``), whose every version stays valid. What concerns every node (a round's start, a
stop, a loss) costs O(N), once.
"""

from __future__ import annotations

import logging
from dataclasses import replace
from typing import Optional, Tuple

from launcher.nodes.elastic.model import (  # noqa: F401
    ENDED, LEAVES, REFORMING, RUNNING, SILENT, UNWELL, WAITING, Action, Admit, Checked, Closed, Drop, EndJob, Event,
    Heartbeat, JobEnded, JoinAsked, KeepOut, Member, Node, Refuse, Round, RoundDone, StartRound, State, StopWorkers,
    TimePassed, WorkerFailed, WorkersStopped, describe)
from launcher.nodes.elastic import seats
from launcher.nodes.elastic.persistent import PSet, Row
from launcher.plan.elastic import ElasticSpec
from launcher.plan.policy import Say



def begin(spec: ElasticSpec, keeper: Node, job_id: str, now: float) -> Tuple[State, tuple]:
    """The membership when node 0's launcher starts: itself, waiting for the others (a job of one node at
    most starts at once)."""
    state = State(spec=spec, keeper=keeper.node_id, job_id=job_id, members=(keeper,), wait_began=now)
    return _maybe_start(state, now)


def next_deadline(state: State) -> Optional[float]:
    """When ``TimePassed`` may next change something; None: only an event will."""
    if state.phase == ENDED:
        return None
    oldest = state.heard.low()  # the least of at + heartbeat_timeout, as floats add (monotonic)
    times = [] if oldest is None else [oldest + state.spec.rendezvous.heartbeat_timeout]
    if state.unstopped:
        times.append(state.stop_began + state.spec.rendezvous.close_timeout)
    if state.failure is not None:
        times.append(state.failure[1] + state.spec.failure_grace)
    if state.phase == WAITING and len(state.members) < state.spec.min_nodes:
        times.append(state.wait_began + state.spec.rendezvous.join_timeout)
    elif state.phase == WAITING and state.min_reached is not None and not state.unstopped and state.failure is None:
        times.append(state.min_reached + state.spec.rendezvous.last_call_timeout)  # else a stop or a verdict holds it
    return min(times, default=None)


# ---------------------------------------------------------------- rules


def decide(state: State, event: Event, now: float) -> Tuple[State, tuple]:
    if state.phase == ENDED:
        refusal = (Refuse(event.node.node_id, "the job has ended"),) if isinstance(event, JoinAsked) else ()
        return state, refusal
    if isinstance(event, JoinAsked) and event.unfit is not None and seats.refusal(state, event.node, event.job_id) is None:
        return state, (KeepOut(event.node.node_id, event.unfit), Say(logging.WARNING, f"{event.unfit}; kept out"))
    if isinstance(event, JoinAsked):
        return _on_join(state, event.node, event.job_id, now)
    if isinstance(event, Checked):
        return _on_checked(state, event, now)
    if isinstance(event, Heartbeat):
        heard = state.heard.update(event.at or {event.node_id: now}, known_only=True)  # of the nodes it knows
        return (state if heard is state.heard else replace(state, heard=heard)), ()
    if isinstance(event, Closed):
        return _lose(state, event.node_id, event.reason, now)
    if isinstance(event, WorkersStopped):
        if state.round is None or event.round != state.round.number or event.node_id not in state.unstopped:
            return state, ()
        return _maybe_start(replace(state, unstopped=state.unstopped.minus(event.node_id)), now)
    if isinstance(event, RoundDone):
        return _on_done(state, event, now)
    if isinstance(event, WorkerFailed):
        return _on_failure(state, event, now)
    if isinstance(event, JobEnded):
        return _end(state, event.code, event.reason)
    return _on_time(state, now)


def _on_join(state: State, node: Node, job_id: str, now: float):
    refusal = seats.refusal(state, node, job_id)
    if refusal is not None:
        return state, (Refuse(node.node_id, refusal),)
    heard = state.heard.update({node.node_id: now})
    if len(state.members) >= state.spec.max_nodes:
        state = seats.seated(state, state.members, state.standbys.plus(node), came=(node,), heard=heard)
        return state, (Admit(node.node_id, standby=True),
                       Say(logging.INFO, f"{node.label} waits as a standby: the job has its {state.spec.max_nodes} nodes"))
    state = seats.seated(state, state.members.plus(node), state.standbys, came=(node,), heard=heard)
    actions = (Admit(node.node_id), Say(logging.INFO, f"{node.label} joined ({len(state.members)} node(s))"))
    if state.phase == RUNNING:
        state, more = _reform(state, "joined", f"{node.label} joined", now)
    else:
        state, more = _maybe_start(state, now)
    return state, actions + more




def _lose(state: State, node_id: str, reason: str, now: float, start: bool = True):
    """``node_id`` is gone: a standby is just forgotten; a member's place goes to the first standby, and
    the round is re-formed (or the wait for MIN nodes begins). ``start``: the next round may start now (not
    while other losses of the same moment are still to be counted)."""
    node = state.known(node_id)
    if node is None or node_id == state.keeper:
        return state, ()
    heard = state.heard.update(gone=(node_id,))
    if node in state.standbys:
        standbys = Row(n for n in state.standbys if n != node)
        state = seats.seated(state, state.members, standbys, gone=(node_id,), heard=heard, aside=state.aside.minus(node_id))
        return state, (Say(logging.INFO, f"standby {node.label} left: {reason}"),)
    members, standbys, promoted = seats.promote(state, node)
    text = f"{node.label} {'left' if LEAVES in reason else 'lost'}: {reason}{promoted}"
    state = seats.seated(state, members, standbys, gone=(node_id,), heard=heard, unstopped=state.unstopped.minus(node_id),
                    left=state.left + ((node, reason),))
    actions = (Say(logging.WARNING, text),)
    if state.failure is not None:  # the loss explains the failure: no restart spent
        actions, state = actions + (Say(logging.INFO, f"{state.failure[0].reason}: explained by that loss, no restart "
                                                      "spent"),), replace(state, failure=None, why="lost")
    if state.phase == RUNNING:
        state, more = _reform(state, "lost", text, now)
    else:
        state, more = _settle(state, now, start)
    return state, actions + more




def _on_done(state: State, event: RoundDone, now: float):
    """A member's workers all finished: once every member's have, the job ends with 0. During a re-form
    this counts as the member's workers stopped."""
    current = state.round
    if current is None or event.round != current.number or current.member(event.node_id) is None:
        return state, ()
    if state.phase == REFORMING:
        return decide(state, WorkersStopped(event.node_id, event.round), now)
    if state.phase != RUNNING:
        return state, ()
    state = replace(state, done=state.done.plus(event.node_id))
    if len(state.done) >= len(current.members) and all(m.node.node_id in state.done for m in current.members):
        return _end(state, 0, f"every worker of round {current.number} finished")
    return state, ()


def _on_failure(state: State, event: WorkerFailed, now: float):
    """A worker failure of the running round (one of a round being stopped is the stop's own, and ignored)."""
    current = state.round
    if state.phase != RUNNING or event.round != current.number or current.member(event.node_id) is None:
        return state, ()
    if event.unfit is not None and event.node_id != state.keeper:  # it leaves, no restart spent; it stays aside
        node = state.known(event.node_id)
        state, actions = _lose(state, event.node_id, f"{event.unfit}; {UNWELL}", now)
        state = seats.seated(state, state.members, state.standbys.plus(node), came=(node,), heard=state.heard.update(
            {node.node_id: now}), aside=state.aside.plus(node.node_id))
        return state, (KeepOut(node.node_id, event.unfit, admitted=True),) + actions
    if state.spec.failed_node_leaves and event.node_id != state.keeper:
        state, actions = _lose(state, event.node_id, f"{event.reason}; {LEAVES} (--elastic_level 0)", now)
        return state, (Drop(event.node_id, event.code, event.reason),) + actions
    if state.spec.failure_grace:  # the backend finds some losses late: one may yet explain this failure
        return _reform(replace(state, failure=(event, now)), "restart", f"{event.reason}: stopping the round", now)
    spent, most = state.restarts, state.spec.max_restarts
    if spent < most and not state.spec.failed_node_leaves:  # node 0, which cannot leave, ends the job instead
        return _reform(replace(state, restarts=spent + 1), "restart",
                       f"{event.reason}: restarting the job ({spent + 1} of {most} restarts)", now)
    return _end(state, event.code, f"{event.reason} (restarts spent: {spent} of {most})")


def _on_checked(state: State, event: Checked, now: float):
    """A standby checked again: failing, it is set aside (never promoted) until it passes; passing, it is taken in
    again as a launcher that joins (a member below MAX, else a standby)."""
    node = state.known(event.node_id)
    if node is None or node not in state.standbys or (event.unfit is not None) == (node.node_id in state.aside):
        return state, ()  # not a standby, or nothing changed
    if event.unfit is not None:
        return replace(state, aside=state.aside.plus(node.node_id)), (KeepOut(node.node_id, event.unfit, True), Say(
            logging.WARNING, f"{event.unfit}; standby {node.label} is set aside until it passes"))
    standbys, aside = Row(n for n in state.standbys if n != node), state.aside.minus(node.node_id)
    return _on_join(seats.seated(state, state.members, standbys, gone=(node.node_id,), aside=aside), node, state.job_id, now)


def _verdict(state: State, now: float):
    """No loss explained the failure: it spends a restart, or ends the job when none is left."""
    (event, _), spent, most = state.failure, state.restarts, state.spec.max_restarts
    if spent < most and not state.spec.failed_node_leaves:  # node 0's, as with no grace: it cannot leave, it ends
        say = Say(logging.WARNING, f"{event.reason}: restarting the job ({spent + 1} of {most} restarts)")
        state, more = _maybe_start(replace(state, failure=None, restarts=spent + 1, why="restart"), now)
        return state, (say,) + more
    return _end(replace(state, failure=None), event.code, f"{event.reason} (restarts spent: {spent} of {most})")


def _reform(state: State, why: str, reason: str, now: float):
    """Stop the running round's workers on every member still in; the next round follows once they have (a member
    whose workers all finished already has none to stop: it is not waited for)."""
    staying = {n.node_id for n in state.members}
    stopping = tuple(m.node.node_id for m in state.round.members if m.node.node_id in staying)
    stop = StopWorkers(state.round.number, stopping, reason)
    unstopped = PSet(n for n in stopping if n not in state.done)
    state = replace(state, phase=REFORMING, why=why, unstopped=unstopped, stop_began=now)
    state, more = _settle(state, now)
    return state, (stop,) + more


def _settle(state: State, now: float, start: bool = True):
    """After a change while no round runs: below MIN the wait for nodes begins; else a round may start."""
    spec = state.spec
    if state.phase == REFORMING and len(state.members) < spec.min_nodes:
        state = replace(state, phase=WAITING, wait_began=now, min_reached=None)
        say = Say(logging.WARNING, f"{len(state.members)} node(s) left, {spec.min_nodes} needed: waiting up to "
                                   f"{spec.rendezvous.join_timeout:g} s (join_timeout) for nodes to join")
        state, more = _maybe_start(state, now) if start else (state, ())
        return state, (say,) + more
    return _maybe_start(state, now) if start else (state, ())


def _maybe_start(state: State, now: float):
    """Start the next round if it may: every stop reported and MIN nodes in; when waiting, MAX of them or
    the last call over."""
    count, spec = len(state.members), state.spec
    if state.phase == RUNNING or state.failure is not None:
        return state, ()
    if count < spec.min_nodes:
        return replace(state, min_reached=None), ()
    last_call = state.phase == WAITING and count < spec.max_nodes
    if last_call and state.min_reached is None:
        state = replace(state, min_reached=now)
    if state.unstopped or last_call and now < state.min_reached + spec.rendezvous.last_call_timeout:
        return state, ()
    return _start_round(state)


def _start_round(state: State):
    previous = state.round
    members, rank = [], 0
    for node_rank, node in enumerate(state.members):
        members.append(Member(node, node_rank, rank))
        rank += node.workers
    before = set() if previous is None else {m.node.node_id for m in previous.members}
    round_ = Round(number=1 if previous is None else previous.number + 1, members=tuple(members), world_size=rank,
                   why=state.why, joined=tuple(n for n in state.members if n.node_id not in before), left=state.left,
                   restarts=state.restarts)
    state = replace(state, phase=RUNNING, rounds=state.rounds + (round_,), why="start", left=(), done=PSet(),
                    unstopped=PSet(), stop_began=None, wait_began=None, min_reached=None)
    return state, (StartRound(round_), Say(logging.INFO, describe(round_)))


def _on_time(state: State, now: float):
    """What the time says: the silent nodes lost (all of them before a round may start: none is started and
    stopped at once), the stops overdue, the waits over, a failure's verdict; then a round may start."""
    rendezvous, actions = state.spec.rendezvous, ()
    for node_id, at in sorted(state.heard.where(lambda at: now >= at + rendezvous.heartbeat_timeout)):
        if state.phase != ENDED:
            reason = f"{SILENT} {now - at:.1f} s (heartbeat_timeout {rendezvous.heartbeat_timeout:g} s)"
            state, more = _lose(state, node_id, reason, now, start=False)
            actions += (Drop(node_id, 1, reason),) + more
    if state.unstopped and now >= state.stop_began + rendezvous.close_timeout and state.phase != ENDED:
        state, more = _stop_overdue(state, now)
        actions += more
    if state.phase == WAITING and len(state.members) < state.spec.min_nodes \
            and now >= state.wait_began + rendezvous.join_timeout:
        state, more = _end(state, 1, seats.gave_up(state))
        return state, actions + more
    if state.failure is not None and now >= state.failure[1] + state.spec.failure_grace and state.phase != ENDED:
        state, more = _verdict(state, now)
        actions += more
    if state.phase == ENDED:
        return state, actions
    state, more = _maybe_start(state, now)
    return state, actions + more


def _stop_overdue(state: State, now: float):
    """The members that have not reported their workers stopped within close_timeout are lost; node 0's
    own overdue stop ends the job (it cannot leave it)."""
    overdue = f"workers did not stop within {state.spec.rendezvous.close_timeout:g} s (close_timeout)"
    if state.keeper in state.unstopped:
        return _end(state, 1, f"node 0's {overdue}")
    reason = f"its {overdue}"
    actions = ()
    for node_id in sorted(state.unstopped):
        state, more = _lose(state, node_id, reason, now)
        actions += (Drop(node_id, 1, reason),) + more
    return state, actions




def _end(state: State, code: int, reason: str):
    nodes = tuple(n.node_id for n in state.members + state.standbys)
    return replace(state, phase=ENDED, end=(code, reason)), (EndJob(code, reason, nodes),)
