"""Each node's speed shared among the nodes of a job of fixed nodes (``messages.Speeds``), by an object its coordinator
holds (``SpeedSharing``). A node sends node 0 its own entry (``Sending``); node 0 keeps each node's entry from that
node only, and sends every node's back to all at most every SHARE_EVERY seconds (``Gathering``), so that each one
judges the whole job. A job of one node shares nothing (``Unshared``)."""

from __future__ import annotations

from typing import Optional, Protocol

from launcher.nodes.static.channel import HubChannel, SpokeChannel
from launcher.nodes.transport import messages


class SpeedSharing(Protocol):
    def share(self, own: tuple, now: float) -> None: ...  # this node's ranks' compute times (``stragglers.RankTime``)

    def heard(self, node: int, message: messages.Speeds, now: float) -> None: ...  # a node's message of speeds

    def tick(self, now: float) -> None: ...  # what is due by ``now``

    def peer_times(self, now: float) -> tuple: ...  # the other nodes' ranks' compute times, as shared with this node


class Unshared:
    """One node: nothing to share."""

    def share(self, own: tuple, now: float) -> None:
        pass

    def heard(self, node: int, message: messages.Speeds, now: float) -> None:
        pass

    def tick(self, now: float) -> None:
        pass

    def peer_times(self, now: float) -> tuple:
        return ()


class Gathering(Unshared):
    """Node 0: every node's entry, from that node only, shared back to every node."""

    def __init__(self, channel: HubChannel) -> None:
        self.channel = channel
        self.entries: dict = {}  # node -> (its entry, when it came)
        self.shared_at = float("-inf")

    def share(self, own: tuple, now: float) -> None:
        self._put(0, messages.node_speed(own), now)

    def heard(self, node: int, message: messages.Speeds, now: float) -> None:
        """A node speaks for itself only: its own entry is kept, the rest of its message left out."""
        self._put(node, next((e for e in message.nodes if e.node == node), None), now)

    def tick(self, now: float) -> None:
        if self.entries and now - self.shared_at >= messages.SHARE_EVERY:
            self.shared_at = now
            self.channel.broadcast(messages.to_wire(messages.Speeds(messages.fresh(self.entries, now))))

    def peer_times(self, now: float) -> tuple:
        return messages.others(messages.fresh(self.entries, now), 0)

    def _put(self, node: int, entry: Optional[messages.NodeSpeed], now: float) -> None:
        if entry is not None:
            self.entries[node] = (entry, now)


class Sending(Unshared):
    """Every other node: its own entry to node 0; every node's, as node 0 last sent them."""

    def __init__(self, channel: SpokeChannel, node: int) -> None:
        self.channel = channel
        self.node = node
        self.entries: tuple = ()  # every node's entry, as node 0 last sent them

    def share(self, own: tuple, now: float) -> None:
        if own:
            self.channel.send(messages.to_wire(messages.Speeds((messages.node_speed(own),))))

    def heard(self, node: int, message: messages.Speeds, now: float) -> None:
        self.entries = message.nodes

    def peer_times(self, now: float) -> tuple:
        return messages.others(self.entries, self.node)
