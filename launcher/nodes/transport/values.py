"""Values off the wire read as typed values, never raising: what is not of the type reads as None (an end's code
as 1), so that each message's handler decides on typed values only; and ``Message``, the base of every message."""

from __future__ import annotations

from typing import ClassVar, Dict, Optional


class Message:
    """A message between launchers: a frozen dataclass declared ``class Name(Message, kind="its type"):``, sent as a
    JSON object whose ``type`` is its kind; every kind declared is in ``kinds`` (``messages.from_wire`` reads them)."""

    type: ClassVar[str]
    kinds: ClassVar[Dict[str, type]] = {}

    def __init_subclass__(cls, kind: str = "", **rest) -> None:
        super().__init_subclass__(**rest)
        if kind:
            assert kind not in Message.kinds, f"two messages of the kind {kind!r}"
            cls.type = kind
            Message.kinds[kind] = cls


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
