"""The messages between the launchers of one job, as frozen dataclasses, with their one
encode/decode pair: ``to_wire`` (a message as the JSON object the channel sends) and
``from_wire`` (a JSON object off the wire, already bounded by ``wire.decode``, as a message).

``from_wire`` never raises: a field of a wrong type reads as None (or, for an end's code, as 1),
an unknown type as ``Unknown``, so each handler decides on typed values only. The objects
``to_wire`` makes are byte for byte those of earlier versions (same keys, same order). An elastic
job's membership's messages are written in ``elastic_messages`` and taken in here (``messages.RoundStart``).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field, fields
from typing import Callable, Iterable, Mapping, Optional, Sequence, Tuple

from launcher.nodes.transport.elastic_messages import (  # noqa: F401 (the elastic job's, read and written here too)
    Admitted, Change, Checked, Dropped, KeptOut, Leaving, RoundDone, RoundFailed, RoundStart, Seat, StopWorkers,
    Stopped)
from launcher.nodes.transport.tune_messages import (  # noqa: F401 (launcher tune's, read and written here too)
    TrialEnded, TrialLines, TrialOrder, TrialStop, TuneHello, TuneOver)
from launcher.nodes.transport.values import BY_TYPE, Message, as_attempt
from launcher.plan.policy import Cause
from launcher.plan.stragglers import STALE, RankTime, valid

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
class Challenge(Message, kind="challenge"):
    """A server to a new connection: prove the job token on this nonce (``handshake``)."""

    nonce: Optional[str]


@dataclass(frozen=True)
class Hello(Message, kind="hello"):
    """A joining node to node 0, after its challenge. ``node`` and ``proof`` are as sent (node 0 checks them and
    names a wrong value in its refusal); ``proof`` is left out without a job token."""

    identity: Optional[dict]
    node: object
    nonce: Optional[str]
    proof: object = None
    node_id: Optional[str] = None  # an elastic job's: the id this launcher made, its host, its workers
    host: Optional[str] = None
    workers: Optional[int] = None
    checkup: object = None  # its health checkup as sent (``health.Checkup.to_wire``), judged by node 0 (``admission``)


@dataclass(frozen=True)
class Welcome(Message, kind="welcome"):
    proof: Optional[str] = None  # with a job token: the server's proof on the client's nonce


@dataclass(frozen=True)
class Refusal(Message, kind="refused"):
    reason: Optional[str]
    proof: Optional[str] = None


@dataclass(frozen=True)
class Beat(Message, kind="beat"):
    """Either end of a link, every keep-alive interval: it is there."""


# ---------------------------------------------------------------- a node to node 0, and node 0's orders


@dataclass(frozen=True)
class Attempt(Message):
    """What a message about one attempt carries: its number as node 0 compares it (``values.as_attempt``)."""

    attempt: Optional[int] = field(metadata={"read": as_attempt})


@dataclass(frozen=True)
class AttemptCause(Message):
    """What a message about one attempt and its cause carries."""

    attempt: Optional[int] = field(metadata={"read": as_attempt})
    cause: Optional[Cause]


class Failed(AttemptCause, kind="failed"):
    """A cause to stop found on a node: node 0 takes the first as the attempt's root cause."""

class Report(AttemptCause, kind="report"):
    """A node's part of an attempt is over, with its cause (None: its workers all finished)."""


class TrainersDone(Attempt, kind="trainers_done"):
    """Parameter-server mode: this node's trainers all exited 0."""

class Stop(AttemptCause, kind="stop"):
    """Node 0 to every node: stop this attempt's workers, for the cause given."""


class Finish(Attempt, kind="finish"):
    """Parameter-server mode: every trainer of the job finished; stop the servers."""


@dataclass(frozen=True)
class Start(Message, kind="start"):
    attempt: Optional[int]  # strictly an int on the wire, else None


@dataclass(frozen=True)
class End(Message, kind="end"):
    attempt: Optional[int] = field(metadata={"read": as_attempt})
    code: int  # off the wire: 1 unless an int of 0 to 255
    cause: Optional[Cause]


# ---------------------------------------------------------------- each node's speed (``launcher.plan.stragglers``)

SHARE_EVERY = 2.0  # seconds between two messages of speeds from a node, and from the node that gathers them
SHARED_NODES = 1024  # nodes one message of speeds carries at most
SHARED_BYTES = 32 * 1024  # and bytes of their JSON: a control message is at most 64 KiB, sealed or not
HOST_WIDTH = 255


@dataclass(frozen=True)
class NodeSpeed:
    """A node's own ranks as the other nodes need them to judge the job: its fastest and its slowest rank's compute
    time (a node is as fast as its slowest rank; the job's fastest rank is the one to compare against), at its last
    step, in the round they were measured in (an elastic job's node indices and ranks change with its rounds)."""

    node: int
    host: str
    round: int
    step: int
    fastest: Tuple[int, float]  # (rank, compute seconds)
    slowest: Tuple[int, float]

    def as_list(self) -> list:
        return [self.node, self.host, self.round, self.step, *self.fastest, *self.slowest]

    def rank_times(self) -> Tuple[RankTime, ...]:
        ranks = {self.fastest[0]: self.fastest[1], self.slowest[0]: self.slowest[1]}
        return tuple(RankTime(rank, self.node, self.host, compute, self.step) for rank, compute in sorted(ranks.items()))


