"""The coordinator of an elastic job on every node: each round of the membership is an attempt of the
attempt driver, with that round's plan.

What happens here goes to node 0's membership through the link (``elastic_link.Link``): this node's
workers of a round all finished, or stopped, or a cause to stop found here (a worker failed). What
node 0 decides comes back through the link's ``Inbox``, which the event loop serves as its control
channel: stop this round's workers (a membership change, or a failure that spends a restart), start
the next round (a new plan: ``replan``), or the job's end. A stop signal to node 0's launcher ends
the job on every node; to another launcher, it takes that node out of the job (the others re-form).
A membership change spends no restart: ``TORCHELASTIC_RESTART_COUNT`` (this coordinator's
``attempt``) is the number of worker failures the job has spent, the same on every node.
"""

from __future__ import annotations

import logging
import signal
from typing import Callable, Optional, Tuple

from launcher.nodes.transport import messages as m
from launcher.nodes.elastic.link import JobOver, Link
from launcher.nodes.elastic.model import STRAGGLES
from launcher.output.messages import log
from launcher.plan import policy
from launcher.plan.model import Plan
from launcher.plan.policy import Cause

LEAVING = ("signal", "leave")  # this node's causes that take it out of the job: it waits for no word of node 0
Turn = Callable[[], list]
Replan = Callable[[m.RoundStart], Plan]  # a round -> this node's plan for it


