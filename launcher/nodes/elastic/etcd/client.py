"""The etcd calls an etcd rendezvous makes, written down as ``KeyValue`` (a ``typing.Protocol``), and their
implementation on etcd3gw, a client of etcd's v3 JSON gateway.

Why etcd3gw: it is maintained (OpenStack's, releases into 2026), it speaks etcd's v3 API over HTTP
with JSON, so it needs no gRPC and no protobuf at all (Paddle 2.6 pins protobuf below 5, torch and
other gRPC clients want newer ones: nothing here can clash with them), and it is small (requests,
futurist, pbr). It is the extra ``pip install 'launcher[etcd]'``; the launcher itself stays click,
psutil and pyyaml. From etcd3gw this module takes the HTTP session (TLS files, timeouts), the API
path and its errors; the requests are etcd's own v3 messages (lease, range, txn, watch), so that
every answer carries the revision the rendezvous needs.

Every call goes to the current endpoint; one that cannot be reached or does not answer in time
(or has no leader) moves the client on to the next member, and the call is tried once on each
member before it fails with ``Unavailable``. With a user, the client logs in (``auth/authenticate``)
and logs in again when etcd says the token expired. A watch reads its stream in a thread of its own
and reports each batch of events, or its end, through callbacks; nothing it reads can raise out of
it (a line that is not JSON ends the watch, and the link watches again from the last revision).
"""

from __future__ import annotations

import base64
import json
import os
import threading
from dataclasses import dataclass
from typing import Callable, List, Optional, Protocol, Tuple

from launcher.errors import LaunchError
from launcher.plan.etcd import EtcdSpec

LINE_LIMIT = 64 << 20  # bytes of one watch response (etcd's own request limit is 1.5 MiB by default)


class Unavailable(Exception):
    """No member of the etcd cluster answered (or each answered without a leader) within the timeout."""


class Refused(Exception):
    """etcd answered, and said no: wrong user or password, no permission, a request it does not take."""


@dataclass(frozen=True)
class Entry:
    """One key as etcd keeps it (a watch event's, too: ``deleted`` for a DELETE)."""

    key: str
    value: str
    create_revision: int
    mod_revision: int
    lease: int = 0
    deleted: bool = False


class Watch(Protocol):
    def stop(self) -> None: ...


class KeyValue(Protocol):
    """What the rendezvous asks of etcd."""

    def grant(self, ttl: int) -> int: ...  # a lease id

    def keepalive(self, lease: int) -> int: ...  # the lease's TTL now; 0: it expired

    def revoke(self, lease: int) -> None: ...

    def range(self, prefix: str, end: Optional[str] = None) -> Tuple[int, List[Entry]]: ...
    # (revision, every key under the prefix; with ``end``: every key from ``prefix`` up to, not including, ``end``)

    def txn(self, compare: list, success: list, failure: list = ()) -> Tuple[bool, int]: ...  # (succeeded, revision)

    def put(self, key: str, value: str, lease: int = 0) -> int: ...  # the revision

    def delete_prefix(self, prefix: str) -> None: ...

    def watch(self, prefix: str, start_revision: int, on_events: Callable[[List[Entry]], None],
              on_end: Callable[[str], None], end: Optional[str] = None) -> Watch: ...  # the keys range() reads

    def close(self) -> None: ...


# ---------------------------------------------------------------- the v3 messages


def b64(text: str) -> str:
    return base64.b64encode(text.encode()).decode()


def prefix_end(prefix: str) -> str:
    """The range end that makes a range of every key starting with ``prefix`` (its last byte plus one)."""
    raw = bytearray(prefix.encode())
    raw[-1] += 1
    return base64.b64encode(bytes(raw)).decode()


def range_end(prefix: str, end: Optional[str]) -> str:
    return b64(end) if end is not None else prefix_end(prefix)


def compare_created(key: str, revision: int) -> dict:
    """A txn compare: ``key`` was created at ``revision`` (0: it does not exist)."""
    return {"key": b64(key), "target": "CREATE", "result": "EQUAL", "create_revision": str(revision)}


def compare_modified(key: str, revision: int) -> dict:
    return {"key": b64(key), "target": "MOD", "result": "EQUAL", "mod_revision": str(revision)}


def put_op(key: str, value: str, lease: int = 0) -> dict:
    put = {"key": b64(key), "value": b64(value)}
    if lease:
        put["lease"] = str(lease)
    return {"request_put": put}


def entry(kv: dict, deleted: bool = False) -> Entry:
    """A key off the wire (etcd's KeyValue as the gateway writes it: int64s as strings, bytes in base64)."""
    return Entry(key=base64.b64decode(kv.get("key", "")).decode(errors="replace"),
                 value=base64.b64decode(kv.get("value", "")).decode(errors="replace"),
                 create_revision=int(kv.get("create_revision", 0)), mod_revision=int(kv.get("mod_revision", 0)),
                 lease=int(kv.get("lease", 0)), deleted=deleted)