@dataclass(frozen=True)
class Speeds(Message, kind="speeds"):
    """A node to the node that gathers them (node 0; an elastic job's keeper): its own entry; and back to every node:
    every node's, so that each one judges the whole job. A receiver trusts an entry of a node only from that node."""

    # NodeSpeed (off the wire, what is not one is left out: ``read_speeds``, below)
    nodes: tuple = field(metadata={"read": lambda value: read_speeds(value)})


def node_speed(own: Sequence[RankTime], round_: int = 0) -> Optional[NodeSpeed]:
    """This node's entry for the others, from its ranks with a full window (None: none yet)."""
    if not own:
        return None
    fastest = min(own, key=lambda t: (t.compute, t.rank))
    slowest = max(own, key=lambda t: (t.compute, -t.rank))
    return NodeSpeed(own[0].node, own[0].host, round_, max(t.step for t in own), (fastest.rank, fastest.compute),
                     (slowest.rank, slowest.compute))


def read_speeds(value) -> Tuple[NodeSpeed, ...]:
    """Entries off the wire (a list of [node, host, round, step, rank, compute, rank, compute]); whatever is not one,
    or past SHARED_NODES, is left out: never raises."""
    if not isinstance(value, list):
        return ()
    out = []
    for item in value[:SHARED_NODES]:
        if not (isinstance(item, list) and len(item) == 8 and isinstance(item[1], str) and len(item[1]) <= HOST_WIDTH
                and all(_count(x) for x in (item[0], item[2], item[3], item[4], item[6]))
                and valid(item[5]) and valid(item[7])):
            continue
        out.append(NodeSpeed(item[0], item[1], item[2], item[3], (item[4], float(item[5])), (item[6], float(item[7]))))
    return tuple(out)


def _count(value) -> bool:
    return type(value) is int and 0 <= value < 1 << 31


def shared(entries: Iterable[NodeSpeed]) -> Tuple[NodeSpeed, ...]:
    """One entry per node for one message, within SHARED_NODES entries and SHARED_BYTES of JSON (a control message
    is at most 64 KiB): the job's fastest node first, then the slowest ones (those a judgment turns on), by node."""
    by_node = {e.node: e for e in entries}
    if not by_node:
        return ()
    fastest = min(by_node.values(), key=lambda e: (e.fastest[1], e.node))
    kept, size = [fastest], _size(fastest)
    for e in sorted(by_node.values(), key=lambda e: (-e.slowest[1], e.node)):
        if e is fastest:
            continue
        if len(kept) == SHARED_NODES or size + _size(e) > SHARED_BYTES:
            break
        kept.append(e)
        size += _size(e)
    return tuple(sorted(kept, key=lambda e: e.node))


def _size(entry: NodeSpeed) -> int:
    return len(json.dumps(entry.as_list())) + 1


def fresh(gathered: Mapping[object, Tuple[NodeSpeed, float]], now: float, round_: Optional[int] = None,
          stale: float = STALE) -> Tuple[NodeSpeed, ...]:
    """What a gathering node shares of the entries it holds (sender -> (its entry, when it came)): those heard within
    ``stale`` seconds (of ``round_`` where given), as one message carries them (``shared``)."""
    return shared(e for e, heard in gathered.values() if now - heard <= stale and (round_ is None or e.round == round_))


def others(entries: Iterable[NodeSpeed], own_node: int, round_: int = 0) -> Tuple[RankTime, ...]:
    """The other nodes' ranks to compare with this node's, from the entries shared with it (of its round only)."""
    return tuple(t for e in entries if e.node != own_node and e.round == round_ for t in e.rank_times())


# ---------------------------------------------------------------- gathering an MPI job's node list (``gather``)


@dataclass(frozen=True)
class Join(Message, kind="join"):
    """An MPI rank's hello to rank 0: its rank, the number of ranks, its address; ``proof`` with a job token."""

    rank: Optional[int]  # strictly ints on the wire, else None
    size: Optional[int]
    address: Optional[str]
    nonce: Optional[str]
    proof: Optional[str] = None


@dataclass(frozen=True)
class NodeList(Message, kind="nodes"):
    """Rank 0's answer after its welcome: every node's address in MPI rank order (None off the wire: not a list of
    text)."""

    nodes: Optional[list]


@dataclass(frozen=True)
class Unknown:
    """A message of a type no launcher sends: each side drops or ignores it."""

    type: str


# keys left out of the JSON object rather than sent as null
OMITTED_WHEN_NONE = ("proof", "node_id", "host", "workers", "checkup", "changes", "why", "admitted")


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


def reader(cls) -> Callable[[dict], Message]:
    """What reads a ``cls`` off a JSON object: each field by its declared type (``values.BY_TYPE``, and causes), or by
    the reader its metadata names."""
    by_type = {**BY_TYPE, "Optional[Cause]": as_cause}
    read = [(f.name, f.metadata.get("read") or by_type[f.type]) for f in fields(cls)]
    return lambda m: cls(*(read_field(m.get(name)) for name, read_field in read))


READERS: dict[str, Callable[[dict], Message]] = {kind: reader(cls) for kind, cls in Message.kinds.items()}


def from_wire(message: dict) -> Message:
    """A JSON object off the wire (its ``type`` a string, as ``wire.decode`` guarantees) as a message."""
    reader = READERS.get(message["type"])
    return reader(message) if reader is not None else Unknown(message["type"])
