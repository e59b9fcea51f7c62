"""Every node of a job of fixed nodes but node 0 (``coordinator`` holds node 0's ``Leader``): it reports its own cause
to node 0 and follows node 0's orders; if node 0 is lost, it stops on its own and ends with code 1."""

from __future__ import annotations

from typing import Optional, Tuple, Union

from launcher.errors import LaunchError
from launcher.nodes.static.channel import Gone, Joined, Received, SpokeChannel
from launcher.nodes.static.coordinator import Clock, Peered, Turn, Wait
from launcher.nodes.transport import messages
from launcher.output.messages import log
from launcher.plan import policy
from launcher.plan.admission import HEALTH
from launcher.plan.model import Plan
from launcher.plan.policy import Cause


class Follower(Peered):
    def __init__(self, plan: Plan, channel: SpokeChannel, clock: Clock) -> None:
        super().__init__(plan, channel, clock)
        self.root: Optional[Cause] = None  # node 0's word on why the attempt stopped
        self.order: Optional[Union[messages.Start, messages.End]] = None  # node 0's order for this attempt
        self.alone = False  # node 0 is lost or never answered
        self.reporting = False  # this node's part of the attempt is over: its report is due
        self.trained = False  # parameter-server mode: this node's trainers are done (told node 0)
        self.speeds: tuple = ()  # every node's speed entry, as node 0 last shared them
        self.go = False  # node 0 said to start the first attempt: every node joined and passed its checks

    def share_speed(self, own: tuple, now: float) -> None:
        if own:
            self.channel.send(messages.to_wire(messages.Speeds((messages.node_speed(own),))))

    def peer_times(self, now: float) -> tuple:
        return messages.others(self.speeds, self.plan.node_rank)

    def local_cause(self, cause: Cause) -> None:
        if self.cause is None:
            self.cause = cause
            self.channel.send(messages.to_wire(messages.Failed(self.attempt, cause)))

    def trainers_done(self) -> list:
        self.trained = True
        self.channel.send(messages.to_wire(messages.TrainersDone(self.attempt)))
        return []

    def _report(self) -> None:
        self.channel.send(messages.to_wire(messages.Report(self.attempt, self.cause)))

    def on_events(self, events) -> list:
        out = []
        for e in events:
            if isinstance(e, Joined):
                self._say_again()
            elif isinstance(e, Gone):
                self.alone = True
                cause = Cause(0, e.kind, 1, e.reason)
                self.root = self.root or cause
                if self.cause is None:
                    self.cause = cause
                out.append(policy.StopOrdered(e.reason))
            elif isinstance(e, Received):
                out += self._on_message(messages.from_wire(e.message))
        return out

    def _say_again(self) -> None:
        """What was said before node 0 answered went nowhere (the channel drops it): say it now, in the
        order it happened. Node 0 counts a node's trainers done only on TrainersDone (a report does not
        say it): a parameter-server node that left it out would keep every server of the job running."""
        if self.trained:
            self.channel.send(messages.to_wire(messages.TrainersDone(self.attempt)))
        if self.reporting:
            self._report()
        elif self.cause is not None:
            self.channel.send(messages.to_wire(messages.Failed(self.attempt, self.cause)))

    def gate(self, wait: Wait) -> Optional[int]:
        """No worker starts here before node 0 says so (every node joined and passed its health checks). Node 0's
        refusal of the job on a failed check: a ``LaunchError`` with its one sentence (exit 2, as on every node);
        node 0 lost, never answered, or another end: the code to end with."""
        while not self.go:
            if isinstance(self.order, messages.End):
                order, self.order = self.order, None
                if order.cause is not None and order.cause.kind == HEALTH:
                    raise LaunchError(order.cause.text)
                self.root = order.cause or self.root
                return order.code
            if self.alone:
                return self.final_cause().code
            stopped = self._stopped_by_signal(wait(self.clock() + 1.0))
            if stopped is not None:
                return stopped[1]
        return None

    def _on_message(self, message: messages.Message) -> list:
        if isinstance(message, messages.Speeds):
            self.speeds = message.nodes
            return []
        if isinstance(message, messages.Start) and message.attempt == 0:
            self.go = True
            return []
        if isinstance(message, messages.End) or (isinstance(message, messages.Start)
                                                 and message.attempt == self.attempt + 1):
            self.order = message
            return []
        if isinstance(message, messages.Finish) and message.attempt == self.attempt:
            return [policy.TrainersDone("every trainer of the job finished")]
        if isinstance(message, messages.Stop) and message.attempt == self.attempt:
            if message.cause is not None and self.root is None:
                self.root = message.cause
                return [policy.StopOrdered(message.cause.text, stacks=message.cause.kind == "hang")]
        return []

    def finish_attempt(self, turn: Turn) -> Tuple[str, int]:
        self.reporting = True
        try:
            return self._await_order(turn)
        finally:
            self.reporting = False

    def _await_order(self, turn: Turn) -> Tuple[str, int]:
        if self.cause is None and not self.channel.welcomed:
            stopped = self._await_welcome(turn)
            if stopped is not None:
                return stopped
            if not self.channel.welcomed:  # node 0 never answered: nothing here waits for it
                log.warning("%s never answered within %g s; this node's workers all finished, so the job ends here "
                            "with exit code 0", self.channel.node_name(0), self.plan.control.heartbeat_timeout)
                return "end", 0
        else:
            self._report()  # (a node welcomed while it waited has reported on joining)
        while self.order is None and not self.alone:
            stopped = self._stopped_by_signal(turn())
            if stopped is not None:
                return stopped
        if self.order is None:  # node 0 is gone: end with what is known here
            known = self.final_cause()
            return "end", known.code if known else 1
        order, self.order = self.order, None
        if isinstance(order, messages.Start):
            self.attempt, self.cause, self.root, self.trained = order.attempt, None, None, False
            log.info("node 0 restarts the job: attempt %d of %d", self.attempt + 1, self.plan.max_restarts + 1)
            return "restart", self.attempt
        self.root = order.cause or self.root
        return "end", order.code

    def _await_welcome(self, turn: Turn) -> Optional[Tuple[str, int]]:
        """This node's workers are done and node 0 has not answered yet: it gets the heartbeat timeout to do
        so (a node 0 still starting on a busy machine would otherwise count this node as one that never
        joined, and its trainers as never run). ("end", code) when a signal stops the wait."""
        deadline = self.clock() + self.plan.control.heartbeat_timeout
        while not self.channel.welcomed and not self.alone and self.clock() < deadline:
            stopped = self._stopped_by_signal(turn())
            if stopped is not None:
                return stopped
        return None

    def _stopped_by_signal(self, events) -> Optional[Tuple[str, int]]:
        for e in events:
            if isinstance(e, policy.StopSignal):
                self.local_cause(self.signal_cause(e.sig))
                self.root = self.root or self.cause
                return "end", self.cause.code
        return None

    def final_cause(self) -> Optional[Cause]:
        return self.root or self.cause
