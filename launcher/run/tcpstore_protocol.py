"""torch's TCPStore wire protocol, pure: a client's bytes in, its requests out as frames, and the
encoding of the replies; no I/O, no state of the store (``launcher.run.tcpstore`` carries the
requests out, ``launcher.run.store`` is the socket side).

A client opens with VALIDATE (torch's magic number); every request after it is one query type byte and its
fields: strings and values as an unsigned 64-bit length and the bytes, numbers as 64-bit
integers, PING's nonce as 32 bits, all little-endian. SET, APPEND, MULTI_SET and QUEUE_PUSH get no
answer; WAIT and BARRIER answer STOP_WAITING once done, CANCEL_WAIT answers WAIT_CANCELED.

Versions (torch's history): VALIDATE as the first message came with torch 2.1 (pytorch#107607),
PING on every connect with 2.5 (pytorch#129985), the queue queries by 2.8, LIST_KEYS (pytorch#167883)
and BARRIER (pytorch#174920) after it; a client sends a newer query only when a program calls it.
Every query type was verified against the client of torch 2.13 (tests/integration/test_store_torch_client.py);
``launcher.plan.agent_store.OLDEST_TORCH`` is the oldest torch the launcher serves.

Input comes from the network, so nothing here trusts it: ``decode`` never raises, and a length
beyond torch's own limits (keys 8 KiB, values 8 MiB, 131,072 keys a request) or a frame beyond
``MAX_FRAME`` is refused.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from enum import IntEnum
from typing import NamedTuple, Optional

MAGIC = 0x3C85F7CE  # VALIDATE's number
MAX_KEY = 8 * 1024  # torch's limits (its libuv server's), refused alike
MAX_VALUE = 8 * 1024 * 1024
MAX_KEYS = 128 * 1024
MAX_FRAME = 2 * MAX_VALUE + MAX_KEY + 64  # the most one client's unfinished request may hold (COMPARE_SET)
STOP_WAITING, WAIT_CANCELED = b"\x00", b"\x01"
READY, NOT_READY = b"\x00", b"\x01"


class Query(IntEnum):
    VALIDATE = 0
    SET = 1
    COMPARE_SET = 2
    GET = 3
    ADD = 4
    CHECK = 5
    WAIT = 6
    GETNUMKEYS = 7
    DELETE_KEY = 8
    APPEND = 9
    MULTI_GET = 10
    MULTI_SET = 11
    CANCEL_WAIT = 12
    PING = 13
    QUEUE_PUSH = 14
    QUEUE_POP = 15
    QUEUE_LEN = 16
    LIST_KEYS = 17
    BARRIER = 18


@dataclass(frozen=True)
class Frame:
    """One request: its query type, keys, values (bytes), and its number (ADD's amount, BARRIER's
    world size, PING's nonce, VALIDATE's magic)."""

    query: Query
    keys: tuple = ()
    values: tuple = ()
    number: int = 0


class Decoded(NamedTuple):
    frame: Optional[Frame]  # None: incomplete, or bad (then ``problem`` says why)
    end: int  # where the next request starts
    problem: str = ""


class _Short(Exception):
    """The request goes on past the bytes received so far."""


class _Bad(Exception):
    """The bytes are not a request torch's client sends."""


class _Reader:
    def __init__(self, data, pos: int) -> None:
        self.data, self.pos = data, pos

    def take(self, n: int):
        end = self.pos + n
        if end > len(self.data):
            raise _Short()
        part = bytes(self.data[self.pos:end])
        self.pos = end
        return part

    def number(self, fmt: str) -> int:
        return struct.unpack(fmt, self.take(struct.calcsize(fmt)))[0]

    def sized(self, limit: int, what: str) -> bytes:
        n = self.number("<Q")
        if n > limit:
            raise _Bad(f"a {what} of {n} bytes (at most {limit})")
        return self.take(n)

    def key(self) -> bytes:
        return self.sized(MAX_KEY, "key")

    def value(self) -> bytes:
        return self.sized(MAX_VALUE, "value")

    def count(self) -> int:
        n = self.number("<Q")
        if n > MAX_KEYS:
            raise _Bad(f"{n} keys in one request (at most {MAX_KEYS})")
        return n


