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


# ---------------------------------------------------------------- what is done about one

def leaving(policy: str, verdict: Verdict, own_node: int) -> "Straggler | None":
    """This node's straggler, when ``policy`` is leave and this node is the slowest one named: one node leaves at a
    time (two leaving at once could take the job below its minimum); the others are judged again in the next round."""
    if policy != "leave" or not verdict.stragglers or verdict.stragglers[0].node != own_node:
        return None
    return verdict.stragglers[0]
