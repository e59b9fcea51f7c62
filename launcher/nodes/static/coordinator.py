"""One job across attempts and nodes: who decides that it stops, restarts or ends, and with what.

- ``Solo``: a job of one node. The cause of a stop is the local one.
- ``Leader``: node 0 of several. It keeps the control channel's hub, takes the first cause
  reported anywhere as the job's root cause and orders every node to stop; once every node is
  done with an attempt, it decides (``policy.after_attempt``) and orders a restart or the end,
  with the root cause and exit code that every node then shows. In parameter-server mode it
  orders the servers stopped once the trainers of every node that joined are done: a node that
  never joined is not waited for (nothing could use it once the servers stop), and ends the job
  with code 1 if it holds a trainer (that trainer never ran).
- ``Follower`` (``follower``): every other node. It reports its own cause to node 0 and follows node 0's orders;
  if node 0 is lost, it stops on its own and ends with code 1.

Each node's speed (the straggler's search) goes to node 0, which keeps each node's from that node only and sends
them all back to every node at most every SHARE_EVERY seconds; no node of a fixed job leaves as a straggler.

The supervisor calls ``local_cause`` when something happens here, feeds ``on_events`` what the
channel reports (getting back events for the attempt's policy), and calls ``finish_attempt``
once this node's processes of an attempt are all gone.

The channel (``channel.HubChannel`` or ``channel.SpokeChannel``) and the clock (``Clock``) are
given: nothing here opens a socket or reads the time, so that tests replay event histories
against fakes (``job.for_plan`` gives the real ones).
"""

from __future__ import annotations

import signal
from typing import Callable, Optional, Tuple, Union

from launcher.errors import LaunchError
from launcher.nodes.transport import messages
from launcher.nodes.static.channel import Gone, HubChannel, Joined, Received, SpokeChannel
from launcher.output.messages import log
from launcher.plan import policy
from launcher.plan.admission import HEALTH, Verdict, states
from launcher.plan.model import Plan
from launcher.plan.policy import Cause
from launcher.plan.ps import held_by

# How long node 0 waits for a joined node's report at the end of an attempt, beyond the grace
REPORT_MARGIN = 10.0
MAX_IDS_NAMED = 8  # trainers or servers of the nodes that never joined named one by one, at most

Turn = Callable[[], list]  # one turn of the event loop: the policy events it produced
Wait = Callable[[float], list]  # one turn that waits at most until a deadline (monotonic)
START_WAIT = 10.0  # seconds node 0 waits for every node to join and be judged before it starts its own workers
Clock = Callable[[], float]  # monotonic seconds