# ---------------------------------------------------------------- on etcd3gw


class Etcd3gwClient:
    """``KeyValue`` on etcd3gw, over every endpoint of ``spec`` in turn; ``timeout``: seconds a request may take."""

    def __init__(self, spec: EtcdSpec, timeout: float) -> None:
        import etcd3gw  # the extra: imported only by a job whose membership is in etcd
        import requests  # etcd3gw's own transport

        for what, path in (("cacert", spec.cacert), ("cert", spec.cert), ("key", spec.key)):
            if path is not None and not os.access(path, os.R_OK):
                raise LaunchError(f"--rdzv-conf {what}={path} cannot be read; give the path of the PEM file.")
        self.spec, self.timeout, self.lock = spec, timeout, threading.Lock()
        self.errors = etcd3gw.exceptions
        # what etcd3gw lets through of its transport: a member gone in the middle of its answer (ChunkedEncodingError,
        # a connection reset while the body is read) is a member that gave no answer, as a refused connection is
        self.broken = requests.exceptions.RequestException
        self.clients = [etcd3gw.Etcd3Client(host=h, port=p, protocol=spec.protocol, timeout=timeout,
                                            session=_session(spec)) for h, p in spec.endpoints]
        self.current = 0
        self.token: Optional[str] = None

    # ------------------------------------------------------------ KeyValue

    def grant(self, ttl: int) -> int:
        return self.call("lease/grant", {"TTL": str(ttl)}, lambda a: int(a["ID"]))

    def keepalive(self, lease: int) -> int:
        return self.call("lease/keepalive", {"ID": str(lease)}, lambda a: int((a.get("result") or {}).get("TTL", 0)))

    def revoke(self, lease: int) -> None:
        try:
            self.call("lease/revoke", {"ID": str(lease)})
        except Refused:
            pass  # already gone

    def range(self, prefix: str, end: Optional[str] = None) -> Tuple[int, List[Entry]]:
        return self.call("kv/range", {"key": b64(prefix), "range_end": range_end(prefix, end)},
                         lambda a: (_revision(a), [entry(kv) for kv in a.get("kvs", [])]))

    def txn(self, compare: list, success: list, failure: list = ()) -> Tuple[bool, int]:
        return self.call("kv/txn", {"compare": list(compare), "success": list(success), "failure": list(failure)},
                         lambda a: (bool(a.get("succeeded")), _revision(a)))

    def put(self, key: str, value: str, lease: int = 0) -> int:
        return self.call("kv/put", put_op(key, value, lease)["request_put"], _revision)

    def delete_prefix(self, prefix: str) -> None:
        self.call("kv/deleterange", {"key": b64(prefix), "range_end": prefix_end(prefix)})

    def watch(self, prefix: str, start_revision: int, on_events, on_end, end: Optional[str] = None) -> "StreamWatch":
        client = self.clients[self.current]
        body = {"create_request": {"key": b64(prefix), "range_end": range_end(prefix, end),
                                   "start_revision": str(start_revision)}}
        # a session of its own: a stream stopped mid-response must never hand its connection back to the calls' pool
        return StreamWatch(_session(self.spec), client.get_url("/watch"), body, self.headers(), self.timeout,
                           on_events, on_end)

    def close(self) -> None:
        for client in self.clients:
            client.session.close()

    # ------------------------------------------------------------ one call, on every member in turn

    def call(self, path: str, body: dict, read: Callable[[dict], object] = lambda answer: answer):
        """``read`` of etcd's answer to ``body`` at ``path``, from the first member that gives one: Unavailable when
        none does (an answer that is not etcd's counts as none), Refused when etcd says no."""
        last = ""
        for _ in range(len(self.clients)):
            with self.lock:
                client = self.clients[self.current]
            try:
                return read(self._post(client, path, body))
            except (self.errors.ConnectionFailedError, self.errors.ConnectionTimeoutError,
                    self.errors.InternalServerError, self.errors.ApiVersionDiscoveryFailedError) as e:
                last = _detail(e)
            except self.broken as e:
                last = f"its answer broke off ({type(e).__name__})"
            except self.errors.Etcd3Exception as e:
                detail = _detail(e)
                if "no leader" not in detail and "leader changed" not in detail and "timed out" not in detail:
                    raise Refused(detail) from None
                last = detail
            except (ValueError, TypeError, KeyError, AttributeError, RecursionError) as e:  # not etcd's gateway
                last = f"an answer that is not etcd's ({type(e).__name__})"
            with self.lock:
                if self.clients[self.current] is client:
                    self.current = (self.current + 1) % len(self.clients)
        raise Unavailable(last or "no answer")

    def _post(self, client, path: str, body: dict) -> dict:
        for attempt in (1, 2):
            try:
                return client.post(client.get_url(path), json=body, headers=self.headers()) or {}
            except self.errors.Etcd3Exception as e:
                expired = "invalid auth token" in _detail(e) or "token" in _detail(e) and "expired" in _detail(e)
                if attempt == 2 or self.spec.user is None or not expired:
                    raise
                self.token = None
        raise AssertionError("unreachable")

    def headers(self) -> dict:
        if self.spec.user is None:
            return {}
        if self.token is None:
            client = self.clients[self.current]
            answer = client.post(client.get_url("auth/authenticate"),
                                 json={"name": self.spec.user, "password": self.spec.password or ""})
            self.token = answer.get("token") or ""
        return {"Authorization": self.token}


