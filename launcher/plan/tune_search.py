"""Which trial ``launcher tune`` runs next, pure: successive halving over the points of the space. The program's own
settings (``defaults``, the launch as given) are measured first, for the ratio at the end; then every point once,
each trial ended as soon as its rate is steady; then, pass after pass, the best third (at least LEADERS) measured
again, in the order of their rates, the next pass in the reverse order, so that a machine that drifts does not favour
one of them, until the points left have ``repeats`` trials each (default REPEATS; 1: every point once, no pass). A
point whose trial fails is out. The search depends on the results alone, so that ``--resume`` replays it from its history."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional

from launcher.plan.tune_rate import Rate, combined, within_noise

DEFAULTS = ()  # the point of the program's own settings
ETA = 3  # each pass keeps a third
LEADERS = 3
REPEATS = 3


@dataclass(frozen=True)
class Result:
    point: tuple
    rate: Optional[Rate]  # None: the trial failed
    why: str  # steady, time, ended; or why it failed


@dataclass(frozen=True)
class Standing:
    point: tuple
    rate: float
    spread: float
    trials: int


class Search:
    def __init__(self, points: list, repeats: int = REPEATS) -> None:
        self.repeats = repeats
        self.results: dict = {}  # point -> [Result]
        self.alive = list(points)
        self.queue = [DEFAULTS, *points]
        self.passes = 0

    def next(self) -> Optional[tuple]:
        """The point of the next trial; None when the search is over."""
        if not self.queue:
            self._plan()
        return self.queue.pop(0) if self.queue else None

    def record(self, result: Result) -> None:
        self.results.setdefault(result.point, []).append(result)
        if result.rate is None and result.point in self.alive:
            self.alive.remove(result.point)

    def _plan(self) -> None:
        ranked = [s.point for s in self.standings() if s.point in self.alive]
        if len(ranked) < 2 or all(len(self.results[p]) >= self.repeats for p in ranked):
            return
        ranked = ranked[:max(LEADERS, math.ceil(len(ranked) / ETA))]
        self.alive = ranked
        self.passes += 1
        self.queue = ranked if self.passes % 2 == 0 else ranked[::-1]

    def standings(self) -> list:
        """Every point measured with no failed trial, the fastest first (the defaults among them)."""
        out = []
        for point, results in self.results.items():
            if results and all(r.rate is not None for r in results):
                rate, spread = combined([r.rate for r in results])
                out.append(Standing(point, rate, spread, len(results)))
        return sorted(out, key=lambda s: -s.rate)

    def best(self) -> Optional[Standing]:
        """The fastest point of the space (never the defaults alone: they are what it is compared with)."""
        return next((s for s in self.standings() if s.point != DEFAULTS), None)

    def failures(self) -> list:
        return [r for results in self.results.values() for r in results if r.rate is None]


def noise_between(first: Standing, second: Optional[Standing]) -> bool:
    return second is not None and within_noise((first.rate, first.spread), (second.rate, second.spread))
