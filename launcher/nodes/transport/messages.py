"""The messages between the launchers of one job, as frozen dataclasses, with their one
encode/decode pair: ``to_wire`` (a message as the JSON object the channel sends) and
``from_wire`` (a JSON object off the wire, already bounded by ``wire.decode``, as a message).

``from_wire`` never raises: a field of a wrong type reads as None (or, for an end's code, as 1),
an unknown type as ``Unknown``, so each handler decides on typed values only. The objects
``to_wire`` makes are byte for byte those of earlier versions (same keys, same order).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, fields
from typing import Callable, ClassVar, Optional, Union

from launcher.nodes.transport.values import as_attempt, as_code, as_flag, as_strict_int, as_text, as_texts
from launcher.plan.policy import Cause
from launcher.plan.stragglers import NodeSpeed, read_speeds

LISTED_NODES = 256  # a job of more nodes names them in its hello by their digest


@dataclass(frozen=True)
class Identity:
    """What makes two launchers parts of the same job."""

    job_id: str
    nodes: tuple
    ports: tuple
    script: str

    def as_dict(self) -> dict:
        """For the hello; a long node list as its digest, so that the hello of a job of 10,000
        nodes still fits one message (both ends make the same)."""
        nodes = list(self.nodes)
        if len(nodes) > LISTED_NODES:
            nodes = "sha256:" + hashlib.sha256("\n".join(nodes).encode()).hexdigest()
        return {"job_id": self.job_id, "nodes": nodes, "ports": list(self.ports), "script": self.script}

    def mismatch(self, other) -> Optional[str]:
        """What differs in a peer's identity (a dict from the wire), or None."""
        if not isinstance(other, dict):
            return "no job identity"
        for name in ("job_id", "nodes", "ports", "script"):
            mine = self.as_dict()[name]
            if other.get(name) != mine:
                return f"its {name} is {other.get(name)!r}, this job's is {mine!r}"
        return None


# ---------------------------------------------------------------- the handshake and heartbeats


@dataclass(frozen=True)
class Challenge:
    """A server to a new connection: prove the job token on this nonce (``handshake``)."""

    type: ClassVar[str] = "challenge"
    nonce: Optional[str]


@dataclass(frozen=True)
class Hello:
    """A joining node to node 0, after its challenge. ``node`` and ``proof`` are as sent (node 0 checks them and
    names a wrong value in its refusal); ``proof`` is left out without a job token."""

    type: ClassVar[str] = "hello"
    identity: Optional[dict]
    node: object
    nonce: Optional[str]
    proof: object = None
    node_id: Optional[str] = None  # an elastic job's: the id this launcher made, its host, its workers
    host: Optional[str] = None
    workers: Optional[int] = None


@dataclass(frozen=True)
class Welcome:
    type: ClassVar[str] = "welcome"
    proof: Optional[str] = None  # with a job token: the server's proof on the client's nonce


@dataclass(frozen=True)
class Refusal:
    type: ClassVar[str] = "refused"
    reason: Optional[str]
    proof: Optional[str] = None


@dataclass(frozen=True)
class Beat:
    type: ClassVar[str] = "beat"


# ---------------------------------------------------------------- a node to node 0


@dataclass(frozen=True)
class Failed:
    """A cause to stop found on a node: node 0 takes the first as the attempt's root cause."""

    type: ClassVar[str] = "failed"
    attempt: Optional[int]
    cause: Optional[Cause]


@dataclass(frozen=True)
class Report:
    """A node's part of an attempt is over, with its cause (None: its workers all finished)."""

    type: ClassVar[str] = "report"
    attempt: Optional[int]
    cause: Optional[Cause]


@dataclass(frozen=True)
class TrainersDone:
    """Parameter-server mode: this node's trainers all exited 0."""

    type: ClassVar[str] = "trainers_done"
    attempt: Optional[int]


# ---------------------------------------------------------------- node 0's orders


@dataclass(frozen=True)
class Stop:
    type: ClassVar[str] = "stop"
    attempt: Optional[int]
    cause: Optional[Cause]


@dataclass(frozen=True)
class Finish:
    """Parameter-server mode: every trainer of the job finished; stop the servers."""

    type: ClassVar[str] = "finish"
    attempt: Optional[int]


@dataclass(frozen=True)
class Start:
    type: ClassVar[str] = "start"
    attempt: Optional[int]  # strictly an int on the wire, else None


@dataclass(frozen=True)
class End:
    type: ClassVar[str] = "end"
    attempt: Optional[int]
    code: int  # off the wire: 1 unless an int of 0 to 255
    cause: Optional[Cause]


# ---------------------------------------------------------------- an elastic job's membership


