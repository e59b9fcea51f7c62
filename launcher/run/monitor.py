"""``--monitor_port``: this node's view of the job over HTTP, served by one thread of its own that never touches the
launch: the event loop publishes a ``NodeView`` (immutable) about twice a second, the thread serves the last one.

What a client can do to it is bounded: at most MAX_CLIENTS connections waiting to send their request (one more pushes
the oldest out) and MAX_CLIENTS streams (one more is closed at once), a request's
head at most HEAD_LIMIT bytes, the whole exchange REQUEST_WAIT seconds (the rest of a huge request is never read),
and at most SEND_LIMIT bytes waiting for a stream's client that does not read (then it is dropped). No client can stall the launcher,
its logs or the other clients. Paths: /metrics, /healthz, /status.json, /view.json, /job.json (this node's view and
the other nodes' rows: ``launcher.run.job_view``), /events (server-sent events of /job.json), / (the live page)."""

from __future__ import annotations

import json
import os
import selectors
import socket
import threading
import time
from dataclasses import dataclass, field
from typing import Callable, Optional

from launcher.host.preflight import monitor_refused
from launcher.nodes.transport.listener import Listener, bind
from launcher.output import monitor_view
from launcher.run.job_view import JobViews

MAX_CLIENTS = 64
HEAD_LIMIT = 8192
REQUEST_WAIT = 10.0  # seconds a client has to send its request's head and take the answer
SEND_LIMIT = 1 << 20  # bytes waiting for one client before it is dropped
KEEP_ALIVE = 15.0  # seconds between two comments on an idle event stream (proxies close silent ones)


@dataclass
class Client:
    sock: socket.socket
    since: float
    head: bytearray = field(default_factory=bytearray)
    out: bytearray = field(default_factory=bytearray)
    streaming: bool = False  # /events: the next views are sent as they come
    closing: bool = False  # close once ``out`` is sent
    sent_at: float = 0.0


