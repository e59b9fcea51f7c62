"""The straggler's search on this node (``launcher.plan.stragglers``, pure): each rank's compute time as its reports
carry it (``launcher.runtime.report``), gathered as the event loop reads the progress pages; compared about every
LOOK_EVERY seconds among this node's ranks and the other nodes' (as the job shares them, this node's at most every
SHARE_EVERY seconds: the control channel, the elastic membership; and the monitor's views, fetched while a page of
``--monitor_port`` watches); a node newly found slow named in the log (one warning) and in the event log
(``straggler``), and one no longer slow said so (``straggler_cleared``)."""

from __future__ import annotations

from typing import Iterable, Optional, Tuple

from launcher.nodes.transport.messages import SHARE_EVERY
from launcher.output.messages import log
from launcher.plan import stragglers

LOOK_EVERY = 1.0  # seconds between two comparisons


class StragglerWatch:
    def __init__(self, settings: stragglers.Settings = stragglers.Settings()) -> None:
        self.settings = settings
        self.windows: dict = {}  # rank -> stragglers.Window (this node's ranks)
        self.verdict = stragglers.Verdict()
        self.named: dict = {}  # node -> the Straggler it was named as
        self.looked = float("-inf")
        self.shared = float("-inf")  # when this node's ranks last went to the other nodes

    def note(self, rank: int, node: int, host: str, report: Optional[dict], now: float) -> None:
        """A new report of ``rank`` (a worker of this node): its compute time, where it has one, into its window."""
        if report is None or report.get("step") is None or report.get("compute") is None:
            return
        self.windows = stragglers.add(self.windows, rank, node, host, report["step"], report["compute"], now,
                                      self.settings)

    def due(self, now: float) -> bool:
        return now - self.looked >= LOOK_EVERY

    def own(self, now: float) -> Tuple[stragglers.RankTime, ...]:
        """This node's ranks with a full window, heard from lately."""
        return stragglers.summarize(self.windows, now, self.settings)

    def to_share(self, now: float) -> Tuple[stragglers.RankTime, ...]:
        """This node's ranks for the other nodes, when they are due (at most every SHARE_EVERY seconds); else ()."""
        own = self.own(now)
        if not own or now - self.shared < SHARE_EVERY:
            return ()
        self.shared = now
        return own

    def compute(self, rank: int, now: float) -> Optional[float]:
        """``rank``'s compute time (seconds per step, over its window), once its window is full."""
        return next((t.compute for t in self.own(now) if t.rank == rank), None)

    def look(self, now: float, peers: Iterable[stragglers.RankTime], events) -> Tuple[stragglers.Straggler, ...]:
        """Compare this node's ranks and ``peers`` (other nodes' ranks); name what changed. The stragglers named now."""
        self.looked = now
        self.verdict = stragglers.judge(self.own(now) + tuple(peers), self.verdict.below, self.settings, now)
        new, gone = stragglers.changes(self.named, self.verdict, self.settings)
        for straggler in new:
            self.named[straggler.node] = straggler
            log.warning("straggler: %s", straggler.reason)
            events.write("straggler", node=straggler.node, host=straggler.host, ranks=list(straggler.ranks),
                         speed=round(straggler.speed, 3), reason=straggler.reason,
                         compared_nodes=len(self.verdict.nodes), compared_ranks=self.verdict.compared)
        for node in gone:
            was = self.named.pop(node)
            speed = self.verdict.nodes.get(node)
            log.info("straggler: node %d (%s) is no longer one%s", node, was.host,
                     f" (its speed: {speed:.2f} of the fastest rank's)" if speed is not None else "")
            events.write("straggler_cleared", node=node, host=was.host,
                         speed=round(speed, 3) if speed is not None else None)
        return new

    def reset(self) -> None:
        """A new round of an elastic job: its ranks are others; every window starts afresh (names stay until cleared)."""
        self.windows = {}
        self.verdict = stragglers.Verdict()


def peer_times(rows: Iterable[dict], own_node: int) -> Tuple[stragglers.RankTime, ...]:
    """The other nodes' ranks' compute times, from their views as the monitor fetched them (``monitor_view.peer_view``:
    already checked field by field)."""
    return tuple(stragglers.RankTime(w["rank"], row["node"], row.get("node_ip", ""), w["compute_seconds"], w.get("step") or 0)
                 for row in rows if not row.get("error") and row.get("node") != own_node
                 for w in row.get("workers", ()) if w.get("compute_seconds") is not None)