@dataclass(frozen=True)
class Admitted:
    """Node 0 to a launcher of an elastic job it welcomed: it is in (a standby waits for a member's place)."""

    type: ClassVar[str] = "admitted"
    standby: Optional[bool]


@dataclass(frozen=True)
class Seat:
    """A member's place in a round, as the round's message carries it (on the wire: a list of the five)."""

    node_id: str
    host: str
    workers: int
    node_rank: int
    first_rank: int  # the global rank of its local rank 0

    def as_list(self) -> list:
        return [self.node_id, self.host, self.workers, self.node_rank, self.first_rank]


@dataclass(frozen=True)
class Change:
    """A change of the membership since the round before (on the wire: a list of the four): a node ``joined``, or was
    ``lost`` (its process or connection gone), ``silent`` (no heartbeat), ``left`` (it said it leaves), or ``straggler``
    (it left, named a straggler: ``--straggler_policy leave``)."""

    node_id: str
    host: str
    kind: str
    reason: str

    def as_list(self) -> list:
        return [self.node_id, self.host, self.kind, self.reason]


CHANGE_KINDS = ("joined", "lost", "silent", "left", "straggler")


@dataclass(frozen=True)
class RoundStart:
    """The keeper to each member: the round to start, its members' seats (None off the wire: not a list of
    seats)."""

    type: ClassVar[str] = "round"
    number: Optional[int]
    members: Optional[tuple]  # Seat
    world_size: Optional[int]
    restarts: Optional[int]
    text: Optional[str] = None  # the round in one line (membership.describe), for every node's console
    changes: Optional[tuple] = None  # Change: the membership's since the round before (the event log's)
    why: Optional[str] = None  # what ended the round before: "start", "lost", "joined", "restart"


@dataclass(frozen=True)
class StopWorkers:
    """Node 0 to each member: stop this round's workers (a membership change)."""

    type: ClassVar[str] = "stop_workers"
    round: Optional[int]
    reason: Optional[str] = None


@dataclass(frozen=True)
class Stopped:
    """A member to node 0: its workers of this round are all gone."""

    type: ClassVar[str] = "stopped"
    round: Optional[int]


@dataclass(frozen=True)
class RoundDone:
    """A member to node 0: its workers of this round all finished (exit code 0)."""

    type: ClassVar[str] = "round_done"
    round: Optional[int]


@dataclass(frozen=True)
class RoundFailed:
    """A member to node 0: a cause to stop found there while the round ran (a worker failed, a start, a hang)."""

    type: ClassVar[str] = "round_failed"
    round: Optional[int]
    code: int  # off the wire: 1 unless an int of 0 to 255
    reason: Optional[str]


@dataclass(frozen=True)
class Leaving:
    """A member to node 0: its launcher ends (a stop signal): it left the job, it is not lost."""

    type: ClassVar[str] = "leaving"
    reason: Optional[str]


@dataclass(frozen=True)
class Dropped:
    """Node 0 to a launcher it counts out of the job: end with ``code``, saying ``reason``."""

    type: ClassVar[str] = "dropped"
    code: int  # off the wire: 1 unless an int of 0 to 255
    reason: Optional[str]


# ---------------------------------------------------------------- each node's speed (``launcher.plan.stragglers``)


@dataclass(frozen=True)
class Speeds:
    """A node to the node that gathers them (node 0; an elastic job's keeper): its own entry; and back to every node:
    every node's, so that each one judges the whole job. A receiver trusts an entry of a node only from that node."""

    type: ClassVar[str] = "speeds"
    nodes: tuple  # NodeSpeed (off the wire, what is not one is left out)


# ---------------------------------------------------------------- gathering an MPI job's node list (``gather``)


@dataclass(frozen=True)
class Join:
    """An MPI rank's hello to rank 0: its rank, the number of ranks, its address; ``proof`` with a job token."""

    type: ClassVar[str] = "join"
    rank: Optional[int]  # strictly ints on the wire, else None
    size: Optional[int]
    address: Optional[str]
    nonce: Optional[str]
    proof: Optional[str] = None


@dataclass(frozen=True)
class NodeList:
    """Rank 0's answer after its welcome: every node's address in MPI rank order (None off the wire: not a list of
    text)."""

    type: ClassVar[str] = "nodes"
    nodes: Optional[list]


@dataclass(frozen=True)
class Unknown:
    """A message of a type no launcher sends: each side drops or ignores it."""

    type: str


Message = Union[Challenge, Hello, Welcome, Refusal, Beat, Failed, Report, TrainersDone, Stop, Finish, Start, End,
                Admitted, RoundStart, StopWorkers, Stopped, RoundDone, RoundFailed, Leaving, Dropped, Speeds, Join,
                NodeList, Unknown]

