"""Forming an elastic job's first round before planning: which node this launcher is, of how many.

Every launcher of the job runs the same command line (``--nnodes MIN:MAX`` with a rendezvous
endpoint HOST:PORT, no node rank). Each first tries to listen on the endpoint: the one that can is
node 0 (as torchrun's c10d, where the first to bind hosts the rendezvous); the others connect to it,
retrying every 0.2 s within ``join_timeout``. A joining launcher says hello with an id of its own,
its host (its end of the connection) and its number of workers, and sends a heartbeat every
``keep_alive_interval``. Node 0 keeps the membership (``launcher.nodes.membership``: MAX nodes start
the round at once, MIN nodes once ``last_call_timeout`` has passed; a launcher silent for
``heartbeat_timeout`` or whose connection closes is lost), and sends each member the round
(``messages.RoundStart``); then every launcher runs the job as a fixed one of that many nodes, at its
node rank (node 0's launcher keeps the control channel one port below the endpoint, rank 0's store
is on the endpoint's port). Below MIN after ``join_timeout``, node 0 ends the start, naming who is
missing, and tells the launchers that joined (``messages.Dropped``): each exits 1.

Messages are framed as the control channel frames them (``wire``); what a stranger sends (junk, no
hello, another job's id, a hello that does not prove the job token) only loses its connection. With a
job token (LAUNCHER_JOB_TOKEN) each hello proves it on a nonce of the joining launcher's (``auth.proof``;
a nonce proven once is refused again); node 0's answers are not proven here: the control channel of
the job that follows proves both ends. Every wait is bounded.
"""

from __future__ import annotations

import errno
import os
import secrets
import selectors
import socket
import time
from dataclasses import dataclass
from typing import Callable, Optional

from launcher.errors import LaunchError
from launcher.nodes import auth
from launcher.nodes import membership as mb
from launcher.nodes import messages as m
from launcher.nodes import wire
from launcher.nodes.endpoint import MAX_PENDING
from launcher.output.messages import log
from launcher.plan.elastic import ElasticSpec
from launcher.plan.policy import Say, one_line

RETRY_EVERY = 0.2
SEND_TIMEOUT = 2.0  # one small message to a peer; longer, and the peer counts as gone
CLOSE_WAIT = 2.0  # node 0 waits this long for the members to close first (their ends keep TIME_WAIT)


class StartFailed(LaunchError):
    """The first round never formed (too few nodes within join_timeout, node 0 gone, dropped): exit 1."""

    exit_code = 1


@dataclass(frozen=True)
class Place:
    """This launcher's place in the first round."""

    node_rank: int
    nodes: int
    world_size: int
    node_0: bool


def own_id() -> str:
    """An id unique to this launcher's run: its host name, process id and a random part."""
    return f"{socket.gethostname()}-{os.getpid()}-{secrets.token_hex(2)}"


def form(spec: ElasticSpec, job_id: str, workers: int, token: Optional[str] = None,
         clock: Callable[[], float] = time.monotonic) -> Place:
    """This launcher's place in the job's first round (node 0 when it can listen on the endpoint); ``token``:
    the job token (LAUNCHER_JOB_TOKEN), which every joining launcher proves on a nonce of its own."""
    listener = listen(spec.host, spec.port)
    if listener is None:
        return join(spec, job_id, workers, token, clock)
    try:
        return lead(listener, spec, job_id, workers, token, clock)
    finally:
        listener.close()


