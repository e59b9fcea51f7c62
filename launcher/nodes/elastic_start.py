"""Joining an elastic job: which launcher keeps it, and every other launcher's link to that one.

Every launcher of the job runs the same command line (``--nnodes MIN:MAX`` with a rendezvous
endpoint HOST:PORT, no node rank). Each first tries to listen on the endpoint: the one that can is
node 0 (as torchrun's c10d, where the first to bind hosts the rendezvous) and keeps the membership
(``elastic_keeper``); the others connect to it, retrying every 0.2 s within ``join_timeout``. A
joining launcher says hello with an id of its own, its host (its end of the connection) and its
number of workers; both ends then send a heartbeat every ``keep_alive_interval``, and each counts
the other gone when its connection closes or it is silent for ``heartbeat_timeout``.

``form`` returns once this launcher's first round started (a standby waits until it takes a lost
member's place); from then on the link's thread (``serve``) passes node 0's orders (stop the
round's workers, the next round, the job's end) to the event loop's ``Inbox`` and node 0 what
happened here. Node 0's launcher leaving ends the job on every node (exit 1, saying so).

Messages are framed as the control channel frames them (``wire``). With a job token
(LAUNCHER_JOB_TOKEN) both ends prove it: the hello on a nonce of the joining launcher's (a nonce
proven once is refused again), node 0's admission on that same nonce. Every wait is bounded.
"""

from __future__ import annotations

import errno
import os
import secrets
import selectors
import socket
import threading
import time
from dataclasses import dataclass
from typing import Callable, Optional

from launcher.errors import LaunchError
from launcher.nodes import auth
from launcher.nodes import membership as mb
from launcher.nodes import messages as m
from launcher.nodes import wire
from launcher.nodes.elastic_keeper import Keeper
from launcher.nodes.endpoint import BACKLOG
from launcher.nodes.elastic_link import Inbox, JobOver, Link, StopOrder, member, members, thread_stopped
from launcher.output.messages import log
from launcher.plan.elastic import ElasticSpec
from launcher.plan.policy import one_line

RETRY_EVERY = 0.2
SEND_TIMEOUT = 2.0  # one small message to node 0; longer, and node 0 counts as gone
JOIN_WAIT = 5.0  # how long close() waits for the link's thread


class StartFailed(LaunchError):
    """The first round never formed (too few nodes within join_timeout, node 0 gone, dropped): exit 1."""

    exit_code = 1


@dataclass(frozen=True)
class Place:
    """This launcher's place in a round."""

    node_rank: int
    nodes: int
    world_size: int
    hosts: tuple  # every member's host, by node rank
    node_0: bool


def place_in(round_: m.RoundStart, node_id: str) -> Optional[Place]:
    """This launcher's place in ``round_`` (None: not a member)."""
    mine = member(round_, node_id)
    if mine is None:
        return None
    hosts = tuple(x[1] for x in members(round_))
    return Place(mine[3], len(hosts), round_.world_size, hosts, mine[3] == 0)


def own_id() -> str:
    """An id unique to this launcher's run: its host name, process id and a random part."""
    return f"{socket.gethostname()}-{os.getpid()}-{secrets.token_hex(2)}"


def form(spec: ElasticSpec, job_id: str, workers: int, token: Optional[str] = None,
         clock: Callable[[], float] = time.monotonic) -> Link:
    """This launcher's link to the job's membership once its first round started (node 0's when it can
    listen on the endpoint); ``token``: the job token (LAUNCHER_JOB_TOKEN), which every joining launcher
    proves on a nonce of its own. Its ``first`` is that round (None: a standby whose job ended with 0)."""
    listener = listen(spec.host, spec.port)
    if listener is None:
        return join(spec, job_id, workers, token, clock)
    return lead(listener, spec, job_id, workers, token, clock)


