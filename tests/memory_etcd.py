"""etcd 3.4's model, the part of it the etcd link uses, in memory and on a clock the test gives: one
revision counter for the whole store; keys with their create and mod revisions and lease; leases with a
TTL that lapse on that clock; watches that get every event after their start revision, in order, and end
when that revision is compacted; transactions guarded by a key's create or mod revision (the v3 JSON
gateway's compare dicts, as ``launcher.nodes.elastic.etcd.client`` writes them).

Each launcher gets a client of its own (``client()``), which a test can cut off (``Unavailable`` on every
call) or close. Events are delivered in the calling thread, in revision order, before the call returns,
so a history replays the same way every time.
tests/integration/test_etcd_endpoints.py::test_the_memory_double_behaves_like_etcd runs the same operations on a real etcd 3.4 and on this, and compares what they answer. ``end_watches`` is
etcd ending every watch (a compaction they were behind, a member's restart).
"""

from __future__ import annotations

import base64
import threading
from dataclasses import dataclass, replace
from typing import Callable, Dict, List, Optional, Tuple

from launcher.nodes.elastic.etcd.client import Entry, Refused, Unavailable


def _text(b64: str) -> str:
    return base64.b64decode(b64).decode()


def _in(key: str, prefix: str, end: Optional[str]) -> bool:
    return prefix <= key < end if end is not None else key.startswith(prefix)


@dataclass
class _Lease:
    ttl: int
    expires: float


@dataclass
class _Watch:
    prefix: str
    end: Optional[str]
    on_events: Callable[[List[Entry]], None]
    on_end: Callable[[str], None]
    next_revision: int
    stopped: bool = False

    def stop(self) -> None:
        self.stopped = True


