"""The model of an elastic job's membership, shared by the rules, every backend and the coordinator: who a
launcher is (``Node``), its place in a round (``Member``), a round (``Round``), and the events the rules
take and the actions they return, and the membership's state (``State``). Frozen dataclasses, never positional
lists; nothing here decides."""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property
from typing import Mapping, Optional, Tuple, Union

from launcher.nodes.elastic.persistent import PMap, PSet, Row
from launcher.nodes.transport import messages as m
from launcher.plan.admission import UNHEALTHY
from launcher.plan.elastic import ElasticSpec
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
        return self.seats.get(node_id)

    @cached_property
    def seats(self) -> dict:
        """node id -> Member, made once per round (the first of an id, as a scan would find it)."""
        return {m.node.node_id: m for m in reversed(self.members)}


def describe(round_: Round) -> str:
    """A round in one line, for every node's console and log."""
    sizes = [m.node.workers for m in round_.members]
    mixed = f" (workers per node: {', '.join(map(str, sizes))})" if len(set(sizes)) > 1 else ""
    parts = [f"round {round_.number} ({round_.why}): {len(round_.members)} node(s), world size {round_.world_size}{mixed}"]
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
    unfit: Optional[str] = None  # node 0's sentence on its health checkup (``admission``): not admitted


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
    unfit: Optional[str] = None  # the member's checkup after the failure failed: it leaves, no restart spent
    checkup: object = field(default=None, compare=False)  # that checkup as sent, for the keeper to judge (etcd)


@dataclass(frozen=True)
class Checked:
    node_id: str  # a standby (or a member set aside) checked itself again
    unfit: Optional[str] = None  # why it is still unfit; None: it passed


@dataclass(frozen=True)
class JobEnded:
    code: int  # the job is over (its workers finished, or node 0 was told to stop)
    reason: str


@dataclass(frozen=True)
class TimePassed:
    pass  # a deadline of the state may have come


Event = Union[JoinAsked, Heartbeat, Closed, WorkersStopped, RoundDone, WorkerFailed, Checked, JobEnded, TimePassed]


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
class KeepOut:
    """A launcher that failed its health checks: not admitted (it checks again and asks again), or set aside
    (``admitted``: a standby not promoted, a member out of the job; it stays, checking again)."""

    node_id: str
    reason: str
    admitted: bool = False


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


Action = Union[Admit, Refuse, KeepOut, Drop, StopWorkers, StartRound, EndJob, Say]


def round_start(round_: Round) -> m.RoundStart:
    """The round as the message every member gets (the same from every backend)."""
    seats = tuple(m.Seat(x.node.node_id, x.node.host, x.node.workers, x.node_rank, x.first_rank)
                  for x in round_.members)
    changes = tuple(m.Change(node.node_id, node.host, change_kind(reason), reason) for node, reason in round_.left)
    if round_.number > 1:
        changes += tuple(m.Change(node.node_id, node.host, "joined", "") for node in round_.joined)
    return m.RoundStart(round_.number, seats, round_.world_size, round_.restarts, describe(round_), changes, round_.why)


SILENT = "no heartbeat for"  # how the rules begin the reason of a member lost by its silence
LEAVES = "it leaves the job"  # and end that of a member that left (--elastic_level 0)
STRAGGLES = "it leaves as a straggler"  # in the reason of a member that left, named a straggler (--straggler_policy)
UNWELL = "it leaves the job unhealthy"  # in the reason of a member whose checks failed after a worker failure


def change_kind(reason: str) -> str:
    """How a member went, from the reason the rules gave: "silent", "unhealthy", "straggler", "left", else "lost"."""
    if reason.startswith(SILENT):
        return "silent"
    if UNWELL in reason:
        return UNHEALTHY
    if LEAVES in reason:
        return "straggler" if STRAGGLES in reason else "left"
    return "lost"


# ---------------------------------------------------------------- the membership's state

WAITING = "waiting"  # no round runs: before the first, or fewer than MIN nodes are left
REFORMING = "reforming"  # the last round's members are stopping their workers; the next round follows
RUNNING = "running"
ENDED = "ended"


@dataclass(frozen=True)
class State:
    spec: ElasticSpec
    keeper: str  # node 0's id
    job_id: str
    phase: str = WAITING
    members: Row = ()  # Node, in the order of the running round, or of the next one
    standbys: Row = ()  # Node, in the order they came
    heard: Mapping[str, float] = field(default_factory=dict)  # node id -> when node 0 last heard it (all but node 0)
    rounds: tuple = ()  # every round started, the current one last
    unstopped: PSet = frozenset()  # ids of the last round's members still stopping its workers
    stop_began: Optional[float] = None
    why: str = "start"  # what the next round is formed for
    left: tuple = ()  # (Node, reason): lost since the last round started
    restarts: int = 0
    wait_began: Optional[float] = None  # WAITING: when the wait for MIN nodes began
    min_reached: Optional[float] = None  # WAITING: when the MIN-th node came (the last call runs from here)
    end: Optional[Tuple[int, str]] = None  # ENDED: the code and reason
    done: PSet = frozenset()  # RUNNING: ids of the members whose workers of the round all finished
    failure: Optional[tuple] = None  # (WorkerFailed, when): a failure whose verdict waits for a loss
    aside: PSet = frozenset()  # ids of the standbys set aside: their last health checkup failed (never promoted)
    index: Optional[tuple] = field(default=None, compare=False, repr=False)  # (members, standbys, PMap id -> Node)

    def __post_init__(self) -> None:
        """Fields given as tuples, a dict, sets (a state made outside, such as a record read back from etcd)
        become the persistent containers, once (O(N)); the index of the ids known is made again unless it is of
        these very members and standbys (a state made here passes it on, changed in O(1)). Node 0's silence is
        never judged: a record read back from etcd, or taken over, has it in ``heard``; it goes."""
        for name, kind in (("members", Row), ("standbys", Row), ("heard", PMap), ("unstopped", PSet), ("done", PSet),
                           ("aside", PSet)):
            if type(getattr(self, name)) is not kind:
                object.__setattr__(self, name, kind(getattr(self, name)))
        object.__setattr__(self, "heard", self.heard.update(gone=(self.keeper,)))
        if self.index is None or self.index[0] is not self.members or self.index[1] is not self.standbys:
            known = PMap((n.node_id, n) for n in reversed(self.members + self.standbys))  # the first of an id wins
            object.__setattr__(self, "index", (self.members, self.standbys, known))

    @property
    def round(self) -> Optional[Round]:
        return self.rounds[-1] if self.rounds else None

    def known(self, node_id: str) -> Optional[Node]:
        try:
            return self.index[2].get(node_id)
        except TypeError:  # an id off the wire that is not a name: no node's
            return None
