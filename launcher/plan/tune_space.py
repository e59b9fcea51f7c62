"""A tuning space (``launcher tune --space FILE``): the YAML read and checked before any trial, pure. Each knob is a
launch option by its name, ``env.NAME`` (a variable of the workers), ``strategy.FIELD`` (a field of fleet's
DistributedStrategy, over the program's own) or ``arg.--flag`` (the program's own argument, replaced or added), with
the list of values to try; a point of the space is one value of each knob. What a launch option takes is asked of
the caller (``check_option``: the one option table and click's types, in ``launcher.cli.tune``)."""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass
from typing import Callable, Optional

from launcher.errors import LaunchError
from launcher.plan import strategy_fields

OPTION, ENV, STRATEGY, ARG = "option", "env", "strategy", "arg"
PREFIXES = (ENV, STRATEGY, ARG)
KEYS = ("metric", "trial_seconds", "warmup_steps", "steady", "repeats", "search", "knobs")
SEARCHES = ("descent", "every")  # launcher.plan.tune_search: one knob at a time, or every point once
STEPS = "steps"  # the default metric: the step of report(step=...)
MAX_POINTS = 1000
SCALARS = (str, int, float, bool)


@dataclass(frozen=True)
class Knob:
    name: str  # as the space writes it: nproc_per_node, env.OMP_NUM_THREADS, strategy.use_local_sgd, arg.--batch-size
    kind: str  # OPTION, ENV, STRATEGY or ARG
    key: str  # the option's name (underscores), the variable, the field or the flag
    values: tuple


@dataclass(frozen=True)
class Space:
    knobs: tuple  # Knob
    metric: str = STEPS  # steps, or the name of a running count the program reports (report(samples=...))
    trial_seconds: float = 60.0  # the most one trial runs
    warmup_steps: int = 5  # steps of each rank left out before its rate is measured
    steady: float = 0.02  # a rate is steady once its spread is within this share of it
    repeats: int = 3  # the trials of each leader at the end (launcher.plan.tune_search)
    search: str = SEARCHES[0]

    def points(self) -> list:
        """Every point of the space: a tuple of (knob name, value), in the knobs' order."""
        return [tuple(zip((k.name for k in self.knobs), values))
                for values in itertools.product(*(k.values for k in self.knobs))]


CheckOption = Callable[[str, object, str], str]  # (name, value, where) -> the option's name; LaunchError if refused


def point_of(value) -> Optional[tuple]:
    """A point read back from JSON (the tune link, the history): a list of [knob name, value], each value one a space
    may list (text, a finite number, true/false); None otherwise."""
    if not isinstance(value, list):
        return None
    if not all(isinstance(p, list) and len(p) == 2 and isinstance(p[0], str) and isinstance(p[1], SCALARS)
               and not (isinstance(p[1], float) and not math.isfinite(p[1])) for p in value):
        return None
    return tuple((name, v) for name, v in value)


def parse(data, where: str, check_option: CheckOption) -> Space:
    """The space in ``data`` (the YAML read), every knob and value checked; LaunchError naming the first bad one."""
    if not isinstance(data, dict):
        raise LaunchError(f"{where} must be a mapping with knobs: (and metric:, trial_seconds:), not {_what(data)}.")
    unknown = [k for k in data if k not in KEYS]
    if unknown:
        raise LaunchError(f"{where} has an unknown key {unknown[0]!r}; its keys are {', '.join(KEYS)}.")
    knobs = data.get("knobs")
    if not isinstance(knobs, dict) or not knobs:
        raise LaunchError(f"{where} needs knobs:, a mapping of each knob to the list of values to try "
                          "(nproc_per_node: [1, 2]).")
    space = Space(tuple(_knob(str(name), values, where, check_option) for name, values in knobs.items()),
                  metric=_metric(data.get("metric", STEPS), where),
                  trial_seconds=_number(data, "trial_seconds", 60.0, where, low=1.0),
                  warmup_steps=int(_number(data, "warmup_steps", 5, where, low=0, whole=True)),
                  steady=_number(data, "steady", 0.02, where, low=0.001, high=0.5),
                  repeats=int(_number(data, "repeats", 3, where, low=1, high=10, whole=True)),
                  search=_search(data.get("search", SEARCHES[0]), where))
    if math.prod(len(k.values) for k in space.knobs) > MAX_POINTS:
        raise LaunchError(f"{where} has more than {MAX_POINTS} points; try fewer values or fewer knobs.")
    names = [k.kind + ":" + k.key for k in space.knobs]
    twice = next((k.name for k, n in zip(space.knobs, names) if names.count(n) > 1), None)
    if twice is not None:
        raise LaunchError(f"{where}: knob {twice} is named twice (in two spellings); keep one.")
    return space


def _knob(name: str, values, where: str, check_option: CheckOption) -> Knob:
    if not name.isprintable() or not name:
        raise LaunchError(f"{where}: the knob {name!r} is not a name; write a launch option, env.NAME, strategy.FIELD "
                          "or arg.--flag.")
    at = f"{where}: knob {name}"
    prefix, dot, rest = name.partition(".")
    if not isinstance(values, list) or not values:
        raise LaunchError(f"{at} needs a list of at least one value, not {_what(values)}.")
    if len(set(map(repr, values))) < len(values):
        raise LaunchError(f"{at} lists a value twice; list each value once.")
    for v in values:
        if not isinstance(v, SCALARS):
            raise LaunchError(f"{at}: {_what(v)} is not a value; give text, a number or true/false.")
    if dot and prefix in PREFIXES:
        if not rest:
            raise LaunchError(f"{at} names no {prefix}; write {prefix}.NAME.")
        if prefix == STRATEGY:
            for v in values:
                strategy_fields.check(rest, v, f"{at}")
        if prefix == ENV and ("=" in rest or "\0" in rest):
            raise LaunchError(f"{at}: no variable name can hold '=' or a NUL character; rename it.")
        if prefix == ARG and not rest.startswith("-"):
            raise LaunchError(f"{at}: an argument knob names the program's flag, such as arg.--batch-size.")
        return Knob(name, prefix, rest, tuple(values))
    option = None
    for v in values:
        option = check_option(name, v, at)
    return Knob(name, OPTION, option, tuple(values))


def _metric(value, where: str) -> str:
    if not isinstance(value, str) or not value or not value.isprintable():
        raise LaunchError(f"{where}: metric names the running count the program reports (report(samples=...)), "
                          f"or steps; not {_what(value)}.")
    return value


def _search(value, where: str) -> str:
    if value not in SEARCHES:
        raise LaunchError(f"{where}: search is {' or '.join(SEARCHES)}, not {_what(value)}.")
    return value


def _number(data: dict, key: str, default, where: str, low: float, high: float = 86400.0, whole: bool = False):
    value = data.get(key, default)
    kind = "a whole number" if whole else "a number"
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and (not whole or isinstance(value, int))
    if not ok or not math.isfinite(value) or not low <= value <= high:
        raise LaunchError(f"{where}: {key} must be {kind} from {low:g} to {high:g}, not {_what(value)}.")
    return value


def _what(value) -> str:
    text = repr(value)
    return f"{type(value).__name__} {text[:40] + '...' if len(text) > 40 else text}"


def label(point: tuple) -> str:
    """A point in a line: ``nproc_per_node=2 env.OMP_NUM_THREADS=1``; the program's own settings: ``defaults``."""
    return " ".join(f"{name}={_value(v)}" for name, v in point) or "defaults"


def _value(v) -> str:
    return str(v).lower() if isinstance(v, bool) else str(v)
