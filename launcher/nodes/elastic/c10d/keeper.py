"""Node 0 of an elastic job: the membership (``membership``) fed by the launchers' connections on the
rendezvous endpoint, from the first hello to the job's end.

Until the first round starts it runs in the caller's thread (``first_round``); then ``serve`` runs it
in a thread of its own, which keeps accepting launchers (a newcomer below MAX re-forms the job, at
MAX it waits as a standby), hears their heartbeats and sends its own, and carries out what the
membership decides: each member is told to stop its workers and then the next round; node 0's own
orders go to its event loop through the ``Inbox``. Each connection shakes hands first (``arrivals``);
what a stranger sends (junk, no hello, another job's id, no proof of the job token) only loses its
connection. With a job token every message from the welcome on (the admission too) is sealed in the
member's session: one it does not open loses the member's connection, with a warning.
"""

from __future__ import annotations

import logging
import selectors
from typing import Optional

from launcher.nodes.elastic import membership as mb
from launcher.nodes.elastic.model import round_start
from launcher.nodes.transport import messages as m
from launcher.nodes.transport import wire
from launcher.nodes.elastic.link import (DONE, JOIN_WAIT, STOPPED, Health, JobOver, Leave, LinkBase, Share)
from launcher.nodes.elastic.c10d.arrivals import BEAT, Unsealed, answer, label, messages, stranger, told_to_node
from launcher.nodes.elastic.fitness import Judge
from launcher.nodes.elastic.c10d.speeds import SpeedTable
from launcher.nodes.transport.connection import Connection, Shared
from launcher.nodes.transport.listener import Listener, pending_cap
from launcher.output.messages import log
from launcher.plan.elastic import ElasticSpec
from launcher.plan.policy import Say, one_line

CLOSE_WAIT = 2.0  # at the end, node 0 waits this long for the others to close first (their ends keep TIME_WAIT)