class Solo:
    history: tuple = ()  # a job of fixed nodes has no rounds
    reform_wait = 0.0  # nor workers kept from one round to the next

    def __init__(self, plan: Plan) -> None:
        self.plan = plan
        self.cause: Optional[Cause] = None
        self.channel: Optional[Union[HubChannel, SpokeChannel]] = None
        self.attempt = 0

    def share_speed(self, own: tuple, now: float) -> None:
        pass

    def gate(self, wait: Wait) -> Optional[int]:
        """Before the first attempt's workers start: None to start them, or the code the job ends with first."""
        return None

    def peer_times(self, now: float) -> tuple:
        return ()

    def straggler_stays(self) -> Optional[str]:
        return "a job of a fixed set of nodes goes on with all of them (--nnodes MIN:MAX makes it elastic)"

    def leave_as_straggler(self, straggler) -> list:
        return []  # no node of a fixed job leaves as a straggler

    def node_label(self) -> str:
        return ""

    def round_events(self) -> list:
        return []

    def heartbeat_ages(self) -> dict:
        return {}

    def health_states(self) -> dict:
        """node -> {check: (state, reason)} of each node's last checkup, where they are judged (node 0); else {}."""
        return {}

    def local_cause(self, cause: Cause) -> None:
        if self.cause is None:
            self.cause = cause

    def revise_cause(self, cause: Cause) -> None:
        """This node's worker failure was not the root cause after all: ``cause`` (of this node) is."""
        if self.cause is not None and self.cause.kind == "worker" and self.cause.node == cause.node:
            self.cause = cause

    def signal_cause(self, sig: int) -> Cause:
        """A stop signal to this node's launcher, as the cause every node shows."""
        name = signal.Signals(sig).name
        where = self.node_label() or "the launcher"
        return Cause(self.plan.node_rank, "signal", 128 + sig, f"{where} received {name}")

    def on_events(self, events) -> list:
        return []

    def trainers_done(self) -> list:
        """Parameter-server mode: this node's trainers all exited 0; the events for this node's policy."""
        return [policy.TrainersDone("every trainer finished")]

    def tick(self, now: float) -> list:
        return []

    def finish_attempt(self, turn: Turn) -> Tuple[str, int]:
        decision = policy.after_attempt(self.attempt, self.plan.max_restarts, self.cause)
        return self._apply(decision)

    def _apply(self, decision) -> Tuple[str, int]:
        what, value = decision
        if what == "restart":
            log.error("%s: restarting the job, attempt %d of %d", self.cause.text, value + 1, self.plan.max_restarts + 1)
            self.attempt, self.cause = value, None
        return decision

    def final_cause(self) -> Optional[Cause]:
        return self.cause

    def close(self) -> None:
        pass


class Peered(Solo):
    """A node of a job of several: its control channel to the others."""

    def __init__(self, plan: Plan, channel, clock: Clock) -> None:
        super().__init__(plan)
        self.channel = channel
        self.clock = clock

    def node_label(self) -> str:
        return f"node {self.plan.node_rank} ({self.plan.node_ip})"

    def tick(self, now: float) -> list:
        return self.on_events(self.channel.tick(now))

    def close(self) -> None:
        self.channel.close()


