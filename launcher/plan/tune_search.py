"""Which trial ``launcher tune`` runs next, pure. The program's own settings (``defaults``, the launch as given) are
measured first, for the ratio at the end. Then a descent one knob at a time, from the space's first point (each
knob's first value): every value of the first knob, the others held; the fastest of that line becomes the point the
next knob's line goes through; and so on, pass after pass over the knobs until a pass moves nothing (at most
PASSES). A point measured once is never measured again in the descent, so the passes after the first cost only the
lines through a point that moved. Then, pass after pass, the best third of the points measured (at least LEADERS)
measured again, in the order of their rates, the next pass in the reverse order, so that a machine that drifts does
not favour one of them, until the points left have ``repeats`` trials each (default REPEATS; 1: no pass). A point
whose trial fails is out. The search depends on the results alone, so that ``--resume`` replays it from its
history.

The descent measures about the sum of the knobs' values, not their product: a knob that does not matter costs a
trial per value, and one that does is found on the line through the best point so far. What it can miss is a value
that only helps beside another knob's value that does not help alone; ``every`` (the space's ``search: every``)
measures every point once instead of the descent, then the same passes."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional

from launcher.plan.tune_rate import Rate, combined, within_noise

DEFAULTS = ()  # the point of the program's own settings
ETA = 3  # each pass keeps a third
LEADERS = 3
REPEATS = 3
PASSES = 3  # passes of the descent over the knobs, at most


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
    def __init__(self, points: list, repeats: int = REPEATS, every: bool = False) -> None:
        self.repeats = repeats
        self.results: dict = {}  # point -> [Result]
        self.space = set(points)
        self.current: Optional[tuple] = points[0] if points else None  # the point the next line goes through
        self.knobs = len(points[0]) if points else 0
        self.orders = [{} for _ in range(self.knobs)]  # each knob's values, in the order the space lists them
        for point in points:
            for order, (_, value) in zip(self.orders, point):
                order.setdefault(repr(value), len(order))
        self.knob = -1  # the knob whose line was queued last
        self.moved = False  # whether this pass of the descent moved the current point
        self.descent_passes = 0
        self.alive: Optional[list] = None  # the leaders' pass's points (None: still in the descent)
        self.queue = [DEFAULTS, *([self.current] if points else [])]
        self.passes = 0
        if every:
            self.queue, self.alive = [DEFAULTS, *points], list(points)

    def next(self) -> Optional[tuple]:
        """The point of the next trial; None when the search is over."""
        while not self.queue and self.alive is None:
            self._descend()
        if not self.queue:
            self._plan()
        return self.queue.pop(0) if self.queue else None

    def record(self, result: Result) -> None:
        self.results.setdefault(result.point, []).append(result)
        if result.rate is None and self.alive is not None and result.point in self.alive:
            self.alive.remove(result.point)

    def _descend(self) -> None:
        """The next line of the descent queued, or the descent over (``alive``: the points it measured)."""
        if self.knob >= 0:
            best = self._fastest(self._line(self.knob))
            if best is not None and best != self.current:
                self.current, self.moved = best, True
        self.knob += 1
        if self.knob == self.knobs:
            self.descent_passes += 1
            if not self.moved or self.descent_passes == PASSES or self.knobs == 1:
                self.alive = [s.point for s in self.standings() if s.point != DEFAULTS]
                return
            self.knob, self.moved = 0, False
        self.queue = [p for p in self._line(self.knob) if p not in self.results]

    def _line(self, knob: int) -> list:
        """The points of the space that differ from the current one in ``knob`` alone (and the current one), in the
        order of that knob's values."""
        before, after = self.current[:knob], self.current[knob + 1:]
        return sorted((p for p in self.space if p[:knob] == before and p[knob + 1:] == after),
                      key=lambda p: self.orders[knob][repr(p[knob][1])])

    def _fastest(self, line: list) -> Optional[tuple]:
        ranked = [s for s in self.standings() if s.point in line]
        return ranked[0].point if ranked else None

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
