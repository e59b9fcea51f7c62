"""A line of ``launcher tune``'s history (LOG_DIR/tune.jsonl), written and read back, pure. ``--resume`` reads the
file, which anything may have written or cut short: a line is the trial's result only when every field has its type
(a finite rate, counts that are whole numbers, a point as ``tune_space.point_of`` reads one); any other line, however
it is broken, is skipped and its trial runs again. Reading never raises."""

from __future__ import annotations

import json
import math
from dataclasses import asdict, fields
from typing import Optional

from launcher.plan import tune_space
from launcher.plan.tune_rate import Rate
from launcher.plan.tune_search import Result

MAX_LINE = 1 << 16  # characters: a result is a few hundred; a longer line is not one of ours
MAX_TRIAL = 1 << 31
_COUNTS = ("steps", "lines")


def line_of(number: int, result: Result) -> str:
    """The history's line of trial ``number`` (its newline not included)."""
    return json.dumps({"trial": number, "point": [list(p) for p in result.point], "why": result.why,
                       "rate": asdict(result.rate) if result.rate is not None else None})


def entry(line: str) -> Optional[tuple]:
    """(trial number, Result) of a history line; None where the line is not one whole result."""
    if len(line) > MAX_LINE:
        return None
    try:
        doc = json.loads(line)
    except (ValueError, RecursionError):
        return None
    if not isinstance(doc, dict) or not {"trial", "point", "why", "rate"} <= doc.keys():
        return None
    number, point, why, rate = (doc[k] for k in ("trial", "point", "why", "rate"))
    if not _whole(number) or not 1 <= number <= MAX_TRIAL or not isinstance(why, str):
        return None
    kept = _rate(rate) if rate is not None else None
    point = tune_space.point_of(point)
    if point is None or (rate is not None and kept is None):
        return None
    return number, Result(point, kept, why)


def _rate(doc) -> Optional[Rate]:
    names = [f.name for f in fields(Rate)]
    if not isinstance(doc, dict) or sorted(doc) != sorted(names):
        return None
    for name in names:
        value = doc[name]
        if name in _COUNTS and not (_whole(value) and value >= 0):
            return None
        if not (_number(value) and (name == "rate" or value >= 0)):
            return None
    return Rate(**{name: doc[name] for name in names})


def _whole(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
