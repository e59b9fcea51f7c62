"""Values off the wire read as typed values, never raising: what is not of the type reads as None (an end's code
as 1), so that each message's handler decides on typed values only."""

from __future__ import annotations

from typing import Optional


def as_attempt(value) -> Optional[int]:
    """An attempt number as node 0 compares it (1.0 and True are 1); None for anything else."""
    if isinstance(value, bool) or type(value) is int:
        return int(value)
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return None


def as_strict_int(value) -> Optional[int]:
    return value if type(value) is int else None


def as_text(value) -> Optional[str]:
    return value if isinstance(value, str) else None


def as_code(value) -> int:
    return value if type(value) is int and 0 <= value <= 255 else 1


def as_texts(value) -> Optional[list]:
    return value if isinstance(value, list) and all(isinstance(item, str) for item in value) else None


def as_flag(value) -> Optional[bool]:
    return value if isinstance(value, bool) else None


def as_object(value) -> Optional[dict]:
    return value if isinstance(value, dict) else None


# how a message's field is read by its declared type (a field may name its own reader: ``read`` in its metadata)
BY_TYPE = {"Optional[str]": as_text, "Optional[int]": as_strict_int, "int": as_code, "Optional[bool]": as_flag,
           "Optional[list]": as_texts, "Optional[dict]": as_object, "object": lambda value: value}
