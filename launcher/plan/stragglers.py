"""Which node holds the job back: each rank's own work per step (its compute time: its step time less its wait in
the collectives) against the fastest rank's, over a window of steps, and the nodes below a threshold named. Pure:
samples in, relative speeds and stragglers out, time an argument.

A rank's compute time is the mean of the middle half of its last ``window`` reported steps (the interquartile
mean: a spike of one step, or a lucky fast one, moves it little; a median moves more with a busy machine's jitter).
Its relative speed is the fastest rank's compute time over its own (1.0 the fastest, 0.25 a rank four times
slower; 1.0 too within ``min_gap`` seconds of the fastest: on steps of a few milliseconds a busy machine's jitter
is larger than any difference that holds the job back); a node's is its slowest rank's. A node is a straggler once
its speed has stayed below ``threshold`` for ``patience`` steps in a row (half a window) and ``hold`` seconds: the
window's middle half turns slow after about a third of a window of slow steps, so a rank four times slower is
named within one window (or ``hold``, whichever is longer), a healthy job's noise (+-30% per step, single steps
three times as long) names nobody, and neither does a few seconds' slowdown (a neighbour's worker importing torch
on the same cores, a checkpoint written): on steps of tens of milliseconds, ``patience`` steps alone last under a
second. Only ranks with a full window, heard from within ``stale`` seconds, are compared; a rank whose steps go
back (a restarted worker) starts a new window.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from typing import Dict, Iterable, Mapping, Sequence, Tuple

WINDOW = 20  # reported steps of a rank whose interquartile mean is its compute time
THRESHOLD = 0.7  # a node slower than this, relative to the fastest rank, is a straggler
RECOVERED = 0.8  # a node named is cleared once back at this speed (a node near the threshold is not named over and over)
PATIENCE = 10  # steps in a row a node stays below the threshold before it is named
HOLD = 5.0  # and seconds: a slowdown shorter than this is not a straggler
STALE = 60.0  # seconds: a rank not heard from this long is left out of the comparison
MIN_GAP = 0.01  # seconds: a rank within this of the fastest rank's compute time counts as fast as it (a busy
#                 machine's jitter on steps of a few milliseconds is not a straggler)


@dataclass(frozen=True)
class Settings:
    window: int = WINDOW
    threshold: float = THRESHOLD
    recovered: float = RECOVERED
    stale: float = STALE
    patience: int = PATIENCE
    min_gap: float = MIN_GAP
    hold: float = HOLD


@dataclass(frozen=True)
class Window:
    """One rank's last compute times (seconds per step, newest last), its last step and when that came."""

    node: int
    host: str
    step: int
    times: Tuple[float, ...]
    heard: float


@dataclass(frozen=True)
class RankTime:
    """One rank's compute time: the interquartile mean of a full window (seconds per step), at its last step."""

    rank: int
    node: int
    host: str
    compute: float
    step: int = 0


@dataclass(frozen=True)
class Straggler:
    node: int
    host: str
    ranks: Tuple[int, ...]  # its ranks below the threshold, slowest first
    speed: float  # the node's: its slowest rank's
    reason: str  # one sentence, for the log and the event


@dataclass(frozen=True)
class Verdict:
    ranks: Dict[int, float] = field(default_factory=dict)  # rank -> relative speed
    nodes: Dict[int, float] = field(default_factory=dict)  # node -> relative speed (its slowest rank's)
    stragglers: Tuple[Straggler, ...] = ()  # slowest first
    compared: int = 0  # ranks compared
    below: Dict[int, Tuple[int, float]] = field(default_factory=dict)  # node -> (its step, the time) when it went
    #                                                                    below the threshold


def valid(compute) -> bool:
    return isinstance(compute, (int, float)) and not isinstance(compute, bool) and math.isfinite(compute) and compute >= 0


