"""The key-value store behind torch's TCPStore, pure: each request (a ``Frame`` of
``launcher.run.tcpstore_protocol``) carried out with torch's semantics, its replies out, no I/O.

What node 0's launcher serves on MASTER_PORT (``launcher.run.store`` is the socket side): keys and
values, queues, and the clients waiting on keys, every query type as torch's own server answers it.
The requests come from the network, so nothing here trusts them: ``apply`` never raises, the store
holds at most ``limit`` bytes of keys and values, and an answer beyond ``MAX_REPLY`` is refused.
"""

from __future__ import annotations

import re
import struct
from collections import deque
from typing import NamedTuple, Optional

from launcher.run.tcpstore_protocol import (NOT_READY, READY, STOP_WAITING, WAIT_CANCELED, Frame, encode_bytes,
                                            encode_int64)
from launcher.run.tcpstore_protocol import Input  # noqa: F401 (launcher.run.store reads a client's requests with it)

MAX_REPLY = 64 * 1024 * 1024  # the largest answer (MULTI_GET, LIST_KEYS) the store writes
ENTRY_COST = 128  # bytes counted for each key, value or waiting client besides its own length
_INTEGER = re.compile(rb"[ \t\n\v\f\r]*([+-]?[0-9]+)")  # what C's strtoll reads of a value


class Result(NamedTuple):
    replies: list  # (client, bytes) in order: the asker's answer and those of the waiters it woke
    refused: str = ""  # the request was not carried out: the client is to be let go
    full: bool = False  # refused because the store would hold more than its limit


def _integer_of(value: bytes) -> Optional[int]:
    found = _INTEGER.match(value)
    n = int(found.group(1)) if found else None
    return n if n is not None and -2 ** 63 <= n < 2 ** 63 else None


def _wrapped(n: int) -> int:
    return (n + 2 ** 63) % 2 ** 64 - 2 ** 63  # int64 arithmetic, as the C++ server's


def _cost(key: bytes, value: bytes = b"") -> int:
    return len(key) + len(value) + ENTRY_COST