def listen(host: str, port: int) -> Optional[socket.socket]:
    """A listener on the endpoint, or None when another launcher holds it (or the host is not this machine's)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
        sock.listen(64)
    except OSError as e:
        sock.close()
        if e.errno in (errno.EADDRINUSE, errno.EADDRNOTAVAIL, errno.EACCES):
            return None
        raise LaunchError(f"cannot listen on the rendezvous endpoint {host}:{port} ({e.strerror}); "
                          "give another --rdzv-endpoint (the same on every node).") from None
    sock.setblocking(False)
    return sock


# ---------------------------------------------------------------- node 0


@dataclass
class _Peer:
    sock: socket.socket
    framer: wire.Framer
    node_id: Optional[str] = None


class _Leader:
    """Node 0's side: the membership fed by the connections, until round 1 starts or the start fails."""

    def __init__(self, listener, spec: ElasticSpec, job_id: str, workers: int, token, clock) -> None:
        self.listener, self.spec, self.clock, self.token, self.job_id = listener, spec, clock, token, job_id
        self.nonces: set = set()  # every nonce proven so far: a hello replayed is refused
        self.selector = selectors.DefaultSelector()
        self.selector.register(listener, selectors.EVENT_READ)
        self.peers: dict = {}  # fd -> _Peer
        self.me = mb.Node(own_id(), spec.host, workers)
        self.state, actions = mb.begin(spec, self.me, job_id, clock())
        self.outcome = None  # a Round, or (code, reason)
        self.carry_out(actions)

    def run(self) -> Place:
        log.info("elastic job: this launcher is node 0, waiting for %d to %d nodes on %s:%d",
                 self.spec.min_nodes, self.spec.max_nodes, self.spec.host, self.spec.port)
        while self.outcome is None:
            deadline = mb.next_deadline(self.state)
            wait = 1.0 if deadline is None else max(0.0, min(1.0, deadline - self.clock()))
            for key, _ in self.selector.select(wait):
                if key.fileobj is self.listener:
                    self.accept()
                else:
                    self.read(key.fileobj.fileno())
            self.decide(mb.TimePassed())
        return self.finish()

    def decide(self, event) -> None:
        if self.outcome is None:
            self.state, actions = mb.decide(self.state, event, self.clock())
            self.carry_out(actions)

    def carry_out(self, actions) -> None:
        for action in actions:
            if isinstance(action, Say):
                log.log(action.level, "elastic job: %s", action.text)
            elif isinstance(action, mb.Admit):
                self.send_to(action.node_id, m.Admitted(action.standby))
            elif isinstance(action, mb.Refuse):
                self.send_to(action.node_id, m.Refusal(action.reason), close=True)
            elif isinstance(action, mb.Drop):
                self.send_to(action.node_id, m.Dropped(action.code, action.reason), close=True)
            elif isinstance(action, mb.StartRound):
                self.outcome = action.round
            elif isinstance(action, mb.EndJob):
                self.outcome = (action.code, action.reason)

    def accept(self) -> None:
        try:
            sock, _ = self.listener.accept()
        except OSError:
            return
        pending = [fd for fd, p in self.peers.items() if p.node_id is None]
        if len(pending) >= MAX_PENDING:  # connections that never say hello cannot keep a launcher out
            self.forget(pending[0], "too many connections without a hello")
        sock.settimeout(SEND_TIMEOUT)
        self.peers[sock.fileno()] = _Peer(sock, wire.Framer())
        self.selector.register(sock, selectors.EVENT_READ)

    def read(self, fd: int) -> None:
        peer = self.peers.get(fd)
        if peer is None:
            return
        try:
            data = peer.sock.recv(65536)
            bodies = peer.framer.feed(data) if data else None
        except (OSError, wire.ProtocolError):
            bodies = None
        if bodies is None:
            self.forget(fd, "its connection closed")
            return
        for body in bodies:
            self.on_message(fd, peer, m.from_wire(body))

    def on_message(self, fd: int, peer: _Peer, message) -> None:
        if peer.node_id is None:
            if not isinstance(message, m.Hello) or message.node_id is None:
                self.forget(fd, "it said no elastic hello")
                return
            identity = message.identity or {}
            problem = self.unproven(message)
            if problem is None and any(p.node_id == message.node_id for p in self.peers.values()):
                problem = f"the node id {message.node_id!r} is taken"
            if problem is not None:
                self.send(peer, m.Refusal(problem))
                self.forget(fd, problem)
                return
            peer.node_id = message.node_id
            node = mb.Node(message.node_id, message.host or "", message.workers)
            self.decide(mb.JoinAsked(node, identity.get("job_id") if isinstance(identity.get("job_id"), str) else ""))
        elif isinstance(message, m.Beat):
            self.decide(mb.Heartbeat(peer.node_id))

    def unproven(self, hello: m.Hello) -> Optional[str]:
        """Why a hello does not prove the job token (None: it does, or the job has none and it proves none)."""
        if self.token is None:
            return None if hello.proof is None else "it proves a job token, and this job has none"
        expected = auth.proof(self.token, hello.nonce or "", self.job_id, hello.node_id)
        if not auth.fresh_nonce(hello.nonce) or hello.nonce in self.nonces or not auth.proves(hello.proof, expected):
            return "wrong job or job token"
        self.nonces.add(hello.nonce)
        return None

    def forget(self, fd: int, reason: str) -> None:
        peer = self.peers.pop(fd, None)
        if peer is None:
            return
        self.selector.unregister(peer.sock)
        peer.sock.close()
        if peer.node_id is not None:
            self.decide(mb.Closed(peer.node_id))

    def send_to(self, node_id: str, message, close: bool = False) -> None:
        fd = next((fd for fd, p in self.peers.items() if p.node_id == node_id), None)
        if fd is None:
            return
        if not self.send(self.peers[fd], message) or close:
            self.forget(fd, "node 0 closed it")

    def send(self, peer: _Peer, message) -> bool:
        try:
            peer.sock.sendall(wire.encode(m.to_wire(message)))
            return True
        except OSError:
            return False

    def finish(self) -> Place:
        """Round 1 to each member (a standby is told the job started without it), or the failure to all."""
        outcome = self.outcome
        if isinstance(outcome, tuple):
            for peer in list(self.peers.values()):
                self.send(peer, m.Dropped(outcome[0], outcome[1]))
            self.close_all()
            raise StartFailed(f"the elastic job did not start: {outcome[1]}.")
        members = [[x.node.node_id, x.node.host, x.node.workers, x.node_rank, x.first_rank] for x in outcome.members]
        start = m.RoundStart(outcome.number, members, outcome.world_size, outcome.restarts)
        for peer in list(self.peers.values()):
            if outcome.member(peer.node_id or "") is not None:
                self.send(peer, start)
            else:
                self.send(peer, m.Dropped(1, f"the job started with its {len(members)} nodes; a launcher that comes "
                                             "later does not join it yet"))
        self.close_all(wait_for_them=True)
        return Place(0, len(outcome.members), outcome.world_size, True)

    def close_all(self, wait_for_them: bool = False) -> None:
        """Close every connection, after the members closed theirs (bounded by CLOSE_WAIT) when asked."""
        deadline = self.clock() + (CLOSE_WAIT if wait_for_them else 0)
        self.selector.unregister(self.listener)
        while self.peers and self.clock() < deadline:
            for key, _ in self.selector.select(max(0.0, deadline - self.clock())):
                peer = self.peers.get(key.fileobj.fileno())
                try:
                    gone = peer is None or not peer.sock.recv(65536)
                except OSError:
                    gone = True
                if gone and peer is not None:
                    self.outcome_close(key.fileobj.fileno())
        for fd in list(self.peers):
            self.outcome_close(fd)
        self.selector.close()

    def outcome_close(self, fd: int) -> None:
        peer = self.peers.pop(fd)
        self.selector.unregister(peer.sock)
        peer.sock.close()