OMITTED_WHEN_NONE = ("proof", "node_id", "host", "workers", "changes", "why")  # keys left out of the JSON object rather than sent as null


def to_wire(message: Message) -> dict:
    """The JSON object the channel sends for ``message``."""
    wire: dict = {"type": message.type}
    for f in fields(message):
        value = getattr(message, f.name)
        if value is None and f.name in OMITTED_WHEN_NONE:
            continue
        if isinstance(value, Cause):
            value = value.as_dict()
        elif isinstance(value, tuple) and all(isinstance(item, (Seat, Change, NodeSpeed)) for item in value):
            value = [item.as_list() for item in value]
        wire[f.name] = value
    return wire


def as_cause(value) -> Optional[Cause]:
    return Cause.from_dict(value) if value else None


def as_members(value) -> Optional[tuple]:
    """A round's seats: a list of [id, host, workers, node_rank, first_rank] (text, text, three ints)."""
    if not isinstance(value, list):
        return None
    for item in value:
        if not (isinstance(item, list) and len(item) == 5 and all(isinstance(x, str) for x in item[:2])
                and all(type(x) is int for x in item[2:])):
            return None
    return tuple(Seat(*item) for item in value)


def as_changes(value) -> Optional[tuple]:
    """A round's changes: a list of [id, host, kind, reason] (four texts, the kind one of CHANGE_KINDS)."""
    if not isinstance(value, list):
        return None
    for item in value:
        if not (isinstance(item, list) and len(item) == 4 and all(isinstance(x, str) for x in item)
                and item[2] in CHANGE_KINDS):
            return None
    return tuple(Change(*item) for item in value)


def _hello(m: dict) -> Hello:
    identity = m.get("identity")
    return Hello(identity if isinstance(identity, dict) else None, m.get("node"), as_text(m.get("nonce")),
                 m.get("proof"), as_text(m.get("node_id")), as_text(m.get("host")), as_strict_int(m.get("workers")))


READERS: dict[str, Callable[[dict], Message]] = {
    "challenge": lambda m: Challenge(as_text(m.get("nonce"))),
    "hello": _hello,
    "welcome": lambda m: Welcome(as_text(m.get("proof"))),
    "refused": lambda m: Refusal(as_text(m.get("reason")), as_text(m.get("proof"))),
    "beat": lambda m: Beat(),
    "failed": lambda m: Failed(as_attempt(m.get("attempt")), as_cause(m.get("cause"))),
    "report": lambda m: Report(as_attempt(m.get("attempt")), as_cause(m.get("cause"))),
    "trainers_done": lambda m: TrainersDone(as_attempt(m.get("attempt"))),
    "stop": lambda m: Stop(as_attempt(m.get("attempt")), as_cause(m.get("cause"))),
    "finish": lambda m: Finish(as_attempt(m.get("attempt"))),
    "start": lambda m: Start(as_strict_int(m.get("attempt"))),
    "end": lambda m: End(as_attempt(m.get("attempt")), as_code(m.get("code")), as_cause(m.get("cause"))),
    "admitted": lambda m: Admitted(as_flag(m.get("standby"))),
    "round": lambda m: RoundStart(as_strict_int(m.get("number")), as_members(m.get("members")),
                                  as_strict_int(m.get("world_size")), as_strict_int(m.get("restarts")),
                                  as_text(m.get("text")), as_changes(m.get("changes")), as_text(m.get("why"))),
    "stop_workers": lambda m: StopWorkers(as_strict_int(m.get("round")), as_text(m.get("reason"))),
    "stopped": lambda m: Stopped(as_strict_int(m.get("round"))),
    "round_done": lambda m: RoundDone(as_strict_int(m.get("round"))),
    "round_failed": lambda m: RoundFailed(as_strict_int(m.get("round")), as_code(m.get("code")), as_text(m.get("reason"))),
    "leaving": lambda m: Leaving(as_text(m.get("reason"))),
    "dropped": lambda m: Dropped(as_code(m.get("code")), as_text(m.get("reason"))),
    "speeds": lambda m: Speeds(read_speeds(m.get("nodes"))),
    "join": lambda m: Join(as_strict_int(m.get("rank")), as_strict_int(m.get("size")), as_text(m.get("address")),
                           as_text(m.get("nonce")), as_text(m.get("proof"))),
    "nodes": lambda m: NodeList(as_texts(m.get("nodes"))),
}


def from_wire(message: dict) -> Message:
    """A JSON object off the wire (its ``type`` a string, as ``wire.decode`` guarantees) as a message."""
    reader = READERS.get(message["type"])
    return reader(message) if reader is not None else Unknown(message["type"])