def lead(listener: socket.socket, spec: ElasticSpec, job_id: str, workers: int, token: Optional[str] = None,
         clock: Callable[[], float] = time.monotonic) -> Keeper:
    """Node 0's link, once the first round started on ``listener`` (the endpoint's); StartFailed if it cannot."""
    keeper = Keeper(listener, spec, job_id, mb.Node(own_id(), spec.host, workers), token, clock)
    if keeper.first_round() is None:
        keeper.close()
        raise StartFailed(f"the elastic job did not start: {keeper.failed_start[1]}.")
    return keeper


def join(spec: ElasticSpec, job_id: str, workers: int, token: Optional[str] = None,
         clock: Callable[[], float] = time.monotonic) -> "MemberLink":
    """Another launcher's link, once its first round started."""
    return MemberLink(spec, job_id, workers, token, clock).join()


def listen(host: str, port: int) -> Optional[socket.socket]:
    """A listener on the endpoint, or None when another launcher holds it (or the host is not this machine's)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
        sock.listen(BACKLOG)
    except OSError as e:
        sock.close()
        if e.errno in (errno.EADDRINUSE, errno.EADDRNOTAVAIL, errno.EACCES):
            return None
        raise LaunchError(f"cannot listen on the rendezvous endpoint {host}:{port} ({e.strerror}); "
                          "give another --rdzv-endpoint (the same on every node).") from None
    sock.setblocking(False)
    return sock


# ---------------------------------------------------------------- another node


class MemberLink:
    """Another launcher's link to node 0: hello, heartbeats both ways, node 0's orders in ``inbox``."""

    says_rounds = False

    def __init__(self, spec: ElasticSpec, job_id: str, workers: int, token, clock) -> None:
        self.spec, self.job_id, self.workers, self.token, self.clock = spec, job_id, workers, token, clock
        self.where = f"node 0's launcher at {spec.host}:{spec.port}"
        self.node_id = own_id()
        self.nonce = ""
        self.inbox = Inbox()
        self.sock: Optional[socket.socket] = None
        self.framer = wire.Framer(wire.sized_for(spec.max_nodes))  # a round lists every member
        self.first: Optional[m.RoundStart] = None
        self.early: list = []  # node 0's messages that came with the first round
        self.heard = clock()  # when node 0 last said anything
        self.next_beat = clock()
        self.selector: Optional[selectors.BaseSelector] = None
        self.waker: Optional[Inbox] = None
        self.thread: Optional[threading.Thread] = None
        self.stopping = False

    # ------------------------------------------------------------ until the first round

    def join(self) -> "MemberLink":
        """Connect, say hello, beat, and wait for the first round that has this launcher (bounded by
        join_timeout and a read_timeout more until admitted; then for as long as node 0 is heard)."""
        rendezvous = self.spec.rendezvous
        deadline = self.clock() + rendezvous.join_timeout
        self.sock = _connect(self.spec, self.where, deadline, self.clock)
        try:
            host = self.sock.getsockname()[0]
            nonce = self.nonce = secrets.token_hex(16)
            given = auth.proof(self.token, nonce, self.job_id, self.node_id) if self.token else None
            self.sock.sendall(wire.encode(m.to_wire(m.Hello({"job_id": self.job_id}, None, nonce, given,
                                                            node_id=self.node_id, host=host, workers=self.workers))))
            log.info("elastic job: joined %s as node %s (%s); waiting for the round to start", self.where,
                     self.node_id, host)
            self.first = self._await_round(deadline + rendezvous.read_timeout)
        except BaseException:
            self.sock.close()
            raise
        if self.first is None:  # a standby whose job finished without it
            return self
        place = place_in(self.first, self.node_id)
        log.info("elastic job: round %d: %d node(s), world size %d; this launcher is node %d",
                 self.first.number, place.nodes, self.first.world_size, place.node_rank)
        return self

    def _await_round(self, deadline: float) -> Optional[m.RoundStart]:
        admitted = False
        self.heard = self.clock()
        while True:
            now = self.clock()
            if not admitted and now >= deadline:
                raise StartFailed(f"{self.where} did not start the job in time; see node 0's messages.")
            if admitted and now - self.heard > self.spec.rendezvous.heartbeat_timeout:
                raise StartFailed(f"{self.where} went silent for {now - self.heard:.1f} s (heartbeat_timeout) before "
                                  "this launcher's round started.")
            self._beat(now)
            self.sock.settimeout(max(0.01, min(self.next_beat, deadline if not admitted else self.next_beat) - now))
            messages = self._receive(admitted)
            for i, message in enumerate(messages):
                if admitted and isinstance(message, m.Dropped) and message.code == 0:
                    log.info("elastic job: the job ended without this launcher: %s",
                             one_line(str(message.reason or "it finished"), 300))
                    return None
                if isinstance(message, (m.Refusal, m.Dropped)):
                    raise StartFailed(f"{self.where} did not take this launcher: "
                                      f"{one_line(str(message.reason or 'no reason given'), 300)}.")
                if isinstance(message, m.Admitted):
                    self._check_admission(message)
                    admitted = True
                    if message.standby:
                        log.info("elastic job: this launcher waits as a standby")
                if isinstance(message, m.RoundStart) and None not in (message.number, message.members,
                                                                      message.world_size) \
                        and member(message, self.node_id) is not None:
                    self.early = messages[i + 1:]  # what came with it: the link's thread takes it first
                    return message

    def _check_admission(self, message: m.Admitted) -> None:
        """With a job token, node 0 must prove it too: else what answers on the endpoint is not this job's."""
        if self.token is None:
            return
        expected = auth.admission_proof(self.token, self.nonce, self.job_id, self.node_id)
        if not auth.proves(message.proof, expected):
            raise StartFailed(f"{self.where} did not prove the job token (LAUNCHER_JOB_TOKEN); check that the endpoint "
                              "is this job's node 0 and every node has the same token.")

    def _beat(self, now: float) -> None:
        if now >= self.next_beat:
            try:
                self.sock.sendall(wire.encode(m.to_wire(m.Beat())))
            except OSError:
                pass  # the read sees the connection gone
            self.next_beat = now + self.spec.rendezvous.keep_alive_interval

    def _receive(self, admitted: bool) -> list:
        """What node 0 sent (blocking up to the socket's timeout); StartFailed once it closed or sent junk."""
        try:
            data = self.sock.recv(65536)
        except socket.timeout:
            return []
        except OSError:
            data = b""
        try:
            bodies = self.framer.feed(data) if data else None
        except wire.ProtocolError as e:
            raise StartFailed(f"{self.where} sent junk ({e}); check that the endpoint belongs to this job.") from None
        if bodies is None and admitted:
            raise StartFailed(f"{self.where} closed the rendezvous before this launcher's round started; node 0's "
                              "launcher leaving ends an elastic job (see its messages).")
        if bodies is None:
            raise StartFailed(f"{self.where.split(' at ')[-1]} closed the connection without an answer: the "
                              "endpoint is not this job's, or its job has ended.")
        self.heard = self.clock()
        return [m.from_wire(body) for body in bodies]

    # ------------------------------------------------------------ the event loop's side

    def serve(self) -> None:
        self.selector = selectors.DefaultSelector()
        self.waker = Inbox()
        self.selector.register(self.waker.read_fd, selectors.EVENT_READ)
        self.sock.setblocking(False)
        self.selector.register(self.sock, selectors.EVENT_READ)
        for message in self.early:
            over = self._take(message)
            if over is not None:
                self.inbox.put(over)
                self.stopping = True
        self.thread = threading.Thread(target=self._serve, name="elastic-member", daemon=True)
        self.thread.start()

    def stopped(self, round_: int) -> None:
        self.waker.put(m.Stopped(round_))

    def done(self, round_: int) -> None:
        self.waker.put(m.RoundDone(round_))

    def failed(self, round_: int, code: int, reason: str) -> None:
        self.waker.put(m.RoundFailed(round_, code, reason))

    def leave(self, code: int, reason: str) -> None:
        self.stopping = True  # its connection closes: node 0 counts this node out
        if self.waker is not None:
            self.waker.put(None)

    def close(self) -> None:
        if self.inbox.read_fd is None:
            return  # closed already
        self.stopping = True
        if thread_stopped(self.thread, self.waker, JOIN_WAIT):
            if self.selector is not None:
                self.selector.close()
                self.waker.close()
            self.sock.close()
        self.inbox.close()

    # ------------------------------------------------------------ the link's thread

    def _serve(self) -> None:
        over = None
        try:
            while over is None and not self.stopping:
                over = self._serve_once()
        except Exception as e:  # a bug here must not leave the job running without its link, silently
            over = JobOver(1, f"this launcher's link to node 0 failed ({type(e).__name__}: {e})")
        if over is not None:
            self.inbox.put(over)

    def _serve_once(self) -> Optional[JobOver]:
        now = self.clock()
        silent = now - self.heard
        if silent > self.spec.rendezvous.heartbeat_timeout:
            return JobOver(1, f"{self.where} went silent for {silent:.1f} s (heartbeat_timeout "
                              f"{self.spec.rendezvous.heartbeat_timeout:g} s); node 0's launcher leaving ends an "
                              "elastic job")
        if now >= self.next_beat:  # node 0 has not beaten for two intervals: beat by itself
            self._send(m.Beat())
            self.next_beat = now + 2 * self.spec.rendezvous.keep_alive_interval
        wait = max(0.0, min(self.next_beat, self.heard + self.spec.rendezvous.heartbeat_timeout) - now)
        for key, _ in self.selector.select(min(wait, 1.0)):
            if key.fileobj == self.waker.read_fd:
                for message in self.waker.take():
                    if message is not None:
                        self._send(message)
                continue
            over = self._read()
            if over is not None:
                return over
        return None

    def _read(self) -> Optional[JobOver]:
        try:
            data = self.sock.recv(65536)
            bodies = self.framer.feed(data) if data else None
        except BlockingIOError:
            return None
        except (OSError, wire.ProtocolError):
            bodies = None
        if bodies is None:
            return JobOver(1, f"{self.where} closed the connection; node 0's launcher leaving ends an elastic job")
        self.heard = self.clock()
        for body in bodies:
            over = self._take(m.from_wire(body))
            if over is not None:
                return over
        return None

    def _take(self, message) -> Optional[JobOver]:
        """Node 0's word for the event loop: a round that has this launcher, a stop, or the end (returned);
        its heartbeat is answered at once (node 0 then hears every launcher in one burst)."""
        if isinstance(message, m.Beat):
            self._send(m.Beat())
            self.next_beat = self.clock() + 2 * self.spec.rendezvous.keep_alive_interval
        elif isinstance(message, m.RoundStart) and None not in (message.number, message.members, message.world_size) \
                and member(message, self.node_id) is not None:
            self.inbox.put(message)
        elif isinstance(message, m.StopWorkers) and message.round is not None:
            self.inbox.put(StopOrder(message.round, message.reason or "node 0 re-forms the job"))
        elif isinstance(message, (m.Dropped, m.Refusal)):
            code = message.code if isinstance(message, m.Dropped) else 1
            return JobOver(code, one_line(str(message.reason or "node 0 gave no reason"), 300))
        return None

    def _send(self, message) -> None:
        try:
            self.sock.settimeout(SEND_TIMEOUT)
            self.sock.sendall(wire.encode(m.to_wire(message)))
        except OSError:
            pass  # the read sees the connection gone
        finally:
            try:
                self.sock.setblocking(False)
            except OSError:
                pass


def _connect(spec: ElasticSpec, where: str, deadline: float, clock) -> socket.socket:
    while True:
        try:
            return socket.create_connection((spec.host, spec.port), timeout=max(0.1, min(1.0, deadline - clock())))
        except OSError as e:
            if clock() + RETRY_EVERY >= deadline:
                raise StartFailed(f"could not reach {where} within {spec.rendezvous.join_timeout:g} s (join_timeout; "
                                  f"last: {e.strerror or e}); check that node 0 runs and the endpoint is its "
                                  "address.") from None
            time.sleep(RETRY_EVERY)