class MemoryEtcd:
    def __init__(self, clock: Callable[[], float]) -> None:
        self.clock = clock
        self.lock = threading.RLock()
        self.revision = 1  # a new etcd's
        self.keys: Dict[str, Entry] = {}
        self.leases: Dict[int, _Lease] = {}
        self.next_lease = 0x1000
        self.history: List[Tuple[int, List[Entry]]] = []  # (revision, its events)
        self.compacted = 0
        self.watches: List[_Watch] = []

    def client(self) -> "MemoryClient":
        return MemoryClient(self)

    # ------------------------------------------------------------ time and compaction

    def expire(self) -> None:
        """Every lease past its TTL on the clock lapses, with its keys (one revision for all of a lease's keys)."""
        with self.lock:
            now = self.clock()
            for lease_id in [i for i, lease in self.leases.items() if now >= lease.expires]:
                self._revoke(lease_id)

    def compact(self, revision: Optional[int] = None) -> None:
        """History before ``revision`` (default: the current one) is gone: a watch that still needs it ends."""
        with self.lock:
            self.compacted = self.revision if revision is None else revision
            self.history = [h for h in self.history if h[0] >= self.compacted]
            for watch in list(self.watches):
                if watch.next_revision < self.compacted:
                    self._end(watch, "etcd canceled the watch (compacted)")

    def end_watches(self, reason: str = "etcd canceled the watch (compacted)") -> None:
        """etcd ends every watch: a member restarted, or each watch was behind the history etcd compacted."""
        with self.lock:
            for watch in list(self.watches):
                self._end(watch, reason)

    # ------------------------------------------------------------ the operations, under the lock

    def grant(self, ttl: int) -> int:
        self.expire()
        with self.lock:
            self.next_lease += 1
            self.leases[self.next_lease] = _Lease(ttl, self.clock() + ttl)
            return self.next_lease

    def keepalive(self, lease_id: int) -> int:
        self.expire()
        with self.lock:
            lease = self.leases.get(lease_id)
            if lease is None:
                return 0
            lease.expires = self.clock() + lease.ttl
            return lease.ttl

    def revoke(self, lease_id: int) -> None:
        self.expire()
        with self.lock:
            if lease_id in self.leases:
                self._revoke(lease_id)

    def range(self, prefix: str, end: Optional[str]) -> Tuple[int, List[Entry]]:
        self.expire()
        with self.lock:
            return self.revision, [e for k, e in sorted(self.keys.items()) if _in(k, prefix, end)]

    def put(self, key: str, value: str, lease: int) -> int:
        self.expire()
        with self.lock:
            self._check_lease(lease)
            self._commit([self._put(key, value, lease)])
            return self.revision

    def delete_prefix(self, prefix: str) -> None:
        self.expire()
        with self.lock:
            gone = [self._deleted(k) for k in sorted(self.keys) if k.startswith(prefix)]
            if gone:
                self._commit(gone)

    def txn(self, compare: list, success: list, failure: list) -> Tuple[bool, int]:
        self.expire()
        with self.lock:
            ok = all(self._holds(c) for c in compare)
            ops = success if ok else failure
            for op in ops:
                self._check_lease(int(op["request_put"].get("lease", 0)))
            events = [self._put(_text(op["request_put"]["key"]), _text(op["request_put"]["value"]),
                                int(op["request_put"].get("lease", 0))) for op in ops]
            if events:
                self._commit(events)
            return ok, self.revision

    def watch(self, prefix: str, start_revision: int, on_events, on_end, end: Optional[str]) -> _Watch:
        with self.lock:
            watch = _Watch(prefix, end, on_events, on_end, start_revision)
            if start_revision < self.compacted:
                self._end(watch, "etcd canceled the watch (compacted)")
                return watch
            self.watches.append(watch)
            for revision, events in self.history:
                if revision >= start_revision:
                    self._deliver(watch, revision, events)
            return watch

    # ------------------------------------------------------------ inside

    def _check_lease(self, lease: int) -> None:
        if lease and lease not in self.leases:
            raise Refused("etcdserver: requested lease not found")

    def _holds(self, compare: dict) -> bool:
        entry = self.keys.get(_text(compare["key"]))
        if compare["target"] == "CREATE":
            got, want = (entry.create_revision if entry else 0), int(compare["create_revision"])
        else:
            got, want = (entry.mod_revision if entry else 0), int(compare["mod_revision"])
        assert compare["result"] == "EQUAL", compare
        return got == want

    def _put(self, key: str, value: str, lease: int) -> Entry:
        before = self.keys.get(key)
        created = before.create_revision if before else self.revision + 1
        return Entry(key, value, created, self.revision + 1, lease)

    def _deleted(self, key: str) -> Entry:
        return replace(self.keys[key], mod_revision=self.revision + 1, deleted=True)

    def _revoke(self, lease_id: int) -> None:
        del self.leases[lease_id]
        gone = [self._deleted(k) for k, e in sorted(self.keys.items()) if e.lease == lease_id]
        if gone:
            self._commit(gone)

    def _commit(self, events: List[Entry]) -> None:
        self.revision += 1
        for e in events:
            if e.deleted:
                self.keys.pop(e.key, None)
            else:
                self.keys[e.key] = e
        self.history.append((self.revision, events))
        for watch in list(self.watches):
            self._deliver(watch, self.revision, events)

    def _deliver(self, watch: _Watch, revision: int, events: List[Entry]) -> None:
        if watch.stopped:
            self.watches.remove(watch)
            return
        mine = [e for e in events if _in(e.key, watch.prefix, watch.end)]
        watch.next_revision = revision + 1
        if mine:
            watch.on_events(mine)

    def _end(self, watch: _Watch, reason: str) -> None:
        if watch in self.watches:
            self.watches.remove(watch)
        watch.stopped = True
        watch.on_end(reason)


class MemoryClient:
    """One launcher's client of a ``MemoryEtcd`` (``KeyValue``): a test cuts it off with ``cut = True``."""

    def __init__(self, store: MemoryEtcd) -> None:
        self.store = store
        self.cut = False
        self.closed = False

    def _reach(self) -> MemoryEtcd:
        if self.cut:
            raise Unavailable("connection refused (cut off by the test)")
        return self.store

    def grant(self, ttl: int) -> int:
        return self._reach().grant(ttl)

    def keepalive(self, lease: int) -> int:
        return self._reach().keepalive(lease)

    def revoke(self, lease: int) -> None:
        self._reach().revoke(lease)

    def range(self, prefix: str, end: Optional[str] = None) -> Tuple[int, List[Entry]]:
        return self._reach().range(prefix, end)

    def txn(self, compare: list, success: list, failure: list = ()) -> Tuple[bool, int]:
        return self._reach().txn(compare, success, list(failure))

    def put(self, key: str, value: str, lease: int = 0) -> int:
        return self._reach().put(key, value, lease)

    def delete_prefix(self, prefix: str) -> None:
        self._reach().delete_prefix(prefix)

    def watch(self, prefix: str, start_revision: int, on_events, on_end, end: Optional[str] = None):
        return self._reach().watch(prefix, start_revision, on_events, on_end, end)

    def close(self) -> None:
        self.closed = True