def add(windows: Mapping[int, Window], rank: int, node: int, host: str, step: int, compute: float, now: float,
        settings: Settings = Settings()) -> Dict[int, Window]:
    """``windows`` with ``rank``'s compute time of ``step`` added: a step not past the rank's last one is left out,
    one before it (a new worker counting from 0 again) starts its window afresh, as does a move to another node."""
    out = dict(windows)
    if not valid(compute):
        return out
    before = windows.get(rank)
    if before is not None and before.step == step:
        return out
    fresh = before is None or step < before.step or before.node != node
    times = ((() if fresh else before.times) + (float(compute),))[-settings.window:]
    out[rank] = Window(node, host, step, times, now)
    return out


def middle_mean(times: Sequence[float]) -> float:
    """The interquartile mean: the mean of the middle half (the quarter above and below left out)."""
    ordered = sorted(times)
    cut = len(ordered) // 4
    middle = ordered[cut:len(ordered) - cut]
    return sum(middle) / len(middle)


def summarize(windows: Mapping[int, Window], now: float, settings: Settings = Settings()) -> Tuple[RankTime, ...]:
    """The ranks to compare: each one with a full window, heard from within ``stale`` seconds, by rank."""
    return tuple(RankTime(rank, w.node, w.host, middle_mean(w.times), w.step) for rank, w in sorted(windows.items())
                 if len(w.times) >= settings.window and now - w.heard <= settings.stale)


def judge(times: Iterable[RankTime], below: Mapping[int, Tuple[int, float]] = {}, settings: Settings = Settings(),
          now: float = 0.0) -> Verdict:
    """Each rank's and node's relative speed, and the stragglers: the nodes below the threshold since ``patience``
    steps and ``hold`` seconds before ``now`` (``below``: the last verdict's, node -> (its step, the time) when it
    went below). At least two ranks are compared; a rank listed twice counts once, its first time."""
    by_rank: Dict[int, RankTime] = {}
    for t in times:
        if valid(t.compute):
            by_rank.setdefault(t.rank, t)
    if len(by_rank) < 2:
        return Verdict()
    fastest = min(t.compute for t in by_rank.values())
    ranks = {rank: _speed(fastest, t.compute, settings.min_gap) for rank, t in by_rank.items()}
    nodes: Dict[int, float] = {}
    steps: Dict[int, int] = {}
    for rank, t in by_rank.items():
        nodes[t.node] = min(nodes.get(t.node, 1.0), ranks[rank])
        steps[t.node] = max(steps.get(t.node, t.step), t.step)
    still = {node: _since(below.get(node), steps[node], now) for node, speed in nodes.items()
             if speed < settings.threshold}
    stragglers = []
    for node, speed in nodes.items():
        if not _held(still.get(node), steps[node], now, settings):
            continue
        slow = sorted((t for t in by_rank.values() if t.node == node and ranks[t.rank] < settings.threshold),
                      key=lambda t: (ranks[t.rank], t.rank))
        stragglers.append(Straggler(node, slow[0].host, tuple(t.rank for t in slow), speed,
                                    _reason(node, slow, ranks, fastest, settings)))
    stragglers.sort(key=lambda s: (s.speed, s.node))
    return Verdict(ranks, nodes, tuple(stragglers), len(by_rank), still)


def _since(before: "Tuple[int, float] | None", step: int, now: float) -> Tuple[int, float]:
    """When a node below the threshold went below it: as before (its step, the time), unless its steps went back."""
    if before is None or step < before[0]:
        return step, now
    return before


def _held(since: "Tuple[int, float] | None", step: int, now: float, settings: Settings) -> bool:
    """Whether a node below the threshold since ``since`` (its step, the time) has been for long enough to be named."""
    return since is not None and step - since[0] >= settings.patience and now - since[1] >= settings.hold


