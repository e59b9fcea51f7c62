"""Node 0's table of each member's speed entry (``messages.NodeSpeed``) in a c10d elastic job: an entry kept only when
it is of the running round and of that member's seat in it, and every fresh entry shared back with all members at
most every ``messages.SHARE_EVERY`` seconds of node 0's clock."""

from __future__ import annotations

from typing import Optional

from launcher.nodes.elastic.model import Round
from launcher.nodes.transport import messages as m


class SpeedTable:
    def __init__(self) -> None:
        self.entries: dict = {}  # node id -> (its speed entry, when it came)
        self.shared = float("-inf")

    def take(self, node_id: str, entry, round_: Optional[Round], now: float) -> None:
        seat = round_.member(node_id) if round_ is not None else None
        if entry is not None and seat is not None and entry.round == round_.number and entry.node == seat.node_rank:
            self.entries[node_id] = (entry, now)

    def forget(self, node_id) -> None:
        self.entries.pop(node_id, None)

    def due(self, round_: Optional[Round], now: float) -> Optional[tuple]:
        """The entries of the running round to share now (None: none, or shared less than SHARE_EVERY ago)."""
        if round_ is None or not self.entries or now - self.shared < m.SHARE_EVERY:
            return None
        self.shared = now
        return m.fresh(self.entries, now, round_.number)