def lead(listener, spec: ElasticSpec, job_id: str, workers: int, token: Optional[str] = None,
         clock=time.monotonic) -> Place:
    return _Leader(listener, spec, job_id, workers, token, clock).run()


# ---------------------------------------------------------------- another node


def join(spec: ElasticSpec, job_id: str, workers: int, token: Optional[str] = None, clock=time.monotonic) -> Place:
    """Connect to node 0, say hello, beat, and wait for round 1 (bounded by join_timeout and a read_timeout more)."""
    rendezvous = spec.rendezvous
    where = f"node 0's launcher at {spec.host}:{spec.port}"
    deadline = clock() + rendezvous.join_timeout
    sock = _connect(spec, where, deadline, clock)
    try:
        me = own_id()
        host = sock.getsockname()[0]
        nonce = secrets.token_hex(16)
        given = auth.proof(token, nonce, job_id, me) if token else None
        sock.sendall(wire.encode(m.to_wire(m.Hello({"job_id": job_id}, None, nonce, given, node_id=me, host=host,
                                                   workers=workers))))
        log.info("elastic job: joined %s as node %s (%s); waiting for the round to start", where, me, host)
        round_ = _await_round(sock, where, deadline + rendezvous.read_timeout, rendezvous.keep_alive_interval, clock)
    finally:
        sock.close()
    mine = next((x for x in round_.members if x[0] == me), None)
    if mine is None:
        raise StartFailed(f"{where} started round {round_.number} without this launcher; see node 0's messages.")
    log.info("elastic job: round %d: %d node(s), world size %d; this launcher is node %d",
             round_.number, len(round_.members), round_.world_size, mine[3])
    return Place(mine[3], len(round_.members), round_.world_size, False)


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


def _await_round(sock, where: str, deadline: float, beat_every: float, clock) -> m.RoundStart:
    framer, next_beat, admitted = wire.Framer(), clock() + beat_every, False
    while True:
        now = clock()
        if now >= deadline:
            raise StartFailed(f"{where} did not start the job in time; see node 0's messages.")
        if now >= next_beat:
            try:
                sock.sendall(wire.encode(m.to_wire(m.Beat())))
            except OSError:
                pass  # the read below sees the connection gone
            next_beat = now + beat_every
        sock.settimeout(max(0.01, min(next_beat, deadline) - now))
        try:
            data = sock.recv(65536)
        except socket.timeout:
            continue
        except OSError:
            data = b""
        try:
            bodies = framer.feed(data) if data else None
        except wire.ProtocolError as e:
            raise StartFailed(f"{where} sent junk ({e}); check that the endpoint belongs to this job.") from None
        if bodies is None and admitted:
            raise StartFailed(f"{where} closed the rendezvous before the job started; node 0's launcher leaving "
                              "ends an elastic job (see its messages).")
        if bodies is None:
            raise StartFailed(f"{where.split(' at ')[-1]} closed the connection without an answer: the "
                              "job has started already (a launcher that comes later does not join a running job yet), "
                              "or the endpoint is not this job's.")
        for body in bodies:
            message = m.from_wire(body)
            if isinstance(message, (m.Refusal, m.Dropped)):
                raise StartFailed(f"{where} did not take this launcher: "
                                  f"{one_line(str(message.reason or 'no reason given'), 300)}.")
            if isinstance(message, m.Admitted):
                admitted = True
                if message.standby:
                    log.info("elastic job: this launcher waits as a standby")
            if isinstance(message, m.RoundStart) and None not in (message.number, message.members, message.world_size):
                return message