def changes(named: Iterable[int], verdict: Verdict,
            settings: Settings = Settings()) -> Tuple[Tuple[Straggler, ...], Tuple[int, ...]]:
    """(the stragglers newly named, the nodes named before and no longer), against the nodes ``named`` before. A node
    named stays named until its speed is back at ``recovered`` (or it is compared no more), so that a node whose
    speed hovers at the threshold is not named and cleared at every look."""
    before = set(named)
    now = {s.node for s in verdict.stragglers}
    gone = {node for node in before - now if verdict.nodes.get(node, settings.recovered) >= settings.recovered}
    return tuple(s for s in verdict.stragglers if s.node not in before), tuple(sorted(gone))


def _speed(fastest: float, own: float, min_gap: float = MIN_GAP) -> float:
    if own <= 0 or own - fastest < min_gap:
        return 1.0
    return min(1.0, fastest / own)


def _reason(node: int, slow: Sequence[RankTime], ranks: Mapping[int, float], fastest: float, settings: Settings) -> str:
    where = f"node {node}" + (f" ({slow[0].host})" if slow[0].host else "")
    who = ", ".join(f"rank {t.rank} at {ranks[t.rank]:.2f} ({t.compute:.3f} s)" for t in slow)
    return (f"{where} is a straggler: {who} of compute per step, against the fastest rank's {fastest:.3f} s "
            f"(the middle half of each one's last {settings.window} steps; below {settings.threshold:g} of the "
            f"fastest's speed for {settings.patience} steps and {settings.hold:g} s)")


# ---------------------------------------------------------------- what a node tells the others


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


SHARED_NODES = 1024  # nodes one message of speeds carries at most
SHARED_BYTES = 32 * 1024  # and bytes of their JSON: a control message is at most 64 KiB, sealed or not
HOST_WIDTH = 255


def node_speed(own: Sequence[RankTime], round_: int = 0) -> "NodeSpeed | None":
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


# ---------------------------------------------------------------- what is done about one

def leaving(policy: str, verdict: Verdict, own_node: int) -> "Straggler | None":
    """This node's straggler, when ``policy`` is leave and this node is the slowest one named: one node leaves at a
    time (two leaving at once could take the job below its minimum); the others are judged again in the next round."""
    if policy != "leave" or not verdict.stragglers or verdict.stragglers[0].node != own_node:
        return None
    return verdict.stragglers[0]


SHARE_EVERY = 2.0  # seconds between two messages of speeds from a node, and from the node that gathers them


class Every:
    """Due at most once every ``seconds`` (a node's messages of speeds, and the gathering node's)."""

    def __init__(self, seconds: float = SHARE_EVERY) -> None:
        self.seconds = seconds
        self.last = float("-inf")

    def due(self, now: float) -> bool:
        if now - self.last < self.seconds:
            return False
        self.last = now
        return True


class Gathered:
    """The entries a gathering node (node 0, an elastic job's keeper) holds: each node's last, by who sent it (a
    sender speaks for itself only), and when it came; the fresh ones are shared back."""

    def __init__(self, settings: Settings = Settings()) -> None:
        self.settings = settings
        self.entries: Dict[object, Tuple[NodeSpeed, float]] = {}
        self.sharing = Every()

    def put(self, sender, entry: "NodeSpeed | None", now: float) -> None:
        if entry is not None:
            self.entries[sender] = (entry, now)

    def forget(self, sender) -> None:
        self.entries.pop(sender, None)

    def fresh(self, now: float, round_: "int | None" = None) -> Tuple[NodeSpeed, ...]:
        """The entries heard within ``stale`` seconds (of ``round_`` where given), at most SHARED_NODES."""
        return shared(e for e, heard in self.entries.values()
                      if now - heard <= self.settings.stale and (round_ is None or e.round == round_))

    def due(self, now: float) -> bool:
        return self.sharing.due(now)


def others(entries: Iterable[NodeSpeed], own_node: int, round_: int = 0) -> Tuple[RankTime, ...]:
    """The other nodes' ranks to compare with this node's, from the entries shared with it (of its round only)."""
    return tuple(t for e in entries if e.node != own_node and e.round == round_ for t in e.rank_times())
