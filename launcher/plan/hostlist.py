"""Slurm's compressed host lists (``gpu[01-04,07],cpu3``, ``a[1-2]-b[3-4]``), expanded: pure.

The grammar is the one ``scontrol show hostnames`` reads: items separated by commas outside
brackets; in an item, each ``[...]`` holds numbers and ``lo-hi`` ranges, separated by commas; an
item with several brackets is their product, the leftmost varying slowest; a range keeps the
zero padding of its lower bound (``[08-10]`` gives ``08 09 10``).
"""

from __future__ import annotations

import re

MAX_HOSTS = 1_000_000  # a typo such as [1-99999999] is refused, not expanded into memory

_RANGE = re.compile(r"([0-9]+)(?:-([0-9]+))?")


class HostListError(ValueError):
    """Why a text is not a host list; the caller names the variable it came from."""


def expand(text: str) -> list:
    """Every host of ``text``, in order. Raises HostListError."""
    if not text.strip():
        raise HostListError("it is empty")
    hosts = []
    for item in _split_items(text.strip()):
        hosts += _expand_item(item)
        if len(hosts) > MAX_HOSTS:
            raise HostListError(f"it expands to more than {MAX_HOSTS} hosts")
    return hosts


def _split_items(text: str) -> list:
    """Split at the commas outside brackets; brackets must pair up, and never nest."""
    items, depth, start = [], 0, 0
    for i, ch in enumerate(text):
        if ch == "[":
            if depth:
                raise HostListError(f"a bracket opens inside another at character {i + 1}")
            depth = 1
        elif ch == "]":
            if not depth:
                raise HostListError(f"a bracket closes without opening at character {i + 1}")
            depth = 0
        elif ch == "," and not depth:
            items.append(text[start:i])
            start = i + 1
    if depth:
        raise HostListError("a bracket is never closed")
    items.append(text[start:])
    for item in items:
        if not item.strip():
            raise HostListError("it has an empty item (two commas in a row, or one at an end)")
    return [item.strip() for item in items]


def _expand_item(item: str) -> list:
    """``a[1-2]-b[3,4]`` -> a1-b3 a1-b4 a2-b3 a2-b4."""
    names = [""]
    for bracket, literal in re.findall(r"\[([^\]]*)\]|([^\[]+)", item):
        parts = [literal] if literal else _expand_ranges(bracket)
        if len(names) * len(parts) > MAX_HOSTS:
            raise HostListError(f"it expands to more than {MAX_HOSTS} hosts")
        names = [n + p for n in names for p in parts]
    return names


def _expand_ranges(text: str) -> list:
    """``01-03,7`` -> 01 02 03 7."""
    out = []
    for part in text.split(","):
        m = _RANGE.fullmatch(part.strip())
        if not m:
            raise HostListError(f"[{text}] holds {part.strip()!r}, which is not a number or a range lo-hi")
        lo, hi = m.group(1), m.group(2) if m.group(2) is not None else m.group(1)
        if int(hi) < int(lo):
            raise HostListError(f"the range {lo}-{hi} runs backwards")
        if int(hi) - int(lo) >= MAX_HOSTS:
            raise HostListError(f"the range {lo}-{hi} holds more than {MAX_HOSTS} numbers")
        width = len(lo)
        out += [str(n).zfill(width) for n in range(int(lo), int(hi) + 1)]
    return out
