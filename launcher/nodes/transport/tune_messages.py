"""The messages of ``launcher tune``'s link between the tuners of one job's nodes (``launcher.nodes.tune``): the
leading tuner orders each trial and its stop; each following tuner sends its trial's reports back and says when its
trial ended. Read by ``messages.from_wire`` as every message is: a field of a wrong type reads as None."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

from launcher.nodes.transport.values import Message
from launcher.plan.report_lines import MOST_LINES
from launcher.plan.tune_space import point_of

MAX_KNOBS = 64  # knobs a trial's point carries at most


def as_point(value) -> Optional[tuple]:
    """A point off the wire (``tune_space.point_of``) of at most MAX_KNOBS knobs; None otherwise."""
    return point_of(value) if isinstance(value, list) and len(value) <= MAX_KNOBS else None


def as_lines(value) -> Optional[list]:
    return value if isinstance(value, list) and len(value) <= MOST_LINES and all(isinstance(x, str) for x in value) \
        else None


@dataclass(frozen=True)
class TuneHello(Message, kind="tune_hello"):
    """A following tuner to the leading one, after its challenge: who it is (its host, for messages)."""

    host: Optional[str]
    nonce: Optional[str]
    proof: object = None


@dataclass(frozen=True)
class TrialOrder(Message, kind="trial_order"):
    """The leader to a follower: run trial ``trial`` with this point over your own launch, as job ``job_id``; you
    are follower ``follower`` (1, 2, ...: the folder of your trials)."""

    trial: Optional[int]
    follower: Optional[int]
    point: Optional[tuple] = field(metadata={"read": as_point})
    job_id: Optional[str]


@dataclass(frozen=True)
class TrialStop(Message, kind="trial_stop"):
    """The leader to a follower: the rate is known, stop trial ``trial``."""

    trial: Optional[int]


@dataclass(frozen=True)
class TrialLines(Message, kind="trial_lines"):
    """A follower to the leader: new lines of its trial's report log (``reports.nodeN.jsonl``, N: ``node``)."""

    trial: Optional[int]
    node: Optional[int]
    lines: Optional[list] = field(metadata={"read": as_lines})


@dataclass(frozen=True)
class TrialEnded(Message, kind="trial_ended"):
    """A follower to the leader: its trial's launcher exited with ``code`` (not 0: ``why``, its last line)."""

    trial: Optional[int]
    code: int
    why: Optional[str] = None


@dataclass(frozen=True)
class TuneOver(Message, kind="tune_over"):
    """The leader to every follower: the tuning is over (``reason``: why, where it did not end well)."""

    reason: Optional[str] = None
