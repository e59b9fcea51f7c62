"""Every other launcher's link to node 0's keeper (the c10d backend): hello, heartbeats both ways, node 0's
orders in ``inbox``.

A joining launcher answers node 0's challenge with its hello (``handshake``): an id of its own, its host
(its end of the connection) and its number of workers, proving the job token (when there is one) on node
0's nonce; node 0's welcome proves it back on the launcher's nonce, and from then on every message both
ways (node 0's admission first) is sealed in their session: one that fails it (forged, replayed,
reordered) counts node 0 as gone. Both ends then beat every ``keep_alive_interval`` (node 0 beats every member at
once, each answers), and each counts the other gone when its connection closes or it is silent for
``heartbeat_timeout``. Node 0's launcher leaving ends the job on every node.
"""

from __future__ import annotations

import logging
import selectors
import time
from typing import Optional

from launcher.nodes.elastic.fitness import Checker, CheckedUp, KeptOut
from launcher.nodes.elastic.link import (DONE, FAILED, STOPPED, Health, JobOver, Leave, LinkBase, Report, Share,
                                         StartFailed, member, own_id, place_in)
from launcher.nodes.transport import messages as m, wire
from launcher.nodes.transport.auth import TOKEN_VAR
from launcher.nodes.transport.connection import RETRY_REFUSED, Connection, dial
from launcher.nodes.transport.handshake import Client
from launcher.output.messages import log
from launcher.plan.elastic import ElasticSpec
from launcher.plan.policy import one_line

REPORTS = {STOPPED: lambda r: m.Stopped(r.round), DONE: lambda r: m.RoundDone(r.round),
           FAILED: lambda r: m.RoundFailed(r.round, r.code, r.reason)}


class _Unproven(Exception):
    """An answer to the hello (a welcome, a refusal) that does not prove the job token: not obeyed (what it did)."""


