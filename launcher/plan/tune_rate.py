"""A trial's rate, pure: from the program's own reports (``--report_log``'s lines: each rank's step, its numbers by
name and its own clock), after each rank's warm-up steps. The job's rate is the sum over ranks of each one's count's
growth per second (``steps``: its step), over the time every rank was measured, cut into SLICES equal slices: the
rate is their mean, its spread their standard error. A rate is steady once the window holds MIN_LINES reports of each
rank over at least MIN_SECONDS and its spread is within ``steady`` of it. Two rates are within noise when their
ranges (rate ± spread) overlap."""

from __future__ import annotations

import bisect
import math
import statistics
from dataclasses import dataclass
from typing import Optional

from launcher.plan.tune_space import STEPS

SLICES = 4
MIN_LINES = 8  # reports of each rank in the window
MIN_SECONDS = 3.0  # a trial's rate is of at least this long: its first second is not the program's steady speed
MAX_WORLD = 1 << 20


@dataclass(frozen=True)
class Rate:
    rate: float  # the metric's growth per second, summed over ranks
    spread: float  # its standard error
    steps: int  # the steps measured (the most of any rank)
    seconds: float  # the window's length
    lines: int  # the fewest reports of a rank in the window

    def steady(self, tolerance: float) -> bool:
        return self.lines >= MIN_LINES and self.seconds >= MIN_SECONDS and self.spread <= tolerance * abs(self.rate)


class Series:
    """The reports of one trial, by rank: (time, count, step) after each rank's warm-up."""

    def __init__(self, metric: str, warmup_steps: int) -> None:
        self.metric, self.warmup = metric, warmup_steps
        self.ranks: dict = {}  # rank -> [(t, count, step)]
        self.first_step: dict = {}  # rank -> its first step reported
        self.reports = 0  # reports read, warm-up included
        self.counted = 0  # reports that carried the metric
        self.last_time: Optional[float] = None  # the newest report's time (the worker's clock)
        self.world = 0  # the job's world size, as its reports say: the ranks a rate waits for

    def add(self, line: dict) -> None:
        rank, step, t = line.get("rank"), line.get("step"), line.get("t")
        if type(rank) is not int or type(t) not in (int, float) or not math.isfinite(t):
            return
        self.reports += 1
        world = line.get("world")
        if type(world) is int and 0 < world <= MAX_WORLD:
            self.world = world
        self.last_time = t if self.last_time is None else max(self.last_time, t)
        count = step if self.metric == STEPS else (line.get("scalars") or {}).get(self.metric)
        if type(count) not in (int, float) or not math.isfinite(count):
            return
        self.counted += 1
        index = len(self.ranks.get(rank, ())) if step is None else step
        first = self.first_step.setdefault(rank, index)
        if index - first >= self.warmup:
            points = self.ranks.setdefault(rank, [])
            if not points or t > points[-1][0]:
                points.append((float(t), float(count), index))

    def rate(self) -> Optional[Rate]:
        """The job's rate so far; None until every rank (of the world size its reports give) has two reports past its
        warm-up, over a common time."""
        if not self.ranks or any(len(p) < 2 for p in self.ranks.values()) or len(self.ranks) < self.world:
            return None
        start = max(p[0][0] for p in self.ranks.values())
        end = min(p[-1][0] for p in self.ranks.values())
        if end <= start:
            return None
        cuts = [start + (end - start) * i / SLICES for i in range(SLICES + 1)]
        slices = [sum(_at(p, b) - _at(p, a) for p in self.ranks.values()) / (b - a) for a, b in zip(cuts, cuts[1:])]
        spread = statistics.stdev(slices) / math.sqrt(SLICES)
        lines = min(sum(start <= t <= end for t, _, _ in p) for p in self.ranks.values())
        steps = max(p[-1][2] - p[0][2] for p in self.ranks.values())
        return Rate(statistics.fmean(slices), spread, int(steps), end - start, lines)


def _at(points: list, t: float) -> float:
    """A rank's count at time ``t``, read off its reports by a straight line between the two around it."""
    i = bisect.bisect_left(points, (t, -math.inf, 0))
    if i == 0:
        return points[0][1]
    if i == len(points):
        return points[-1][1]
    (t0, c0, _), (t1, c1, _) = points[i - 1], points[i]
    return c0 + (c1 - c0) * (t - t0) / (t1 - t0)


def combined(rates: list) -> tuple:
    """(rate, spread) of one setting measured in several trials: their mean and its standard error (one trial: its
    own spread; the standard error is never below the trials' own spreads' mean over the square root of their
    number)."""
    values = [r.rate for r in rates]
    own = statistics.fmean(r.spread for r in rates) / math.sqrt(len(rates))
    if len(rates) < 2:
        return values[0], rates[0].spread
    return statistics.fmean(values), max(own, statistics.stdev(values) / math.sqrt(len(values)))


def within_noise(a: tuple, b: tuple) -> bool:
    """Whether two (rate, spread) overlap."""
    return abs(a[0] - b[0]) <= a[1] + b[1]


NOTHING = "the program reported"  # how the reason of a trial with nothing to measure begins
HANG_AFTER = 0.25  # of trial_seconds (at least HANG_LEAST seconds): a trial with no report for this long has hung
HANG_LEAST = 2.0


def verdict(series: Series, elapsed: float, wall: float, trial_seconds: float, tolerance: float) -> Optional[tuple]:
    """(why, rate) once a running trial is done: its rate steady, or its time out (``wall``: the clock its workers
    report by, now); rate None: it failed, ``why`` says how. None: it goes on."""
    rate = series.rate()
    if rate is not None and rate.steady(tolerance):
        return "steady", rate
    return ended(series, wall, trial_seconds, "time") if elapsed >= trial_seconds else None


def ended(series: Series, wall: float, trial_seconds: float, why: str) -> tuple:
    """(why, rate) of a trial at its end (``why``: time, or ended when the program ended by itself)."""
    if not series.counted:
        return nothing_reported(series.metric, series.reports), None
    quiet = wall - series.last_time
    if why == "time" and quiet >= max(HANG_LEAST, HANG_AFTER * trial_seconds):
        return f"hung: no report in its last {quiet:.0f} s", None
    rate = series.rate()
    if rate is None:
        return f"{why} before its rate was measured (every rank needs {series.warmup} warm-up steps, then two reports)", None
    return why, rate


def nothing_reported(metric: str, reports: int) -> str:
    """The one sentence for a program whose trial reported nothing the tuner can measure."""
    call = "report(step=step)" if metric == STEPS else f"report(step=step, {metric}=COUNT_SO_FAR)"
    what = f"no {metric} in its {reports} reports" if reports else "nothing"
    return (f"{NOTHING} {what}: call launcher.runtime.{call} in its training loop after each step "
            "(from launcher.runtime import report)")
