"""What a run needs of the coordinator across nodes (``launcher.nodes``: Solo, Leader, Follower),
written down as the two interfaces the attempt driver and the event loop use."""

from __future__ import annotations

from typing import Callable, Optional, Protocol, Tuple

from launcher.plan.model import Plan
from launcher.plan.policy import Cause

Turn = Callable[[], list]  # one turn of the event loop: the policy events it produced


class Channel(Protocol):
    """The control channel between the nodes, as the selector loop serves it."""

    def registrations(self) -> dict: ...  # fd -> selector events wanted now

    def next_deadline(self) -> Optional[float]: ...  # when it must be ticked at the latest (monotonic)

    def ready(self, fd: int, mask: int, now: float) -> list: ...  # what came on ``fd``, for ``on_events``


class Coordinator(Protocol):
    """Who decides, across attempts and nodes, that the job stops, restarts or ends, and with what."""

    plan: Plan
    attempt: int  # the attempt this node runs now (0 first)
    channel: Optional[Channel]  # None: one node, nothing to serve
    history: tuple  # an elastic job: each round this node ran, in a line; else ()
    reform_wait: float  # an elastic job: how long a worker that re-enters in place waits for a round's end; else 0

    def node_label(self) -> str: ...  # "node N (ip)" in a job of several nodes, else ""

    def local_cause(self, cause: Cause) -> None: ...  # this node found a cause to stop

    def signal_cause(self, sig: int) -> Cause: ...  # a stop signal to this launcher, as the cause every node shows

    def revise_cause(self, cause: Cause) -> None: ...  # this node's worker failure was not the root cause

    def on_events(self, events) -> list: ...  # the channel's events -> events for this node's policy

    def tick(self, now: float) -> list: ...  # the channel's deadlines -> events for this node's policy

    def trainers_done(self) -> list: ...  # parameter-server mode: this node's trainers all exited 0

    def gate(self, wait: Callable[[float], list]) -> Optional[int]: ...  # first workers: None to start, or a code

    def finish_attempt(self, turn: Turn) -> Tuple[str, int]: ...  # ("restart", attempt) or ("end", code)

    def final_cause(self) -> Optional[Cause]: ...  # the root cause every node shows at the end

    def round_events(self) -> list: ...  # an elastic job: the event log's events of the round begun last; else []

    def heartbeat_ages(self) -> dict: ...  # node id -> seconds since last heard, where this node keeps the heartbeats

    def health_states(self) -> dict: ...  # node id -> {check: (state, reason)}, where this node judges the checkups

    def share_speed(self, own: tuple, now: float) -> None: ...  # this node's ranks' compute times, for the other nodes

    def peer_times(self, now: float) -> tuple: ...  # the other nodes' ranks' compute times, as shared with this node

    def straggler_stays(self) -> Optional[str]: ...  # why this node may not leave as a straggler (None: it may)

    def leave_as_straggler(self, straggler) -> list: ...  # this node leaves, named a straggler: its policy's events

    def close(self) -> None: ...