class Keeper(LinkBase):
    """Node 0's link: the membership, its connections, and node 0's own orders in ``inbox``."""

    says_rounds = True
    thread_name = "elastic-keeper"
    join_wait = JOIN_WAIT + CLOSE_WAIT

    def __init__(self, listener, spec: ElasticSpec, job_id: str, me: mb.Node, token, clock,
                 health: Optional[Health] = None) -> None:
        super().__init__()
        self.judge = Judge(health)  # each launcher's checkups, judged against node 0's facts
        self.spec, self.clock, self.token, self.job_id = spec, clock, token, job_id
        # silent connections keep no launcher out: every launcher and standby may come at once, each has read_timeout
        self.listener: Optional[Listener] = Listener(listener, "elastic job: node 0", pending_cap(2 * spec.max_nodes),
                                                     hello_within=spec.rendezvous.read_timeout)
        self.node_id = me.node_id
        self.selector = selectors.DefaultSelector()
        self.selector.register(self.waker.read_fd, selectors.EVENT_READ)
        self.peers: dict = {}  # fd -> Connection (its ``node``: the launcher's node id, once welcomed)
        self.fds: dict = {}  # node id -> fd, for the peers welcomed
        self.heard: dict = {}  # node id -> when it was last heard, since the membership was last told
        self.last_heard: dict = {}  # node id -> when each connected member was last heard (a new dict at each beat)
        self.deadline: Optional[float] = None  # the membership's next deadline (None: to compute afresh)
        self.stalled = False  # the last turn took longer than a heartbeat interval
        self.failed_start: Optional[tuple] = None  # (code, reason) when the first round never formed
        self.over = False  # the job ended: no more rounds
        self.speeds = SpeedTable()
        self.next_beat = clock()
        self.state, actions = mb.begin(spec, me, job_id, clock())
        self.carry_out(actions)

    # ------------------------------------------------------------ the event loop's side

    def leaving_ends_job(self) -> bool:
        return True

    def heartbeat_ages(self) -> dict:
        """node id -> seconds since each connected member was last heard (from any thread: a dict replaced whole)."""
        now = self.clock()
        return {node_id: max(0.0, now - at) for node_id, at in self.last_heard.items()}

    def first_round(self) -> Optional[m.RoundStart]:
        """Serve until round 1 starts (its RoundStart) or cannot (None; ``failed_start`` says why)."""
        log.info("elastic job: this launcher is node 0, waiting for %s nodes on %s:%d",
                 self.spec.nodes.replace(":", " to "), self.spec.host, self.spec.port)
        while self.first is None and self.failed_start is None:
            self.serve_once()
        if self.failed_start is not None:
            for peer in list(self.peers.values()):
                peer.send_within(m.Dropped(*self.failed_start))
            self.close_all(wait_for_them=True)  # closed first, unread beats would reset them: Dropped lost
        return self.first

    def release(self) -> None:
        self.close_all(wait_for_them=False)
        self.selector.close()

    # ------------------------------------------------------------ the keeper's thread

    def run(self) -> None:
        try:
            while not self.stopping:
                self.serve_once()
            self.close_all(wait_for_them=True)
        except Exception as e:  # a bug here must not leave the job without its keeper, silently
            log.error("elastic job: node 0's membership failed (%s: %s); ending the job", type(e).__name__, e)
            self.inbox.put(JobOver(1, f"node 0's membership failed ({type(e).__name__})"))

    def serve_once(self) -> None:
        """One turn: connections, what the event loop queued, heartbeats, and the membership's deadlines.
        Heartbeats reach the membership together, once per beat (or when a deadline comes): its cost
        per turn is then the same for 10,000 nodes as for 2."""
        self.listener.watch_with(self.selector, self.clock())
        ready = self.selector.select(self.wait())
        began = self.clock()
        for key, _ in ready:
            if key.fileobj is self.listener:
                self.accept()
            elif key.fileobj == self.waker.read_fd:
                for item in self.waker.take():
                    if isinstance(item, Share):
                        self.speeds.take(self.node_id, item.entry, self.state.round, self.clock())
                    elif item is not None:
                        self.decide(self.event_of(item))
            else:
                self.read(key.fileobj.fileno())
        if self.clock() - began > self.spec.rendezvous.keep_alive_interval:
            self.stalled = True  # a long turn (a round sent to thousands): what came meanwhile is read first
            return
        if self.stalled:
            self.stalled = False
            self.forgive_silence()
        if self.clock() >= (self.listener.next_deadline() or float("inf")):
            self.accept()  # the end of a pause without descriptors, or a connection past its hello's deadline
        self.beat()
        self.share_speeds()
        if self.clock() >= self.next_deadline():
            self.decide(mb.TimePassed())

    def share_speeds(self) -> None:
        """Every member's entry of the running round, to every member (node 0's own through its inbox)."""
        round_ = self.state.round
        entries = self.speeds.due(round_, self.clock())
        if entries is None:
            return
        encoded = Shared(m.Speeds(entries))
        for x in round_.members:
            if x.node.node_id != self.node_id:
                self.send_to(x.node.node_id, encoded)
        self.inbox.put(m.Speeds(entries))

    def event_of(self, item):
        """What this node's event loop reported, as the membership's event."""
        if isinstance(item, Leave):
            return mb.JobEnded(item.code, item.reason)
        if item.kind == STOPPED:
            return mb.WorkersStopped(self.node_id, item.round)
        if item.kind == DONE:
            return mb.RoundDone(self.node_id, item.round)
        return mb.WorkerFailed(self.node_id, item.round, item.code, item.reason)

    def next_deadline(self) -> float:
        if self.deadline is None:
            self.deadline = mb.next_deadline(self.state) or self.clock() + 1.0
        return self.deadline

    def wait(self) -> float:
        wake = min(self.next_beat, self.next_deadline(), self.listener.next_deadline() or self.next_beat)
        return max(0.0, min(1.0, wake - self.clock()))

    def beat(self) -> None:
        """Every member and standby at once, each interval; each answers (``MemberLink``)."""
        now = self.clock()
        if now < self.next_beat:
            return
        if now - self.next_beat > self.spec.rendezvous.keep_alive_interval:  # node 0 itself was late (overloaded)
            self.forgive_silence()
        self.next_beat = now + self.spec.rendezvous.keep_alive_interval
        self.decide(mb.TimePassed())  # the heartbeats heard since the last beat, told to the membership
        for fd in list(self.fds.values()):
            if fd in self.peers and not self.peers[fd].send_within(BEAT):
                self.forget(fd, "node 0 could not send it a heartbeat")

    def forgive_silence(self) -> None:
        """Node 0 itself was away (a long turn, a late beat): no launcher's silence is judged over that time."""
        self.heard.update(dict.fromkeys(self.fds, self.clock()))

    def decide(self, event) -> None:
        if self.heard and isinstance(event, mb.TimePassed):  # the silences it judges: every node heard so far
            heard, self.heard = self.heard, {}
            self.last_heard = {n: t for n, t in {**self.last_heard, **heard}.items() if n in self.fds}
            self.state, actions = mb.decide(self.state, mb.Heartbeat(at=heard), self.clock())
            self.carry_out(actions)
        self.state, actions = mb.decide(self.state, event, self.clock())
        self.deadline = None
        self.carry_out(actions)

    def carry_out(self, actions) -> None:
        for action in actions:
            told = told_to_node(action)
            if told is not None:
                self.send_to(action.node_id, *told)
            elif isinstance(action, Say):
                log.log(action.level, "elastic job: %s", action.text)
            elif isinstance(action, mb.StopWorkers):
                self.order_stop(action)
            elif isinstance(action, mb.StartRound):
                self.start_round(action.round)
            elif isinstance(action, mb.EndJob):
                self.end(action)

    def order_stop(self, action: mb.StopWorkers) -> None:
        encoded = Shared(m.StopWorkers(action.round, action.reason))
        for node_id in action.nodes:
            if node_id == self.node_id:
                self.inbox.put(m.StopWorkers(action.round, action.reason))
            else:
                self.send_to(node_id, encoded)

    def start_round(self, round_: mb.Round) -> None:
        start = round_start(round_)
        encoded = Shared(start)  # once: the same bytes go to every member (in a session, each with its own seal)
        for x in round_.members:
            if x.node.node_id != self.node_id:
                self.send_to(x.node.node_id, encoded)
        if self.first is None:
            self.first = start
        else:
            self.inbox.put(start)

    def end(self, action: mb.EndJob) -> None:
        if self.first is None:
            self.failed_start = (action.code, action.reason)
            return
        self.over = True
        for peer in list(self.peers.values()):
            peer.send_within(m.Dropped(action.code, action.reason))
        self.inbox.put(JobOver(action.code, action.reason))

    # ------------------------------------------------------------ connections

    def accept(self) -> None:
        new, pushed_out = self.listener.accept(self.clock())
        for sock in pushed_out:
            self.forget(sock.fileno(), "too many connections without a hello")
        for sock in self.listener.overdue(self.clock()):  # a hung or silent one, within read_timeout
            self.forget(sock.fileno(), "no hello within read_timeout")
        for sock, _ in new:  # non-blocking: a read takes what is there; a send waits only for a full buffer
            self.peers[sock.fileno()] = stranger(sock, self.token, self.job_id)
            self.selector.register(sock, selectors.EVENT_READ)

    def read(self, fd: int) -> None:
        peer = self.peers.get(fd)
        try:
            for message in messages(peer) if peer is not None else ():
                if self.peers.get(fd) is not peer:
                    return  # lost meanwhile: what it sent after does not count
                self.on_message(fd, peer, message)
        except Unsealed as e:
            self.unsealed(fd, peer, str(e))
        except ConnectionError:
            self.forget(fd, "its connection closed")
        except wire.ProtocolError:
            self.forget(fd, "it sent what is not a message")

    def unsealed(self, fd: int, peer: Connection, problem: str) -> None:
        """A message on a member's connection that its session does not open: not the member's (a stranger's
        on its connection, one replayed or reordered, another member's); the member's connection is lost."""
        log.warning("elastic job: %s's connection carried a message its session does not open (%s, or sealed for "
                    "another member); closing it: %s counts as lost", peer.node, problem, peer.node)
        peer.send_within(m.Dropped(1, "a message on its connection to node 0 failed the job token's authentication"))
        self.forget(fd, "a message that failed its session's authentication",
                    lost="a message on its connection failed the job token's authentication")

    def on_message(self, fd: int, peer: Connection, message) -> None:
        if peer.node is None:
            self.on_hello(fd, peer, message)
            return
        node_id = peer.node
        self.heard[node_id] = self.clock()  # every message says the launcher is alive
        if isinstance(message, m.Stopped) and message.round is not None:
            self.decide(mb.WorkersStopped(node_id, message.round))
        elif isinstance(message, m.RoundDone) and message.round is not None:
            self.decide(mb.RoundDone(node_id, message.round))
        elif isinstance(message, m.RoundFailed) and message.round is not None:
            self.decide(mb.WorkerFailed(node_id, message.round, message.code, message.reason or "a failure",
                                        self.judge.unfit(node_id, label(peer), message.checkup, False)))
        elif isinstance(message, m.Checked):  # a standby, or a member set aside, checked itself again
            self.decide(mb.Checked(node_id, self.judge.unfit(peer.node, label(peer), message.checkup)))
        elif isinstance(message, m.Speeds):  # a member speaks for itself only
            for entry in message.nodes[:1]:
                self.speeds.take(node_id, entry, self.state.round, self.clock())
        elif isinstance(message, m.Leaving):  # counted out now, as left (not lost), before its connection closes
            self.forget(fd, "it left", lost=f"{one_line(message.reason or 'its launcher ends', 200)}; {mb.LEAVES}")

    def on_hello(self, fd: int, peer: Connection, message) -> None:
        if self.over or not isinstance(message, m.Hello) or message.node_id is None:
            self.forget(fd, "it said no elastic hello")
            return
        problem = answer(peer, message, self.fds)
        if problem is not None:
            self.forget(fd, problem)
            return
        self.listener.settled(peer.sock)
        self.fds[peer.node], self.heard[peer.node] = fd, self.clock()  # its hello: its first word
        job_id = (message.identity or {}).get("job_id")
        unfit = self.judge.unfit(peer.node, label(peer), message.checkup)  # its checkup, against node 0's facts
        self.decide(mb.JoinAsked(mb.Node(message.node_id, message.host or "", message.workers),
                                 job_id if isinstance(job_id, str) else "", unfit))

    def forget(self, fd: int, reason: str, lost: str = "its connection closed") -> None:
        peer = self.peers.pop(fd, None)
        if peer is None:
            return
        self.fds.pop(peer.node, None)
        self.speeds.forget(peer.node)
        self.selector.unregister(peer.sock)
        peer.sock.close()
        if peer.node is not None:
            log.log(logging.DEBUG, "elastic job: closed %s (%s)", peer.node, reason)
            self.decide(mb.Closed(peer.node, lost))

    def send_to(self, node_id: str, message, close: bool = False) -> None:
        """A message, or one ``Shared`` by many, to one launcher."""
        fd = self.fds.get(node_id)
        if fd is not None and (not self.peers[fd].send_within(message) or close):
            self.forget(fd, "node 0 closed it")

    def close_all(self, wait_for_them: bool) -> None:
        """Close every connection, after the others closed theirs (bounded by CLOSE_WAIT) when asked."""
        if self.listener is None:
            return
        deadline = self.clock() + (CLOSE_WAIT if wait_for_them else 0)
        self.listener.close()
        self.listener = None
        while self.peers and self.clock() < deadline:
            for key, _ in self.selector.select(max(0.0, deadline - self.clock())):
                if key.fileobj == self.waker.read_fd:
                    self.waker.take()
                    continue
                try:
                    self.peers[key.fileobj.fileno()].receive()  # what it says now goes unread
                except (ConnectionError, wire.ProtocolError):
                    self._close(key.fileobj.fileno())
        for fd in list(self.peers):
            self._close(fd)

    def _close(self, fd: int) -> None:
        peer = self.peers.pop(fd)
        self.fds.pop(peer.node, None)
        self.selector.unregister(peer.sock)
        peer.sock.close()

