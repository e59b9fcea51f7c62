"""Each node's speed shared among the nodes of a job of fixed nodes (``launcher.plan.stragglers``): what the
coordinators (``coordinator``) add to their part, as mixins. A node sends node 0 its own entry (``Speeds``), at most
every SHARE_EVERY seconds; node 0 keeps each node's entry from that node only, and sends every node's back to all, so
that each one judges the whole job. A job of one node shares nothing, and no node of a fixed job leaves as a
straggler."""

from __future__ import annotations

from typing import Optional

from launcher.nodes.transport import messages
from launcher.plan import stragglers


class Unshared:
    """One node: nothing to share; and the straggler's policy of a job of fixed nodes."""

    def share_speed(self, own: tuple, now: float) -> None:
        """This node's ranks' compute times (``stragglers.RankTime``), for the other nodes."""

    def peer_times(self, now: float) -> tuple:
        """The other nodes' ranks' compute times, as last shared with this node."""
        return ()

    def straggler_stays(self) -> Optional[str]:
        """Why this node may not leave the job as a straggler (``--straggler_policy leave``), or None."""
        return "a job of a fixed set of nodes goes on with all of them (--nnodes MIN:MAX makes it elastic)"

    def leave_as_straggler(self, straggler) -> list:
        """This node, named a straggler, leaves the job: the events for its policy (an elastic job's only)."""
        return []


class Gathering(Unshared):
    """Node 0: every node's entry, by the node that sent it (``heard``), shared back to every node."""

    def share_speed(self, own: tuple, now: float) -> None:
        self.speeds.put(0, stragglers.node_speed(own), now)
        if self.speeds.entries and self.speeds.due(now):
            self.channel.broadcast(messages.to_wire(messages.Speeds(self.speeds.fresh(now))))

    def peer_times(self, now: float) -> tuple:
        return stragglers.others(self.speeds.fresh(now), 0)

    def heard(self, node: int, message: messages.Speeds, now: float) -> None:
        """A node's message of speeds: its own entry only (a node speaks for itself)."""
        self.speeds.put(node, next((e for e in message.nodes if e.node == node), None), now)


class Sending(Unshared):
    """Every other node: its own entry to node 0, every node's as node 0 last sent them."""

    speeds: tuple = ()  # every node's entry, as node 0 last sent them
    sending: stragglers.Every  # the coordinator's own

    def share_speed(self, own: tuple, now: float) -> None:
        if own and self.sending.due(now):
            self.channel.send(messages.to_wire(messages.Speeds((stragglers.node_speed(own),))))

    def peer_times(self, now: float) -> tuple:
        return stragglers.others(self.speeds, self.plan.node_rank)
