"""The whole job on every node's page: while a page (or a /job.json client) watches, this node's monitor fetches
/view.json from each other node of the job, at the same --monitor_port on the node's address, every GATHER_EVERY
seconds, in a thread of its own (FETCHERS fetches at once). A peer is untrusted: each fetch is bounded in time
(FETCH_WAIT for the whole exchange) and size (VIEW_LIMIT), and what it sends is read by
``monitor_view.peer_view``, which keeps only well-formed fields. A peer that does not answer, or answers junk,
is one row saying so; it never holds up the others, the monitor or the launcher. Nobody watching, no fetch."""

from __future__ import annotations

import socket
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Callable, Optional, Sequence, Tuple

from launcher.output import monitor_view

GATHER_EVERY = 2.0  # seconds between two rounds of fetches
FETCH_WAIT = 2.0  # seconds one fetch may take in all: connect, ask, read
VIEW_LIMIT = 512 * 1024  # bytes of one peer's answer
FETCHERS = 16  # fetches at once
WATCH_LINGER = 10.0  # seconds the fetching goes on after the last watcher asked

Peer = Tuple[int, str]  # (node rank, address)


def fetch_view(host: str, port: int, wait: float = FETCH_WAIT, limit: int = VIEW_LIMIT) -> bytes:
    """The body of a peer's /view.json; OSError (or ValueError) with one line of why not, within ``wait`` seconds."""
    try:
        data = _exchange(host, port, time.monotonic() + wait, limit)
    except TimeoutError:
        raise TimeoutError(f"no whole answer within {wait:g} s") from None
    head, _, body = data.partition(b"\r\n\r\n")
    status = head.split(b"\r\n", 1)[0].split(b" ")
    if len(status) < 2 or not status[0].startswith(b"HTTP/"):
        raise ValueError("an answer that is not HTTP")
    if status[1] != b"200":
        raise ValueError(f"HTTP {status[1].decode('ascii', 'replace')[:3]}: {body[:80].decode('utf-8', 'replace').strip()}")
    return body


def _exchange(host: str, port: int, deadline: float, limit: int) -> bytes:
    with socket.create_connection((host, port), timeout=max(0.0, deadline - time.monotonic())) as sock:
        name = f"[{host}]" if ":" in host else host
        sock.sendall(f"GET /view.json HTTP/1.0\r\nHost: {name}:{port}\r\n\r\n".encode())
        data = bytearray()
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError
            sock.settimeout(left)
            chunk = sock.recv(65536)
            if not chunk:
                return bytes(data)
            data += chunk
            if len(data) > limit:
                raise ValueError(f"an answer over {limit // 1024} KiB")


class JobViews:
    """The last view of each other node, fetched while someone watches. ``want`` (from the monitor's thread) says who
    the peers are and that someone watches; ``latest`` gives the rows; ``on_change`` is called after each round."""

    def __init__(self, port: int, on_change: Callable[[], None], fetch: Callable[[str, int], bytes] = fetch_view,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.port, self.on_change, self.fetch, self.clock = port, on_change, fetch, clock
        self.peers: Tuple[Peer, ...] = ()
        self.rows: Tuple[dict, ...] = ()
        self.wanted_until = float("-inf")
        self.lock = threading.Lock()
        self.wake = threading.Event()
        self.stopped = False
        self.thread: Optional[threading.Thread] = None

    def want(self, peers: Sequence[Peer]) -> None:
        """Someone watches (the monitor asks at each of its turns): the fetches go on every GATHER_EVERY seconds, the
        first at once when nobody watched before; a call while they go on does not hasten them."""
        with self.lock:
            now = self.clock()
            idle, self.peers, self.wanted_until = now >= self.wanted_until, tuple(peers), now + WATCH_LINGER
            if self.thread is None and self.peers and not self.stopped:  # its first round at once
                self.thread = threading.Thread(target=self._run, name="launcher-job-view", daemon=True)
                self.thread.start()
            elif idle:
                self.wake.set()

    def latest(self) -> Tuple[dict, ...]:
        return self.rows

    def close(self) -> None:
        self.stopped = True
        self.wake.set()
        if self.thread is not None:
            self.thread.join(timeout=FETCH_WAIT + 1)

    def _run(self) -> None:
        with ThreadPoolExecutor(max_workers=FETCHERS, thread_name_prefix="launcher-job-view") as pool:
            while not self.stopped:
                self.wake.clear()  # before the round: a wake-up during it is not lost
                with self.lock:
                    peers, wanted = self.peers, self.clock() < self.wanted_until
                if wanted and peers:
                    self.rows = tuple(pool.map(self._row, peers))
                    self.on_change()
                self.wake.wait(GATHER_EVERY if wanted else 60.0)

    def _row(self, peer: Peer) -> dict:
        node, host = peer
        try:
            return monitor_view.peer_view(self.fetch(host, self.port), node, host)
        except (OSError, ValueError) as e:
            return monitor_view.unreachable(node, host, str(e) or type(e).__name__)