class Monitor:
    def __init__(self, host: str, port: int, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock  # prometheus_client is there: launcher.host.preflight.check_monitor said so
        try:
            self.listener = Listener(bind(host, port), "monitor", MAX_CLIENTS)
        except OSError as e:  # taken since the check before the start
            raise monitor_refused(host, port, e) from None
        self.host, self.port = host, self.listener.sock.getsockname()[1]
        # the other nodes serve at the same port: known when it was given, not when each node picked a free one
        self.job_views = JobViews(port, self._wake) if port else None
        self.view: Optional[monitor_view.NodeView] = None
        self.clients: dict = {}  # fd -> Client
        self.wake_r, self.wake_w = os.pipe2(os.O_CLOEXEC | os.O_NONBLOCK)
        self.stopped = False
        self.selector = selectors.DefaultSelector()
        self.thread = threading.Thread(target=self._serve, name="launcher-monitor", daemon=True)

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}/"

    def start(self) -> None:
        self.thread.start()

    def publish(self, view: monitor_view.NodeView, now: float) -> None:
        """The view served from now on (from the event loop's thread); streams get it at once."""
        self.view = view
        self._wake()

    def close(self) -> None:
        self.stopped = True
        self._wake()
        if self.thread.ident is not None:  # started
            self.thread.join(timeout=5)
        if self.job_views is not None:
            self.job_views.close()
        for client in list(self.clients.values()):
            client.sock.close()
        self.listener.close()
        os.close(self.wake_r)
        os.close(self.wake_w)

    def _wake(self) -> None:
        try:
            os.write(self.wake_w, b"x")
        except OSError:  # full: it wakes anyway
            pass

    # ------------------------------------------------------------ the thread

    def _serve(self) -> None:
        self.selector.register(self.wake_r, selectors.EVENT_READ, "wake")
        sent_view = sent_peers = None
        while not self.stopped:
            self.listener.watch_with(self.selector, self.clock(), "listener")
            for key, mask in self.selector.select(self._timeout()):
                if key.data == "listener":
                    self._accept()
                elif key.data == "wake":
                    _drain(self.wake_r)
                else:
                    self._ready(key.data, mask)
            now = self.clock()
            view = self.view
            streaming = any(c.streaming for c in self.clients.values())
            peers = self._peers(view, watched=True) if streaming else None  # no page open: no other node's row
            fresh = view is not sent_view or peers != sent_peers
            for client in list(self.clients.values()):
                if client.streaming and (fresh or now - client.sent_at >= KEEP_ALIVE):
                    self._send(client, _event(view, peers) if fresh else b": still here\n\n", now)
                elif not client.streaming and now - client.since > REQUEST_WAIT:
                    self._drop(client)
            sent_view, sent_peers = view, peers
        self.selector.close()

    def _peers(self, view, watched: bool) -> Optional[tuple]:
        """The other nodes' rows (fetched while ``watched``: a page or a /job.json client is there)."""
        if view is None:
            return None
        others = [(node, ip) for node, ip in enumerate(view.node_ips) if node != view.node]
        if self.job_views is None:
            return tuple(monitor_view.unreachable(node, ip, "the job's page needs the same fixed --monitor_port on "
                                                  "every node (this one picked a free port)") for node, ip in others)
        if watched and others:
            self.job_views.want(others)
        rows = {row["node"]: row for row in self.job_views.latest()}
        return tuple(rows.get(node) or monitor_view.unreachable(node, ip, "not heard from yet") for node, ip in others)

    def _timeout(self) -> float:
        wait = 1.0 if self.clients else 60.0
        resume = self.listener.next_deadline()  # the end of a pause out of descriptors
        return wait if resume is None else max(0.0, min(wait, resume - self.clock()))

    def _accept(self) -> None:
        now = self.clock()
        new, pushed_out = self.listener.accept(now)
        for sock in pushed_out:
            self._drop(self.clients[sock.fileno()])
        asked = sum(c.sock not in self.listener.pending for c in self.clients.values())
        for sock, _ in new:
            if asked >= MAX_CLIENTS:  # as many clients that asked (streams, most) as it serves
                self.listener.settled(sock)
                sock.close()
                continue
            client = Client(sock, now)
            self.clients[sock.fileno()] = client
            self.selector.register(sock, selectors.EVENT_READ, client)

    def _ready(self, client: Client, mask: int) -> None:
        if mask & selectors.EVENT_READ and not client.closing and not client.streaming:
            try:
                data = client.sock.recv(HEAD_LIMIT + 1 - len(client.head))
            except (BlockingIOError, InterruptedError):
                data = None
            except OSError:
                return self._drop(client)
            if data == b"":
                return self._drop(client)
            if data:
                client.head += data
                self._maybe_answer(client)
        elif mask & selectors.EVENT_READ:  # a streaming client said more, or left
            try:
                if client.sock.recv(4096) == b"":
                    return self._drop(client)
            except (BlockingIOError, InterruptedError):
                pass
            except OSError:
                return self._drop(client)
        if mask & selectors.EVENT_WRITE and client.sock.fileno() in self.clients:
            self._flush(client)

    def _maybe_answer(self, client: Client) -> None:
        end = client.head.find(b"\r\n\r\n")
        if end < 0 and len(client.head) <= HEAD_LIMIT:
            return
        self.listener.settled(client.sock)  # it asked
        if end < 0:
            return self._answer(client, 431, b"request head over 8 KiB\n", "text/plain")
        line = bytes(client.head[:client.head.find(b"\r\n")]).split(b" ")
        if len(line) != 3 or line[0] not in (b"GET", b"HEAD"):
            return self._answer(client, 405, b"GET only\n", "text/plain")
        path = line[1].split(b"?", 1)[0].decode("ascii", "replace")
        view = self.view
        if path == "/events":  # the views as they come (the first one at once, once there is one)
            client.streaming = True
            client.out += (b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nCache-Control: no-store\r\n"
                           b"Connection: keep-alive\r\n\r\n")
            return self._send(client, _event(view, self._peers(view, watched=True)) if view is not None
                              else b": starting\n\n", self.clock())
        if view is None and path not in ("/", "/favicon.ico"):
            return self._answer(client, 503, b"starting\n", "text/plain")
        routes = {
            "/metrics": lambda: (200, monitor_view.metrics(view), "text/plain; version=0.0.4; charset=utf-8"),
            "/healthz": lambda: _health(view),
            "/status.json": lambda: (200, _json(view.status), "application/json"),
            "/view.json": lambda: (200, monitor_view.view_json(view), "application/json"),
            "/job.json": lambda: (200, monitor_view.view_json(view, self._peers(view, watched=True)), "application/json"),
            "/": lambda: (200, monitor_view.PAGE, "text/html; charset=utf-8"),
            "/favicon.ico": lambda: (204, b"", "image/x-icon"),
        }
        if path not in routes:
            return self._answer(client, 404, b"no such page: /, /metrics, /healthz, /status.json, /view.json, /job.json, /events\n",
                                "text/plain")
        code, body, kind = routes[path]()
        self._answer(client, code, body if line[0] == b"GET" else b"", kind, len(body))

    def _answer(self, client: Client, code: int, body: bytes, kind: str, length: Optional[int] = None) -> None:
        reason = {200: "OK", 204: "No Content", 404: "Not Found", 405: "Method Not Allowed", 431: "Request Header Fields Too Large",
                  503: "Service Unavailable"}[code]
        client.out += (f"HTTP/1.1 {code} {reason}\r\nContent-Type: {kind}\r\nContent-Length: "
                       f"{len(body) if length is None else length}\r\nCache-Control: no-store\r\nConnection: close\r\n\r\n"
                       ).encode() + body
        client.closing = True
        self._flush(client)

    def _send(self, client: Client, data: bytes, now: float) -> None:
        if len(client.out) + len(data) > SEND_LIMIT:
            return self._drop(client)  # it does not read: its stream ends, the others go on
        client.out += data
        client.sent_at = now
        self._flush(client)

    def _flush(self, client: Client) -> None:
        try:
            while client.out:
                sent = client.sock.send(client.out)
                del client.out[:sent]
        except (BlockingIOError, InterruptedError):
            pass
        except OSError:
            return self._drop(client)
        if not client.out and client.closing:
            return self._drop(client)
        wanted = (0 if client.closing else selectors.EVENT_READ) | (selectors.EVENT_WRITE if client.out else 0)
        self.selector.modify(client.sock, wanted, client)

    def _drop(self, client: Client) -> None:
        self.listener.settled(client.sock)
        fd = client.sock.fileno()
        if self.clients.pop(fd, None) is not None:
            self.selector.unregister(client.sock)
        client.sock.close()


def _event(view, peers) -> bytes:
    return b"data: " + monitor_view.view_json(view, peers) + b"\n\n"


def _health(view) -> tuple:
    code, text = monitor_view.health(view)
    return code, (text + "\n").encode(), "text/plain; charset=utf-8"


def _json(doc) -> bytes:
    return json.dumps(doc, default=str, ensure_ascii=True).encode()


def _drain(fd: int) -> None:
    try:
        while os.read(fd, 4096):
            pass
    except OSError:
        pass