def _revision(answer: dict) -> int:
    return int(answer["header"]["revision"])


def _session(spec: EtcdSpec):
    """An HTTP session for one etcd member: the TLS files given, and nothing taken from the environment (a
    REQUESTS_CA_BUNDLE would override the CA given, a proxy variable would send etcd's traffic elsewhere)."""
    import requests

    session = requests.Session()
    session.trust_env = False
    if spec.cacert is not None:
        session.verify = spec.cacert
    if spec.cert is not None and spec.key is not None:
        session.cert = (spec.cert, spec.key)
    return session


def _detail(e: Exception) -> str:
    text = getattr(e, "detail_text", None) or str(e) or type(e).__name__
    try:
        parsed = json.loads(text)
        text = parsed.get("message") or parsed.get("error") or text
    except (ValueError, AttributeError):
        pass
    return " ".join(str(text).split())[:300]


class StreamWatch:
    """One watch stream, read in a thread of its own over a session of its own (closed at the end):
    ``on_events`` for each batch, ``on_end`` once at its end."""

    def __init__(self, session, url: str, body: dict, headers: dict, timeout: float, on_events, on_end) -> None:
        self.session, self.url, self.body, self.headers, self.timeout = session, url, body, headers, timeout
        self.on_events, self.on_end = on_events, on_end
        self.response = None
        self.stopped = False
        self.thread = threading.Thread(target=self._read, name="etcd-watch", daemon=True)
        self.thread.start()

    def stop(self) -> None:
        self.stopped = True
        response = self.response
        if response is not None:
            try:
                response.raw._fp.fp.raw._sock.shutdown(2)  # wakes the blocked read at once
            except Exception:  # noqa: S110 - best effort: the close below ends it too
                pass
            try:
                response.close()
            except Exception:  # noqa: S110
                pass

    def _read(self) -> None:
        reason = "the watch stream ended"
        try:
            self.response = self.session.post(self.url, json=self.body, headers=self.headers, stream=True,
                                              timeout=(self.timeout, None))
            if self.response.status_code != 200:
                reason = f"etcd refused the watch (HTTP {self.response.status_code})"
                return
            pending = b""
            for chunk in self.response.iter_content(chunk_size=None):
                if self.stopped:
                    return
                pending += chunk
                while b"\n" in pending:
                    line, pending = pending.split(b"\n", 1)
                    ended = self._take(line)
                    if ended is not None:
                        reason = ended
                        return
                if len(pending) > LINE_LIMIT:
                    reason = "a watch response over 64 MiB"
                    return
            if pending.strip():
                ended = self._take(pending)
                reason = ended or reason
        except Exception as e:  # the connection dropped, the member went away: the link watches again
            reason = f"the watch stream broke ({type(e).__name__})"
        finally:
            self.session.close()
            if not self.stopped:
                self.on_end(reason)

    def _take(self, line: bytes) -> Optional[str]:
        """One response of the stream; a reason when it ends the watch."""
        if not line.strip():
            return None
        try:
            result = json.loads(line).get("result")
            if not isinstance(result, dict):
                return "etcd ended the watch"
            if result.get("canceled") or result.get("compact_revision"):
                return f"etcd canceled the watch ({result.get('cancel_reason') or 'compacted'})"
            events = [entry(e["kv"], deleted=e.get("type") == "DELETE") for e in result.get("events") or []]
        except (ValueError, TypeError, KeyError, AttributeError) as e:
            return f"a watch response that is not etcd's ({type(e).__name__})"
        if events:
            self.on_events(events)
        return None


def check_extra() -> None:
    """The etcd extra is installed, or one sentence that says how (exit 2, before anything starts)."""
    try:
        import etcd3gw  # noqa: F401
    except ImportError:
        raise LaunchError("an etcd rendezvous needs the etcd client of the launcher's etcd extra; install it with "
                          "pip install 'launcher[etcd]' (etcd3gw), or give --rdzv-backend c10d.") from None