class ElasticJob:
    """``reform_wait``: how long a worker that re-enters in place waits, after a collective failed, for the word
    that the round is over (the longest this backend takes to find a lost node), before it fails as usual."""

    def __init__(self, plan: Plan, link: Link, replan: Replan, reform_wait: float = 0.0, min_nodes: int = 1) -> None:
        self.plan = plan
        self.reform_wait = reform_wait
        self.link = link
        self.replan = replan
        self.channel = link.inbox
        self.round: m.RoundStart = link.first
        self.attempt = link.first.restarts or 0
        self.cause: Optional[Cause] = None  # this node's cause to stop in this round
        self.stop_order: Optional[m.StopWorkers] = None
        self.over: Optional[JobOver] = None
        self.next_round: Optional[m.RoundStart] = None
        self.stopped_early: set = set()  # rounds whose stop came before they began here
        self.rounds: list = [link.first]  # every round this node ran, for the state file
        self.speeds: tuple = ()  # every member's speed entry, as the membership last shared them
        self.min_nodes = min_nodes

    @property
    def history(self) -> tuple:
        """Each round this node ran, in a line (``launcher status`` shows them)."""
        return tuple(r.text or f"round {r.number}" for r in self.rounds)

    def node_label(self) -> str:
        return f"node {self.plan.node_rank} ({self.plan.node_ip})"

    def share_speed(self, own: tuple, now: float) -> None:
        if own:
            self.link.share_speed(m.node_speed(own, self.round.number))

    def peer_times(self, now: float) -> tuple:
        return m.others(self.speeds, self.plan.node_rank, self.round.number)

    def straggler_stays(self) -> Optional[str]:
        members = len(self.round.members or ())
        if self.link.leaving_ends_job():
            return "it is node 0 of a c10d job: its launcher keeps the membership, and its leaving would end the job"
        if members <= self.min_nodes:
            return f"the job is at its minimum of {self.min_nodes} node(s) (--nnodes)"
        return None

    def leave_as_straggler(self, straggler) -> list:
        """This node, named a straggler (``stragglers.Straggler``), leaves the job on purpose: its workers stop, the
        others re-form without it, and its launcher ends with exit code 0 (it did what it was asked)."""
        if self.over is not None or self.cause is not None:
            return []
        speed = f"its speed {straggler.speed:.2f} of the fastest rank's"
        self.cause = Cause(self.plan.node_rank, "leave", 0, f"{self.node_label()} leaves the job as a straggler "
                                                            f"(--straggler_policy leave): {straggler.reason}")
        self.link.leave(0, f"{STRAGGLES} ({speed}, --straggler_policy leave)")
        return [policy.StopOrdered(self.cause.text, level=logging.WARNING)]

    def local_cause(self, cause: Cause) -> None:
        if self.over is not None or (self.cause is not None and self.cause.kind in LEAVING):
            return
        if cause.kind == "signal":  # whatever stopped the round here: the node leaves, it waits for no word
            self.cause = cause
            self.link.leave(cause.code, cause.text)
        elif self.cause is None:
            self.cause = cause
            if self.stop_order is None:  # a failure of a round being stopped is the stop's own
                self.link.failed(self.round.number, cause.code, cause.text)

    def revise_cause(self, cause: Cause) -> None:
        if self.cause is not None and self.cause.kind == "worker":
            self.cause = cause

    def signal_cause(self, sig: int) -> Cause:
        name = signal.Signals(sig).name
        what = "the job ends" if self.plan.node_rank == 0 else "this node leaves the job"
        return Cause(self.plan.node_rank, "signal", 128 + sig, f"{self.node_label()} received {name}: {what}")

    def on_events(self, events) -> list:
        out = []
        for e in events:
            if isinstance(e, m.StopWorkers) and e.round == self.round.number and self.stop_order is None:
                self.stop_order = e
                out.append(policy.RoundOver(e.reason))
            elif isinstance(e, JobOver) and self.over is None:
                self.over = e
                out.append(policy.StopOrdered(e.reason))
            elif isinstance(e, m.StopWorkers) and e.round > self.round.number:
                self.stopped_early.add(e.round)  # the next round was stopped before it began here
            elif isinstance(e, m.RoundStart) and (e.number or 0) > self.round.number:
                self.next_round = e
            elif isinstance(e, m.Speeds):  # every member's entry, as the membership last shared them
                self.speeds = e.nodes
        return out

    def tick(self, now: float) -> list:
        return []

    def gate(self, wait) -> Optional[int]:
        return None  # this node's checks were judged as it joined (``form``)

    def trainers_done(self) -> list:
        return [policy.TrainersDone("every trainer finished")]

    def finish_attempt(self, turn: Turn) -> Tuple[str, int]:
        """This node's workers of the round are gone: say so, then follow node 0's word."""
        if self.over is None and not (self.cause is not None and self.cause.kind in LEAVING):
            if self.cause is None and self.stop_order is None:
                self.link.done(self.round.number)
            else:
                self.link.stopped(self.round.number)
        while True:
            if self.over is not None:
                return "end", self.over.code
            if self.cause is not None and self.cause.kind in LEAVING:
                return "end", self.cause.code
            if self.next_round is not None and self.next_round.number in self.stopped_early:
                self._skip(self.next_round)
            elif self.next_round is not None:
                return "restart", self._begin(self.next_round)
            for e in turn():
                if isinstance(e, policy.StopSignal):
                    self.local_cause(self.signal_cause(e.sig))

    def _skip(self, round_: m.RoundStart) -> None:
        """A round stopped before this node began it (a loss just after its start): its workers are all gone."""
        self.round, self.next_round = round_, None
        self.rounds.append(round_)
        self.link.stopped(round_.number)

    def _begin(self, round_: m.RoundStart) -> int:
        self.round, self.next_round = round_, None
        self.plan = self.replan(round_)
        self.attempt = round_.restarts or 0
        self.cause = self.stop_order = None
        self.rounds.append(round_)
        if self.plan.node_rank != 0 or not self.link.says_rounds:  # node 0's membership said it already
            log.info("elastic job: %s; this launcher is node %d", round_.text or f"round {round_.number}",
                     self.plan.node_rank)
        return self.attempt

    def heartbeat_ages(self) -> dict:
        return self.link.heartbeat_ages()

    def health_states(self) -> dict:
        return self.link.health_states()

    def round_events(self) -> list:
        """The round begun last, then each change of the membership since the round before (``event_log``'s)."""
        r = self.round
        events = [{"event": "round", "round": r.number, "nodes": len(r.members or ()), "world_size": r.world_size,
                   "restarts": r.restarts, "why": r.why, "text": r.text}]
        for change in r.changes or ():
            events.append({"event": f"member_{change.kind}", "member": f"node {change.node_id} ({change.host})",
                           "reason": change.reason or None})
        return events

    def final_cause(self) -> Optional[Cause]:
        if self.over is not None:
            if self.over.code == 0:
                return None
            return Cause(self.plan.node_rank, "elastic", self.over.code, self.over.reason)
        return self.cause

    def close(self) -> None:
        self.link.close()
