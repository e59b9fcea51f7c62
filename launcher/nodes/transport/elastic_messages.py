"""The messages of an elastic job's membership, between node 0 and each launcher: a launcher admitted, a round's
start with its seats and the changes since the round before, the stop of a round's workers and each member's
answers, a launcher's leaving or being dropped. ``messages`` writes and reads them with the others (``to_wire`` and
``from_wire``): a field of a wrong type reads as None, nothing raises."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

from launcher.nodes.transport.values import Message


@dataclass(frozen=True)
class Admitted(Message, kind="admitted"):
    """Node 0 to a launcher of an elastic job it welcomed: it is in (a standby waits for a member's place)."""

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
    ``lost`` (its process or connection gone), ``silent`` (no heartbeat), ``left`` (it said it leaves), ``straggler``
    (it left, named a straggler: ``--straggler_policy leave``), or ``unhealthy`` (its checks failed after its worker
    failure)."""

    node_id: str
    host: str
    kind: str
    reason: str

    def as_list(self) -> list:
        return [self.node_id, self.host, self.kind, self.reason]


CHANGE_KINDS = ("joined", "lost", "silent", "left", "straggler", "unhealthy")


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


@dataclass(frozen=True)
class RoundStart(Message, kind="round"):
    """The keeper to each member: the round to start, its members' seats (None off the wire: not a list of
    seats)."""

    number: Optional[int]
    members: Optional[tuple] = field(metadata={"read": as_members})  # Seat
    world_size: Optional[int]
    restarts: Optional[int]
    text: Optional[str] = None  # the round in one line (membership.describe), for every node's console
    # Change: the membership's since the round before (the event log's)
    changes: Optional[tuple] = field(default=None, metadata={"read": as_changes})
    why: Optional[str] = None  # what ended the round before: "start", "lost", "joined", "restart"


@dataclass(frozen=True)
class StopWorkers(Message, kind="stop_workers"):
    """Node 0 to each member: stop this round's workers (a membership change)."""

    round: Optional[int]
    reason: Optional[str] = None


@dataclass(frozen=True)
class OfRound(Message):
    """What a member's word on one round carries."""

    round: Optional[int]


class Stopped(OfRound, kind="stopped"):
    """A member to node 0: its workers of this round are all gone."""


class RoundDone(OfRound, kind="round_done"):
    """A member to node 0: its workers of this round all finished (exit code 0)."""


@dataclass(frozen=True)
class RoundFailed(Message, kind="round_failed"):
    """A member to node 0: a cause to stop found there while the round ran (a worker failed, a start, a hang)."""

    round: Optional[int]
    code: int  # off the wire: 1 unless an int of 0 to 255
    reason: Optional[str]
    checkup: object = None  # the member's health checkup made after the failure, before it spends a restart


@dataclass(frozen=True)
class Checked(Message, kind="checked"):
    """A launcher kept aside (a standby, or a member that left unhealthy) to node 0: its health checkup, made afresh
    every interval while it waits."""

    checkup: object = None  # as sent (``health.Checkup.to_wire``), judged by node 0


@dataclass(frozen=True)
class KeptOut(Message, kind="kept_out"):
    """Node 0 to a launcher that failed its health checks: not admitted (its connection then closes: it checks again
    and asks again), or set aside (a standby not promoted, a member out of the job; its connection stays)."""

    reason: Optional[str]
    admitted: Optional[bool] = None  # True: set aside, still of the job; else not admitted


@dataclass(frozen=True)
class Leaving(Message, kind="leaving"):
    """A member to node 0: its launcher ends (a stop signal): it left the job, it is not lost."""

    reason: Optional[str]


@dataclass(frozen=True)
class Dropped(Message, kind="dropped"):
    """Node 0 to a launcher it counts out of the job: end with ``code``, saying ``reason``."""

    code: int  # off the wire: 1 unless an int of 0 to 255
    reason: Optional[str]
