"""The model of an elastic job's membership, shared by the rules, every backend and the coordinator: who a
launcher is (``Node``), its place in a round (``Member``), a round (``Round``), and the events the rules
take and the actions they return. Frozen dataclasses, never positional lists; nothing here decides."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping, Optional, Union

from launcher.nodes.transport import messages as m
from launcher.plan.policy import Say


# ---------------------------------------------------------------- who


@dataclass(frozen=True)
class Node:
    """A launcher of the job as it introduced itself: an id it made (unique to that launcher's run),
    its host, its number of workers."""

    node_id: str
    host: str
    workers: int

    @property
    def label(self) -> str:
        return f"node {self.node_id} ({self.host})"


@dataclass(frozen=True)
class Member:
    node: Node
    node_rank: int
    first_rank: int  # the global rank of its local rank 0


@dataclass(frozen=True)
class Round:
    """One round of the job, as every node starts it and the console and ``launcher status`` show it."""

    number: int  # 1, 2, ...
    members: tuple  # Member, by node rank
    world_size: int
    why: str  # what ended the round before: "start" (none), "lost", "joined", "restart"
    joined: tuple = ()  # Node: those not in the round before
    left: tuple = ()  # (Node, reason): those lost since the round before
    restarts: int = 0  # worker failures spent so far (TORCHELASTIC_RESTART_COUNT)

    def member(self, node_id: str) -> Optional[Member]:
        return next((m for m in self.members if m.node.node_id == node_id), None)


def describe(round_: Round) -> str:
    """A round in one line, for every node's console and log."""
    parts = [f"round {round_.number} ({round_.why}): {len(round_.members)} node(s), world size {round_.world_size}"]
    if round_.left:
        parts.append("left: " + ", ".join(f"{node.label} ({reason})" for node, reason in round_.left))
    if round_.joined and round_.number > 1:
        parts.append("joined: " + ", ".join(node.label for node in round_.joined))
    return "; ".join(parts)


# ---------------------------------------------------------------- events


@dataclass(frozen=True)
class JoinAsked:
    node: Node
    job_id: str  # the job it says it belongs to


@dataclass(frozen=True)
class Heartbeat:
    node_id: str = ""
    at: Optional[Mapping[str, float]] = None  # many heartbeats in one event: node id -> when node 0 heard it


@dataclass(frozen=True)
class Closed:
    node_id: str  # its connection to node 0 closed (with etcd: its key is gone)
    reason: str = "its connection closed"


@dataclass(frozen=True)
class WorkersStopped:
    node_id: str
    round: int  # its workers of this round are all gone


@dataclass(frozen=True)
class RoundDone:
    node_id: str
    round: int  # its workers of this round all finished (exit code 0)


@dataclass(frozen=True)
class WorkerFailed:
    node_id: str
    round: int
    code: int  # the exit code the job ends with if it cannot restart
    reason: str  # one sentence: which worker, how


@dataclass(frozen=True)
class JobEnded:
    code: int  # the job is over (its workers finished, or node 0 was told to stop)
    reason: str


@dataclass(frozen=True)
class TimePassed:
    pass  # a deadline of the state may have come


Event = Union[JoinAsked, Heartbeat, Closed, WorkersStopped, RoundDone, WorkerFailed, JobEnded, TimePassed]


# ---------------------------------------------------------------- actions


@dataclass(frozen=True)
class Admit:
    node_id: str
    standby: bool = False  # a standby waits for a member's place; a member waits for the next round


@dataclass(frozen=True)
class Refuse:
    node_id: str
    reason: str


@dataclass(frozen=True)
class Drop:
    """Node 0 counts this node out: it closes its connection, and that launcher stops its workers and ends."""

    node_id: str
    code: int
    reason: str


@dataclass(frozen=True)
class StopWorkers:
    round: int
    nodes: tuple  # node ids, by node rank: the round's members still in the job
    reason: str


@dataclass(frozen=True)
class StartRound:
    round: Round  # to each of its members


@dataclass(frozen=True)
class EndJob:
    code: int
    reason: str
    nodes: tuple  # node ids: every member and standby


Action = Union[Admit, Refuse, Drop, StopWorkers, StartRound, EndJob, Say]


def round_start(round_: Round) -> m.RoundStart:
    """The round as the message every member gets (the same from every backend)."""
    seats = tuple(m.Seat(x.node.node_id, x.node.host, x.node.workers, x.node_rank, x.first_rank)
                  for x in round_.members)
    return m.RoundStart(round_.number, seats, round_.world_size, round_.restarts, describe(round_))
