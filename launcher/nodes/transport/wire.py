"""The wire format of the control channel: length-prefixed JSON objects, bounded, and a decoder
that refuses anything else with a ``ProtocolError``.

Each message is a JSON object with a string ``type``, preceded by its length (4 bytes, big
endian). What a reader takes is bounded by what it may need: ``MAX_MESSAGE`` until the peer has
proven who it is, then as much as the job needs (``sized_for``: a node list or a round of the job's
size; ``MAX_FRAME`` from a peer of the job, whatever the size). Nothing a peer sends makes the
decoder raise another exception: nesting, numbers and text are bounded before a handler sees them.
"""

from __future__ import annotations

import json
import struct
from typing import Optional, Protocol

MAX_MESSAGE = 64 * 1024  # from a peer not yet proven: a hello, a challenge, a refusal
MAX_FRAME = 2**32 - 1  # what the length prefix can say: a peer of the job is not limited
PER_NODE = 600  # the most one node adds to a message that lists every node: its id, host and numbers
MAX_DEPTH = 8  # nesting of lists and objects in a message; the deepest real one has 3
MAX_DIGITS = 20  # of an integer in a message: no field takes a bigger one
LENGTH = struct.Struct("!I")


class ProtocolError(Exception):
    """A peer sent something that is not a message of this protocol."""


class Sealer(Protocol):
    """What seals a message body before it is framed (``auth.Session``)."""

    def seal(self, body: bytes) -> bytes: ...


def sized_for(nodes: int) -> int:
    """The most a message that lists ``nodes`` nodes (a node list, a round) may take."""
    return min(MAX_FRAME, MAX_MESSAGE + nodes * PER_NODE)


def encode(message: dict, session: Optional[Sealer] = None) -> bytes:
    body = json.dumps(message, separators=(",", ":")).encode()
    if session is not None:
        body = session.seal(body)
    if len(body) > MAX_FRAME:
        raise ValueError(f"control message of {len(body)} bytes is over {MAX_FRAME}")
    return LENGTH.pack(len(body)) + body


def _number(text: str):
    """json's parse_float and parse_int: finite numbers of sensible size only."""
    value = float(text) if any(c in text for c in ".eE") else int(text) if len(text.lstrip("-")) <= MAX_DIGITS else None
    if value is None or value != value or value in (float("inf"), float("-inf")):
        raise ValueError(f"the number {text[:40]}")
    return value


def _refuse_constant(name: str):
    raise ValueError(f"the constant {name}")


def _check_tree(value, depth: int = 0) -> None:
    """ProtocolError for nesting deeper than MAX_DEPTH; UnicodeError for text with lone surrogates."""
    if depth > MAX_DEPTH:
        raise ProtocolError(f"a message nested deeper than {MAX_DEPTH}")
    if isinstance(value, str):
        value.encode()
    elif isinstance(value, dict):
        for key, item in value.items():
            key.encode()
            _check_tree(item, depth + 1)
    elif isinstance(value, list):
        for item in value:
            _check_tree(item, depth + 1)


def decode(body: bytes) -> dict:
    """One message from its body; ProtocolError for anything else. Nothing a peer sends raises
    another exception: nesting, numbers and text are bounded before a handler sees them."""
    try:
        message = json.loads(body.decode(), parse_float=_number, parse_int=_number, parse_constant=_refuse_constant)
        _check_tree(message)
    except RecursionError:
        raise ProtocolError(f"a message nested deeper than {MAX_DEPTH}") from None
    except (UnicodeError, ValueError):
        raise ProtocolError("a message that is not JSON") from None
    if not isinstance(message, dict) or not isinstance(message.get("type"), str):
        raise ProtocolError("a message without a type")
    return message


class Framer:
    """Cuts a byte stream into messages; ProtocolError on anything that is not one, or over ``limit``."""

    def __init__(self, limit: int = MAX_MESSAGE) -> None:
        self.buffer = bytearray()
        self.limit = limit

    def bodies(self, data: bytes) -> list:
        """The bodies of the frames completed by ``data`` (not decoded)."""
        self.buffer += data
        bodies = []
        while len(self.buffer) >= LENGTH.size:
            (size,) = LENGTH.unpack_from(self.buffer)
            if size > self.limit:
                raise ProtocolError(f"a message of {size} bytes (the limit is {self.limit})")
            if len(self.buffer) < LENGTH.size + size:
                break
            bodies.append(bytes(self.buffer[LENGTH.size:LENGTH.size + size]))
            del self.buffer[:LENGTH.size + size]
        return bodies

    def feed(self, data: bytes) -> list:
        return [decode(body) for body in self.bodies(data)]