def _fields(query: Query, r: _Reader) -> Frame:
    if query in (Query.VALIDATE, Query.PING):
        return Frame(query, number=r.number("<I"))
    if query in (Query.SET, Query.APPEND, Query.QUEUE_PUSH):
        return Frame(query, (r.key(),), (r.value(),))
    if query == Query.COMPARE_SET:
        return Frame(query, (r.key(),), (r.value(), r.value()))
    if query in (Query.GET, Query.DELETE_KEY, Query.QUEUE_POP, Query.QUEUE_LEN):
        return Frame(query, (r.key(),))
    if query in (Query.ADD, Query.BARRIER):
        return Frame(query, (r.key(),), number=r.number("<q"))
    if query in (Query.CHECK, Query.WAIT, Query.MULTI_GET):
        return Frame(query, tuple(r.key() for _ in range(r.count())))
    if query == Query.MULTI_SET:
        pairs = [(r.key(), r.value()) for _ in range(r.count())]
        return Frame(query, tuple(k for k, _ in pairs), tuple(v for _, v in pairs))
    return Frame(query)  # GETNUMKEYS, CANCEL_WAIT, LIST_KEYS: the type byte alone


def decode(data, start: int = 0) -> Decoded:
    """The request at ``data[start:]``: a frame, incomplete (no frame, no problem), or bad. Never raises."""
    r = _Reader(data, start)
    try:
        kind = r.number("<B")
        if kind >= len(Query):
            raise _Bad(f"unknown query type {kind}")
        frame = _fields(Query(kind), r)
    except _Short:
        return Decoded(None, start)
    except _Bad as e:
        return Decoded(None, start, str(e))
    except Exception as e:  # nothing on the wire may stop the store
        return Decoded(None, start, f"undecodable ({type(e).__name__})")
    return Decoded(frame, r.pos)


class Input:
    """One client's bytes, cut into requests: the first must be VALIDATE with torch's magic number,
    no VALIDATE after it, and an unfinished request may hold at most ``limit`` bytes."""

    def __init__(self, limit: int = MAX_FRAME) -> None:
        self.buffer = bytearray()
        self.pos = 0  # where the next request starts in ``buffer``
        self.validated = False
        self.limit = limit

    def feed(self, data: bytes) -> None:
        self.buffer += data

    def take(self) -> tuple:
        """(the next complete request or None, a problem or ""): after a problem the client is to be let go."""
        while True:
            frame, end, problem = decode(self.buffer, self.pos)
            if frame is None:
                del self.buffer[:self.pos]
                self.pos = 0
                if not problem and len(self.buffer) > self.limit:
                    problem = f"an unfinished request of over {self.limit} bytes"
                return None, problem
            self.pos = end
            problem = self._order(frame)
            if problem or frame.query != Query.VALIDATE:
                return (None if problem else frame), problem

    def held(self) -> int:
        return len(self.buffer)

    def _order(self, frame: Frame) -> str:
        if self.validated:
            return "VALIDATE again" if frame.query == Query.VALIDATE else ""
        if frame.query != Query.VALIDATE or frame.number != MAGIC:
            return "no VALIDATE with torch's magic number first"
        self.validated = True
        return ""


# ---------------------------------------------------------------- the replies


def encode_bytes(value: bytes) -> bytes:
    """A string or value as a reply carries it: its length (unsigned 64 bits) and the bytes."""
    return struct.pack("<Q", len(value)) + value


def encode_int64(n: int) -> bytes:
    """A number as a reply carries it: signed 64 bits."""
    return struct.pack("<q", n)