class Leader(Peered):
    def __init__(self, plan: Plan, channel: HubChannel, clock: Clock, verdict: Optional[Verdict] = None) -> None:
        super().__init__(plan, channel, clock)
        self.verdict = verdict or Verdict()  # node 0's own checkup's (the others' are the hub's ``verdicts``)
        self.started = False  # past the gate: a node that joins now is judged as it joins
        self.gone: set = set()  # nodes lost or never joined: not waited for
        self.reports: dict = {}  # node -> its cause (or None) for the current attempt
        self.trained: set = set()  # parameter-server mode: nodes whose trainers all exited 0 in this attempt
        self.finished = False  # parameter-server mode: every node was told to stop its servers (Finish)
        self.held = held_by(plan) if plan.parameter_server else ()  # per node: (its server ids, its trainer ids)
        self.speeds: dict = {}  # node -> (its speed entry, when it came), from that node only
        self.speeds_shared = float("-inf")

    def share_speed(self, own: tuple, now: float) -> None:
        self._put_speed(0, messages.node_speed(own), now)

    def gate(self, wait: Wait) -> Optional[int]:
        """No worker starts anywhere until every node joined and passed its health checks (or START_WAIT passed:
        node 0 then starts, and a node that joins later is judged as it joins); then each is told to start
        (``Start(0)``). A node that fails them refuses the job: every node is told why (``End`` with code 2, as it
        joins, until every node has or the join timeout) and each exits 2 with that one sentence (raised here as a
        ``LaunchError``). A node lost, or a signal, ends the job before it starts."""
        nodes, told, start_by = set(range(1, len(self.plan.node_ips))), set(), self.clock() + START_WAIT
        while True:
            refusal = self.verdict.refusal or next(
                (v.refusal for _, v in sorted(self.channel.verdicts.items()) if v.refusal), None)
            if refusal is not None:
                end = messages.to_wire(messages.End(0, 2, Cause(0, HEALTH, 2, refusal)))
                for node in self.channel.joined() - told:
                    self.channel.send(node, end)
                    told.add(node)
                if told >= nodes or self.cause is not None:  # every node told, or one never will be
                    raise LaunchError(refusal)
            elif self.cause is not None:
                self.channel.broadcast(messages.to_wire(messages.End(0, self.cause.code, self.cause)))
                return self.cause.code
            elif self.channel.joined() >= nodes or self.clock() >= start_by:
                self.started = True
                self.channel.broadcast(messages.to_wire(messages.Start(0)))
                return None
            for e in wait(start_by if refusal is None else self.clock() + 1.0):
                if isinstance(e, policy.StopSignal):
                    self._root(self.signal_cause(e.sig))

    def _put_speed(self, node: int, entry: Optional[messages.NodeSpeed], now: float) -> None:
        if entry is not None:
            self.speeds[node] = (entry, now)

    def peer_times(self, now: float) -> tuple:
        return messages.others(messages.fresh(self.speeds, now), 0)

    def tick(self, now: float) -> list:
        if self.speeds and now - self.speeds_shared >= messages.SHARE_EVERY:  # every node's entry back to all
            self.speeds_shared = now
            self.channel.broadcast(messages.to_wire(messages.Speeds(messages.fresh(self.speeds, now))))
        return super().tick(now)

    def health_states(self) -> dict:
        judged = {0: self.verdict, **self.channel.verdicts}
        return {str(node): states(v) for node, v in sorted(judged.items())}

    def heartbeat_ages(self) -> dict:
        """Node 0 keeps the heartbeats: seconds since each joined node was last heard, by its node index."""
        return {str(node): age for node, age in sorted(self.channel.heard_ages(self.clock()).items())}

    def local_cause(self, cause: Cause) -> None:
        self._root(cause)

    def _root(self, cause: Cause) -> bool:
        """Take ``cause`` as the attempt's root cause if it is the first; order every node to stop."""
        if self.cause is not None:
            return False
        self.cause = cause
        self.channel.broadcast(messages.to_wire(messages.Stop(self.attempt, cause)))
        return True

    def on_events(self, events) -> list:
        out = []
        for e in events:
            if isinstance(e, Joined) and self.started:
                out += self._late(e.node)
            if isinstance(e, Joined) and self.cause is not None:
                self.channel.send(e.node, messages.to_wire(messages.Stop(self.attempt, self.cause)))
            elif isinstance(e, Joined) and self.finished:  # late, with servers only: they stop too
                self.channel.send(e.node, messages.to_wire(messages.Finish(self.attempt)))
            elif isinstance(e, Gone):
                self.gone.update(e.nodes)
                out += self._stop_for(Cause(e.nodes[0], e.kind, 1, e.reason))
            elif isinstance(e, Received):
                out += self._on_message(e.node, messages.from_wire(e.message))
        return out

    def _late(self, node: int) -> list:
        """A node that joined once this node's workers started: told to start its own if it passed its checks;
        else the job stops on every node with the sentence of its failure (exit 2)."""
        verdict = self.channel.verdicts.get(node)
        if verdict is not None and verdict.refusal is not None:
            return self._stop_for(Cause(node, HEALTH, 2, verdict.refusal))
        if self.cause is None:
            self.channel.send(node, messages.to_wire(messages.Start(0)))
        return []

    def trainers_done(self) -> list:
        return self._trained(0)

    def _trained(self, node: int) -> list:
        """Once the trainers of every node that joined are done (some trainer among them), every node
        stops its servers; a node that never joined is not waited for (nothing could use it once the
        servers stop). If it holds a trainer, that trainer never ran: the job stops with code 1, naming it."""
        if not self.held:  # a collective job: no server to stop (whatever a peer says)
            return []
        self.trained.add(node)
        present = {0} | set(self.channel.ever_joined)
        if self.finished or self.cause is not None or not present <= self.trained \
                or not any(self.held[n][1] for n in present):
            return []
        absent = policy.never_joined(len(self.plan.node_ips), self.channel.ever_joined)
        unrun = [t for n in absent for t in self.held[n][1]]
        if unrun:
            self.gone.update(absent)
            text = (f"{self._names(absent)} never joined, so {_ids('trainer', unrun)} never ran; "
                    f"the trainers of every other node finished")
            return self._stop_for(Cause(absent[0], "join", 1, text))
        self.finished = True
        self.channel.broadcast(messages.to_wire(messages.Finish(self.attempt)))
        return [policy.TrainersDone("every trainer of the job finished")]

    def _names(self, nodes) -> str:
        return ", ".join(self.channel.node_name(n) for n in nodes)

    def _stop_for(self, cause: Cause) -> list:
        return [policy.StopOrdered(cause.text, stacks=cause.kind == "hang")] if self._root(cause) else []

    def _on_message(self, node: int, message: messages.Message) -> list:
        if isinstance(message, messages.Speeds):  # a node speaks for itself only
            self._put_speed(node, next((e for e in message.nodes if e.node == node), None), self.clock())
            return []
        if not isinstance(message, (messages.Failed, messages.TrainersDone, messages.Report)) \
                or message.attempt != self.attempt:
            return []
        if isinstance(message, messages.TrainersDone):
            return self._trained(node)
        if isinstance(message, messages.Report):
            self.reports[node] = message.cause
        return self._stop_for(message.cause) if message.cause is not None else []

    def finish_attempt(self, turn: Turn) -> Tuple[str, int]:
        """Success: wait until every joined node is done; one that never joined is not waited for,
        only named. A failure that ends the job: say so at once. A restart: wait until every joined
        node has stopped (bounded), then order the next attempt."""
        deadline = None
        while True:
            decision = policy.after_attempt(self.attempt, self.plan.max_restarts, self.cause)
            if self.cause is not None and decision[0] == "end":
                return self._end(decision)
            waiting = policy.still_due(self.channel.joined(), self.reports, self.gone)
            if not waiting:
                break
            if self.cause is not None and deadline is None:
                deadline = self.clock() + self.plan.shutdown_timeout + REPORT_MARGIN
            if deadline is not None and self.clock() >= deadline:
                log.warning("no word from %s after the stop; going on without it", self._names(waiting))
                break
            for e in turn():
                if isinstance(e, policy.StopSignal):
                    self._root(self.signal_cause(e.sig))
        if decision[0] == "restart":
            self.channel.broadcast(messages.to_wire(messages.Start(decision[1])))
            self.reports.clear()
            self.trained.clear()
            self.finished = False
            return self._apply(decision)
        return self._end(decision)

    def _end(self, decision) -> Tuple[str, int]:
        absent = policy.never_joined(len(self.plan.node_ips), self.channel.ever_joined)
        unrun = [i for n in absent for i in self.held[n][0]] if self.held else []
        if decision == ("end", 0) and unrun:  # parameter-server mode: nodes with servers only (every trainer ran)
            log.warning("%s never joined, so %s never ran; every trainer of the job finished, so the job ends "
                        "here with exit code 0", self._names(absent), _ids("server", unrun))
        elif decision == ("end", 0) and absent:
            log.warning("%s never joined; this node's workers all finished, so the job ends here with exit code 0",
                        self._names(absent))
        self.channel.broadcast(messages.to_wire(messages.End(self.attempt, decision[1], self.cause)))
        return decision


def _ids(role: str, ids) -> str:
    """``trainer 2``, ``trainers 2, 3``, ``trainers 2, 3, ... (40 in all)``."""
    if len(ids) == 1:
        return f"{role} {ids[0]}"
    shown = ", ".join(map(str, ids[:MAX_IDS_NAMED]))
    return f"{role}s {shown}" + (f", ... ({len(ids)} in all)" if len(ids) > MAX_IDS_NAMED else "")