class MemberLink(LinkBase):
    """Another launcher's link to node 0: hello, heartbeats both ways, node 0's orders in ``inbox``."""

    thread_name = "elastic-member"

    def __init__(self, spec: ElasticSpec, job_id: str, workers: int, token, clock,
                 health: Optional[Health] = None) -> None:
        super().__init__()
        self.spec, self.job_id, self.workers, self.token, self.clock = spec, job_id, workers, token, clock
        self.health = health  # its checkup goes in its hello, after a worker failure, and every interval while aside
        self.checker = Checker(health, self.waker)
        self.aside = False  # a standby, or set aside by node 0 (its checks failed): it checks again every interval
        self.next_check = clock()
        self.said = ""  # why node 0 kept it out last (said once, until it changes)
        self.where = f"node 0's launcher at {spec.host}:{spec.port}"
        self.node_id = own_id()
        self.handshake: Optional[Client] = None  # a new one at each try to join
        self.conn: Optional[Connection] = None
        self.early: list = []  # node 0's messages that came with the first round (their bodies, still sealed)
        self.heard = clock()  # when node 0 last said anything
        self.next_beat = clock()
        self.selector: Optional[selectors.BaseSelector] = None

    # ------------------------------------------------------------ until the first round

    def join(self) -> "MemberLink":
        """Connect, say hello, beat, and wait for the first round that has this launcher (bounded by
        join_timeout and a read_timeout more until admitted; then for as long as node 0 is heard). Kept out by
        its health checks, it says why, checks again every interval and asks again."""
        while True:
            try:
                return self._join_once()
            except KeptOut as e:
                said, self.said = self.said, str(e)
                log.log(logging.WARNING if said != self.said else logging.DEBUG, "elastic job: node 0 keeps this "
                        "launcher out: %s; it checks itself again every %g s", e, self.health.settings.interval)
                time.sleep(self.health.settings.interval)

    def _join_once(self) -> "MemberLink":
        rendezvous = self.spec.rendezvous
        deadline = self.clock() + rendezvous.join_timeout
        self.offered = self.health.offer() if self.health is not None else None  # before node 0's hello deadline runs
        while True:
            try:
                sock = dial(self.spec.host, self.spec.port, deadline, self.clock)
            except OSError as e:
                raise StartFailed(f"could not reach {self.where} within {rendezvous.join_timeout:g} s (join_timeout; "
                                  f"last: {e.strerror or e}); check that node 0 runs and the endpoint is its "
                                  "address.") from None
            self.conn = Connection(sock, framer=wire.Framer(wire.sized_for(self.spec.max_nodes)))  # a round lists all
            self.handshake = Client(self.token, self.job_id, self.node_id)  # a fresh nonce for each try
            try:
                self.first = self._await_round(deadline + rendezvous.read_timeout)
                break
            except _Unproven as e:
                sock.close()
                self._after_unproven(str(e), deadline)
            except BaseException:
                sock.close()
                raise
        if self.first is not None:  # None: a standby whose job finished without it
            place = place_in(self.first, self.node_id)
            log.info("elastic job: round %d: %d node(s), world size %d; this launcher is node %d",
                     self.first.number, place.nodes, self.first.world_size, place.node_rank)
        return self

    def _await_round(self, deadline: float) -> Optional[m.RoundStart]:
        welcomed = admitted = False
        self.heard = self.clock()
        while True:
            now = self.clock()
            if not admitted and now >= deadline:
                raise StartFailed(f"{self.where} did not start the job in time; see node 0's messages.")
            if admitted and now - self.heard > self.spec.rendezvous.heartbeat_timeout:
                raise StartFailed(f"{self.where} went silent for {now - self.heard:.1f} s (heartbeat_timeout) before "
                                  "this launcher's round started.")
            if welcomed:  # from the welcome on (sealed with a token)
                self._beat(now)
                self._check_again(now)
            self.conn.sock.settimeout(max(0.01, min(self.next_beat if welcomed else deadline,
                                                    deadline if not admitted else self.next_beat) - now))
            bodies = self._receive(admitted)
            for i, body in enumerate(bodies):
                message = self._open(body)
                if isinstance(message, StartFailed):
                    raise message
                if not welcomed and isinstance(message, (m.Refusal, m.Dropped)):
                    self._refused(m.Refusal(message.reason, getattr(message, "proof", None)))
                if not welcomed:
                    welcomed = self._shake(message)
                    continue
                if admitted and isinstance(message, m.Dropped) and message.code == 0:
                    log.info("elastic job: the job ended without this launcher: %s",
                             one_line(str(message.reason or "it finished"), 300))
                    return None
                if isinstance(message, m.KeptOut) and not message.admitted and self.health is not None:
                    raise KeptOut(one_line(str(message.reason or "no reason given"), 600))
                self._take_aside(message)
                if isinstance(message, (m.Refusal, m.Dropped)):
                    raise StartFailed(f"{self.where} did not take this launcher: "
                                      f"{one_line(str(message.reason or 'no reason given'), 300)}.")
                if isinstance(message, m.Admitted) and not admitted:
                    admitted = True
                    if message.standby:
                        log.info("elastic job: this launcher waits as a standby")
                        self.aside = True  # checked every interval while it waits
                if self._has_me(message):
                    self.early = bodies[i + 1:]  # what came with it: the link's thread takes it first
                    return message

    def _refused(self, refusal: m.Refusal) -> None:
        """A refusal before the welcome: node 0's if it proves the job token on this launcher's nonce (StartFailed);
        one that proves nothing may be a stranger's, so it is not obeyed (the launcher tries again)."""
        reason = one_line(str(refusal.reason or "no reason given"), 300)
        if not self.handshake.refused(refusal):
            raise _Unproven(f"refused this launcher ({reason})")
        raise StartFailed(f"{self.where} did not take this launcher: {reason}.")

    def _after_unproven(self, what: str, deadline: float) -> None:
        """Wait RETRY_REFUSED before the next try; StartFailed once the join timeout leaves no time for one."""
        if self.clock() + RETRY_REFUSED >= deadline:
            raise StartFailed(f"{self.where} {what} without proving the job token ({TOKEN_VAR}) until join_timeout; "
                              "check that the endpoint is this job's node 0 and every node has the same token.")
        log.warning("elastic job: %s %s without proving the job token; trying again", self.where, what)
        time.sleep(RETRY_REFUSED)

    def _shake(self, message) -> bool:
        """Node 0's challenge (answered with the hello) or welcome (True: node 0 proves the job token, when there
        is one; then every message both ways is sealed in their session); StartFailed for anything else."""
        answer = self.handshake.answer(message)
        if answer is not None:
            host = self.conn.sock.getsockname()[0]
            self.conn.send_within(m.Hello({"job_id": self.job_id}, None, *answer, node_id=self.node_id, host=host,
                                          workers=self.workers, checkup=self.offered))
            log.info("elastic job: joined %s as node %s (%s); waiting for the round to start", self.where,
                     self.node_id, host)
            return False
        if isinstance(message, m.Welcome) and self.handshake.welcomed(message):
            self.conn.session = self.handshake.session
            self.next_beat = self.clock() + self.spec.rendezvous.keep_alive_interval  # its hello was the first word
            return True
        if isinstance(message, m.Welcome):
            raise _Unproven("welcomed this launcher")
        raise StartFailed(f"{self.where} sent {message.type[:40]!r} before its welcome; check that the endpoint "
                          "belongs to this job.")

    def _open(self, body: bytes):
        """A body from node 0 as its message, its seal checked in their session; StartFailed naming what is wrong
        with it (then node 0 counts as gone)."""
        try:
            return m.from_wire(self.conn.open(body))
        except wire.ProtocolError as e:
            if self.conn.session is None:
                return StartFailed(f"{self.where} sent junk ({e}); check that the endpoint belongs to this job.")
            return StartFailed(f"a message on the connection to {self.where} failed the job token's authentication "
                               f"({e}); node 0 counts as gone, which ends an elastic job")

    def _check_again(self, now: float) -> None:
        """Aside (a standby, or out of the job after its checks failed): checked every interval, beside this thread,
        which sends the checkup to node 0 as it comes (``_waked``)."""
        if self.aside and self.health is not None and now >= self.next_check and not self.checker.busy:
            self.next_check = now + self.health.settings.interval
            self.checker.ask()
        for item in self.waker.take() if self.selector is None else ():  # before the link's thread: none but these
            self._waked(item)

    def _take_aside(self, message) -> None:
        """Node 0 set this launcher aside (its checks failed), or took it into a round again."""
        if isinstance(message, m.KeptOut) and message.admitted and self.health is not None:
            log.warning("elastic job: this launcher is set aside: %s; it checks itself again every %g s and comes back "
                        "once it passes", one_line(str(message.reason), 600), self.health.settings.interval)
            self.aside, self.next_check = True, self.clock() + self.health.settings.interval
        elif self._has_me(message):
            self.aside = False

    def _beat(self, now: float) -> None:
        if now >= self.next_beat:
            self.conn.send_within(m.Beat())  # if the connection is gone, the read sees it
            self.next_beat = now + self.spec.rendezvous.keep_alive_interval

    def _receive(self, admitted: bool) -> list:
        """What node 0 sent (blocking up to the socket's timeout); StartFailed once it closed or sent junk."""
        try:
            bodies = self.conn.receive()
        except ConnectionError:
            bodies = None
        except wire.ProtocolError as e:
            raise StartFailed(f"{self.where} sent junk ({e}); check that the endpoint belongs to this job.") from None
        if bodies is None and admitted:
            raise StartFailed(f"{self.where} closed the rendezvous before this launcher's round started; node 0's "
                              "launcher leaving ends an elastic job (see its messages).")
        if bodies is None:
            raise StartFailed(f"{self.where.split(' at ')[-1]} closed the connection without an answer: the "
                              "endpoint is not this job's, or its job has ended.")
        self.heard = self.clock()
        return bodies

    # ------------------------------------------------------------ the event loop's side

    def serve(self) -> None:
        self.selector = selectors.DefaultSelector()
        self.selector.register(self.waker.read_fd, selectors.EVENT_READ)
        self.conn.sock.setblocking(False)
        self.selector.register(self.conn.sock, selectors.EVENT_READ)
        over = self._take_bodies(self.early)
        if over is not None:
            self.inbox.put(over)
            self.stopping = True
        super().serve()

    def release(self) -> None:
        if self.selector is not None:
            self.selector.close()
        self.conn.sock.close()

    # ------------------------------------------------------------ the link's thread

    def run(self) -> None:
        over = None
        try:
            while over is None and not self.stopping:
                over = self._serve_once()
        except Exception as e:  # a bug here must not leave the job running without its link, silently
            over = JobOver(1, f"this launcher's link to node 0 failed ({type(e).__name__}: {e})")
        if over is not None:
            self.inbox.put(over)
        for item in self.waker.take():  # a leave asked as the thread stopped: node 0 still hears of it
            self._waked(item)

    def _serve_once(self) -> Optional[JobOver]:
        now = self.clock()
        silent = now - self.heard
        if silent > self.spec.rendezvous.heartbeat_timeout:
            return JobOver(1, f"{self.where} went silent for {silent:.1f} s (heartbeat_timeout "
                              f"{self.spec.rendezvous.heartbeat_timeout:g} s); node 0's launcher leaving ends an "
                              "elastic job")
        if now >= self.next_beat:  # node 0 has not beaten for two intervals: beat by itself
            self.conn.send_within(m.Beat())
            self.next_beat = now + 2 * self.spec.rendezvous.keep_alive_interval
        self._check_again(now)
        wait = max(0.0, min(self.next_beat, self.heard + self.spec.rendezvous.heartbeat_timeout) - now)
        for key, _ in self.selector.select(min(wait, 1.0)):
            if key.fileobj == self.waker.read_fd:
                for item in self.waker.take():
                    self._waked(item)
                continue
            over = self._read()
            if over is not None:
                return over
        return None

    def _waked(self, item) -> None:
        """What the event loop asked of the link's thread: a report to send, or to leave (node 0 counts this node
        as left, not lost; the connection closes once the thread ends)."""
        if self.checker.holds(item):
            return
        if isinstance(item, Report) and item.kind == FAILED and self.health is not None:
            self.checker.ask(item)  # checked again before the failure spends a restart; sent as it comes back
        elif isinstance(item, CheckedUp):
            after = item.after
            self.conn.send_within(m.Checked(item.checkup) if after is None else
                                  m.RoundFailed(after.round, after.code, after.reason, checkup=item.checkup))
            for later in self.checker.released() if after is not None else ():
                self._waked(later)
        elif isinstance(item, Report):
            self.conn.send_within(REPORTS[item.kind](item))
        elif isinstance(item, Leave) and self.conn.sock.fileno() >= 0:
            self.conn.send_within(m.Leaving(item.reason))
            self.stopping = True
        elif isinstance(item, Share) and item.entry is not None and not self.stopping:
            self.conn.send_within(m.Speeds((item.entry,)))

    def _read(self) -> Optional[JobOver]:
        try:
            bodies = self.conn.receive()
        except (ConnectionError, wire.ProtocolError):
            return JobOver(1, f"{self.where} closed the connection; node 0's launcher leaving ends an elastic job")
        self.heard = self.clock()
        return self._take_bodies(bodies)

    def _take_bodies(self, bodies: list) -> Optional[JobOver]:
        for body in bodies:
            message = self._open(body)
            over = JobOver(1, str(message)) if isinstance(message, StartFailed) else self._take(message)
            if over is not None:
                return over
        return None

    def _take(self, message) -> Optional[JobOver]:
        """Node 0's word for the event loop: a round that has this launcher, a stop, or the end (returned);
        its heartbeat is answered at once (node 0 then hears every launcher in one burst)."""
        self._take_aside(message)
        if isinstance(message, m.Beat):
            self.conn.send_within(m.Beat())
            self.next_beat = self.clock() + 2 * self.spec.rendezvous.keep_alive_interval
        elif self._has_me(message):
            self.inbox.put(message)
        elif isinstance(message, m.Speeds):
            self.inbox.put(message)
        elif isinstance(message, m.StopWorkers) and message.round is not None:
            self.inbox.put(m.StopWorkers(message.round, message.reason or "node 0 re-forms the job"))
        elif isinstance(message, (m.Dropped, m.Refusal)):
            code = message.code if isinstance(message, m.Dropped) else 1
            return JobOver(code, one_line(str(message.reason or "node 0 gave no reason"), 300))
        return None

    def _has_me(self, message) -> bool:
        """Whether ``message`` is a whole round that has this launcher."""
        return isinstance(message, m.RoundStart) and None not in (message.number, message.members, message.world_size) \
            and member(message, self.node_id) is not None