class KeyValueStore:
    """The store's state, with torch's semantics: keys and values, queues, and the clients waiting
    on keys (a client is any hashable the caller names its connections by)."""

    def __init__(self, limit: int = 1 << 30) -> None:
        self.limit = limit
        self.size = 0  # bytes counted against ``limit``
        self.data: dict = {}  # key -> bytearray
        self.queues: dict = {}  # key -> deque of bytes
        self.waiting: dict = {}  # key -> [client, ...] in the order they began to wait
        self.awaited: dict = {}  # client -> how many more keys it waits for
        self.waits_of: dict = {}  # client -> [key, ...] it is listed under in ``waiting``

    def apply(self, client, frame: Frame) -> Result:
        """Carry out one request of ``client``; never raises."""
        try:
            return getattr(self, f"_{frame.query.name.lower()}")(client, frame)
        except _Refused as e:
            return Result([], str(e), e.full)
        except Exception as e:  # a request the code did not foresee: the client goes, the store stays
            return Result([], f"request not carried out ({type(e).__name__})")

    def forget(self, client) -> None:
        """``client`` waits for nothing any more (it cancelled, or it is gone)."""
        self.awaited.pop(client, None)
        for key in self.waits_of.pop(client, ()):
            clients = self.waiting.get(key)
            if clients and client in clients:
                clients.remove(client)
                self.size -= _cost(key)
                if not clients:
                    del self.waiting[key]

    # ------------------------------------------------------------ the requests

    def _set(self, client, f: Frame) -> Result:
        return Result(self._store(f.keys[0], f.values[0]))

    def _multi_set(self, client, f: Frame) -> Result:
        self._room(sum(_cost(k, v) for k, v in zip(f.keys, f.values)))
        replies = []
        for key, value in zip(f.keys, f.values):
            replies += self._store(key, value)
        return Result(replies)

    def _compare_set(self, client, f: Frame) -> Result:
        key, (expected, new) = f.keys[0], f.values
        if key not in self.data:
            if expected:  # torch's answer when the key is missing: what was expected
                return Result(self._wake(key) + [(client, encode_bytes(expected))])
            return Result(self._store(key, new) + [(client, encode_bytes(new))])
        if self.data[key] == expected:
            self._store(key, new, wake=False)
        return Result(self._wake(key) + [(client, encode_bytes(bytes(self.data[key])))])

    def _get(self, client, f: Frame) -> Result:
        return Result([(client, encode_bytes(bytes(self.data.get(f.keys[0], b""))))])

    def _multi_get(self, client, f: Frame) -> Result:
        values = [self.data.get(k, b"") for k in f.keys]
        self._reply_fits(sum(len(v) + 8 for v in values))
        return Result([(client, b"".join(encode_bytes(bytes(v)) for v in values))])

    def _add(self, client, f: Frame) -> Result:
        key = f.keys[0]
        total = _wrapped(self._integer(key) + f.number) if key in self.data else f.number
        return Result(self._store(key, str(total).encode()) + [(client, encode_int64(total))])

    def _check(self, client, f: Frame) -> Result:
        return Result([(client, READY if self._all_there(f.keys) else NOT_READY)])

    def _wait(self, client, f: Frame) -> Result:
        if self._all_there(f.keys):
            return Result([(client, STOP_WAITING)])
        missing = [k for k in f.keys if k not in self.data]
        self._room(sum(_cost(k) for k in missing))
        self._listen(client, missing)
        return Result([])

    def _getnumkeys(self, client, f: Frame) -> Result:
        return Result([(client, encode_int64(len(self.data)))])

    def _delete_key(self, client, f: Frame) -> Result:
        value = self.data.pop(f.keys[0], None)
        if value is not None:
            self.size -= _cost(f.keys[0], value)
        return Result([(client, encode_int64(0 if value is None else 1))])

    def _append(self, client, f: Frame) -> Result:
        key, value = f.keys[0], f.values[0]
        if key not in self.data:
            return Result(self._store(key, value))
        self._room(len(value))
        self.data[key] += value
        self.size += len(value)
        return Result(self._wake(key))

    def _cancel_wait(self, client, f: Frame) -> Result:
        self.forget(client)
        return Result([(client, WAIT_CANCELED)])

    def _ping(self, client, f: Frame) -> Result:
        return Result([(client, struct.pack("<I", f.number))])

    def _queue_push(self, client, f: Frame) -> Result:
        key, value = f.keys[0], f.values[0]
        self._room(_cost(key, value))
        self.queues.setdefault(key, deque()).append(value)
        self.size += _cost(key, value)
        return Result(self._wake_one(key))

    def _queue_pop(self, client, f: Frame) -> Result:
        key = f.keys[0]
        queue = self.queues.get(key)
        if not queue:
            return Result([(client, encode_int64(0))])
        length, value = len(queue), queue.popleft()
        self.size -= _cost(key, value)
        if not queue:
            del self.queues[key]
        return Result([(client, encode_int64(length) + encode_bytes(value))])

    def _queue_len(self, client, f: Frame) -> Result:
        return Result([(client, encode_int64(len(self.queues.get(f.keys[0], ()))))])

    def _list_keys(self, client, f: Frame) -> Result:
        self._reply_fits(sum(len(k) + 8 for k in self.data) + 8)
        return Result([(client, encode_int64(len(self.data)) + b"".join(encode_bytes(k) for k in self.data))])

    def _barrier(self, client, f: Frame) -> Result:
        key = f.keys[0]
        count = _wrapped(self._integer(key) + 1) if key in self.data else 1
        self._room(2 * _cost(key, b"0" * 20))  # the count and this client's wait
        replies = self._store(key, str(count).encode(), wake=False)
        if count >= f.number:
            return Result(replies + self._wake(key) + [(client, STOP_WAITING)])
        self._room(_cost(key))
        self._listen(client, [key])
        return Result(replies)

    # ------------------------------------------------------------ the state

    def _store(self, key: bytes, value: bytes, wake: bool = True) -> list:
        old = self.data.get(key)
        grow = _cost(key, value) - (_cost(key, old) if old is not None else 0)
        self._room(grow)
        self.data[key] = bytearray(value)
        self.size += grow
        return self._wake(key) if wake else []

    def _room(self, grow: int) -> None:
        if grow > 0 and self.size + grow > self.limit:
            raise _Refused(f"the store would hold over {self.limit} bytes of keys and values", full=True)

    @staticmethod
    def _reply_fits(size: int) -> None:
        if size > MAX_REPLY:
            raise _Refused(f"an answer of {size} bytes (at most {MAX_REPLY})")

    def _integer(self, key: bytes) -> int:
        n = _integer_of(bytes(self.data[key]))
        if n is None:
            raise _Refused(f"the value of {key[:64]!r} is not a whole number")
        return n

    def _all_there(self, keys) -> bool:
        return all(k in self.data or self.queues.get(k) for k in keys)

    def _listen(self, client, keys) -> None:
        """``client`` waits for each of ``keys`` to be set (torch's count: a later wait replaces it)."""
        for key in keys:
            self.waiting.setdefault(key, []).append(client)
            self.waits_of.setdefault(client, []).append(key)
            self.size += _cost(key)
        self.awaited[client] = len(keys)

    def _wake(self, key: bytes) -> list:
        """Every client waiting on ``key`` counts it; those that wait for nothing more are answered."""
        replies = []
        for client in self.waiting.pop(key, ()):
            self.size -= _cost(key)
            self._unlist(client, key)
            if self._counted(client):
                replies.append((client, STOP_WAITING))
        return replies

    def _wake_one(self, key: bytes) -> list:
        """A queue item came: the first waiting client that then waits for nothing more is answered."""
        clients = self.waiting.get(key, [])
        for client in list(clients):
            if self._counted(client):
                clients.remove(client)
                self.size -= _cost(key)
                self._unlist(client, key)
                if not clients:
                    del self.waiting[key]
                return [(client, STOP_WAITING)]
        return []

    def _counted(self, client) -> bool:
        """One more of ``client``'s keys is there; whether it now waits for nothing more."""
        left = self.awaited.get(client)
        if left is None:
            return False
        if left > 1:
            self.awaited[client] = left - 1
            return False
        del self.awaited[client]
        return True

    def _unlist(self, client, key: bytes) -> None:
        keys = self.waits_of.get(client)
        if keys is not None and key in keys:
            keys.remove(key)
            if not keys:
                del self.waits_of[client]


class _Refused(Exception):
    def __init__(self, text: str, full: bool = False) -> None:
        super().__init__(text)
        self.full = full
