"""The link contract: what every backend of the membership promises this launcher's event loop, and the
lifecycle they share.

A link is this launcher's end of the job's membership, whichever backend keeps it (``c10d``: node 0's
launcher; ``etcd``: etcd). It is formed once this launcher's first round started (``first``; None: a
standby whose job ended without it), then served by a thread of its own for the whole job, so that
heartbeats and re-forms go on whatever the event loop is doing. What the membership decides for this
node reaches the event loop through ``inbox`` (a pipe it watches as its control channel), in one
vocabulary for every backend: the next round (``messages.RoundStart``), a round's workers to stop
(``messages.StopWorkers``), the job's end or this launcher out of it (``JobOver``). What happens here goes the
other way through ``stopped``, ``done``, ``failed`` and ``leave``, each only queued (``Report``,
``Leave``) for the link's thread. ``Link`` writes the contract down; ``LinkBase`` holds the lifecycle
every backend shares; tests/test_link_contract.py runs the same tests against every backend.
"""

from __future__ import annotations

import collections
import os
import secrets
import selectors
import socket
import threading
import time
from dataclasses import dataclass
from typing import Callable, Optional, Protocol

from launcher.errors import LaunchError
from launcher.nodes.transport import messages as m
from launcher.output.messages import log
from launcher.plan import admission
from launcher.plan.health import Checkup, Facts, HealthSettings

JOIN_WAIT = 5.0  # how long close() waits for a link's thread before it lets it go


class StartFailed(LaunchError):
    """The first round never formed (too few nodes within join_timeout, the keeper gone, refused): exit 1."""

    exit_code = 1


# ---------------------------------------------------------------- the link to the event loop


@dataclass(frozen=True)
class Ending:
    """An end with its exit code and one sentence."""

    code: int
    reason: str


class JobOver(Ending):
    """The job ended (code 0: every worker finished), or this launcher is out of it."""


# ---------------------------------------------------------------- the event loop to the link

STOPPED, DONE, FAILED = "stopped", "done", "failed"


@dataclass(frozen=True)
class Report:
    """This node's workers of a round: all gone after a stop (STOPPED), all finished with 0 (DONE), or a
    cause to stop found here (FAILED, with the code the job would end with and one sentence)."""

    kind: str
    round: int
    code: int = 0
    reason: str = ""


class Leave(Ending):
    """This launcher ends (a stop signal): it takes its node out of the job; node 0's, of a c10d job, ends it."""


@dataclass(frozen=True)
class Share:
    """This node's speed entry (``messages.NodeSpeed``), for the other members."""

    entry: object


@dataclass(frozen=True)
class Health:
    """This launcher's health checks, as its link uses them: ``check(after_failure)`` makes its checkup afresh (after
    a worker failure its ports are not checked: its own workers may hold them still), ``settings`` theirs."""

    settings: HealthSettings
    check: Callable[[bool], Checkup]
    facts: Callable[[], Facts]  # its facts alone (cheap), for a keeper to judge the others' against

    def offer(self, after_failure: bool = False) -> dict:
        """A checkup for the wire: what node 0 judges."""
        return self.check(after_failure).to_wire()

    def judge(self, node: str, offered, node0: Facts) -> admission.Verdict:
        """Node 0's verdict on ``node``'s checkup as it came (node 0's facts ``node0``), now."""
        return admission.judge(node, offered, node0, time.time(), self.settings)


class Inbox:
    """A queue one thread fills and another empties, with a pipe that wakes the one that empties it: the
    link's thread fills the event loop's (it is the loop's ``coordination.Channel``: one fd to read, no
    deadline of its own), and the event loop fills the link's, whose selector watches ``read_fd``."""

    def __init__(self) -> None:
        self.read_fd, self.write_fd = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        self.items: collections.deque = collections.deque()
        self.lock = threading.Lock()

    def put(self, item) -> None:
        with self.lock:
            self.items.append(item)
            if self.write_fd is not None:
                try:
                    os.write(self.write_fd, b"!")
                except BlockingIOError:
                    pass  # the loop is woken already

    def take(self) -> list:
        with self.lock:
            if self.read_fd is not None:
                try:
                    while os.read(self.read_fd, 4096):
                        pass
                except BlockingIOError:
                    pass
            items, self.items = list(self.items), collections.deque()
        return items

    # the loop's Channel
    def registrations(self) -> dict:
        return {} if self.read_fd is None else {self.read_fd: selectors.EVENT_READ}

    def next_deadline(self) -> Optional[float]:
        return None

    def ready(self, fd: int, mask: int, now: float) -> list:
        return self.take()

    def close(self) -> None:
        with self.lock:
            for fd in (self.read_fd, self.write_fd):
                if fd is not None:
                    os.close(fd)
            self.read_fd = self.write_fd = None


class Link(Protocol):
    """What every backend's link promises the elastic coordinator (``job.ElasticJob``):

    - ``first``: the round this launcher starts in, once formed (None: a standby whose job ended without it);
      forming it waits at most join_timeout (and read_timeout once admitted), else ``StartFailed``, one sentence;
    - ``inbox``: the next rounds that have this launcher, in order; a ``messages.StopWorkers`` for the running round when a
      member is lost, silent past heartbeat_timeout, or joins, or a failure restarts it; one ``JobOver`` at
      the end, after which nothing more comes;
    - ``stopped``, ``done``, ``failed``, ``leave``: never block and never raise (they queue for the thread);
    - ``close()``: safe to call twice and from any state; afterwards no thread of the link runs or is let go
      with a warning, and this launcher is out of the membership.
    """

    inbox: Inbox
    node_id: str  # this launcher's id in the membership
    first: Optional[m.RoundStart]  # the round this launcher started in
    says_rounds: bool  # the link says each round on the console itself (node 0's keeper does)

    def serve(self) -> None: ...  # start the link's thread (after the first round)

    def heartbeat_ages(self) -> dict: ...  # node id -> seconds since last heard: the c10d keeper's; etcd: its own

    def stopped(self, round_: int) -> None: ...  # this node's workers of the round are gone

    def done(self, round_: int) -> None: ...  # this node's workers of the round all finished

    def failed(self, round_: int, code: int, reason: str) -> None: ...  # a cause to stop found here

    def leave(self, code: int, reason: str) -> None: ...  # this launcher ends (node 0 of c10d: the job ends)

    def share_speed(self, entry) -> None: ...  # this node's speed entry, for the others (every member's back, as a ``messages.Speeds``)

    def leaving_ends_job(self) -> bool: ...  # whether this launcher leaving ends the job (node 0 of c10d)

    def close(self) -> None: ...


class LinkBase:
    """The lifecycle every backend's link shares: its two inboxes, its thread, the reports queued for that
    thread, and a ``close`` that is safe twice. A backend gives ``run`` (the thread's body, until
    ``stopping``) and ``release`` (what the thread used, closed once it ended)."""

    says_rounds = False
    thread_name = "elastic-link"
    judge = None  # the keeper's verdicts on each launcher's checkups (``fitness.Judge``), where it judges them
    join_wait = JOIN_WAIT

    def __init__(self) -> None:
        self.inbox = Inbox()  # the event loop's
        self.waker = Inbox()  # the link's thread's: what the event loop reports, and the backend's own wake-ups
        self.first: Optional[m.RoundStart] = None
        self.thread: Optional[threading.Thread] = None
        self.stopping = False

    def serve(self) -> None:
        if self.thread is None:
            self.thread = threading.Thread(target=self.run, name=self.thread_name, daemon=True)
            self.thread.start()

    def heartbeat_ages(self) -> dict:
        """node id -> seconds since each member was last heard, on the launcher that keeps the heartbeats (the c10d
        keeper overrides this); {} elsewhere."""
        return {}

    def health_states(self) -> dict:
        """node id -> {check: (state, reason)} of each launcher's last checkup, where they are judged (its ``judge``,
        a ``fitness.Judge``); {} elsewhere."""
        return self.judge.states() if self.judge is not None else {}

    def stopped(self, round_: int) -> None:
        self.waker.put(Report(STOPPED, round_))

    def done(self, round_: int) -> None:
        self.waker.put(Report(DONE, round_))

    def failed(self, round_: int, code: int, reason: str) -> None:
        self.waker.put(Report(FAILED, round_, code, reason))

    def leave(self, code: int, reason: str) -> None:
        self.waker.put(Leave(code, reason))

    def share_speed(self, entry) -> None:
        self.waker.put(Share(entry))

    def leaving_ends_job(self) -> bool:
        return False

    def close(self) -> None:
        if self.inbox.read_fd is None:
            return  # closed already
        self.stopping = True
        if thread_stopped(self.thread, self.waker, self.join_wait):
            self.release()
            self.waker.close()
        else:
            log.warning("elastic job: this launcher's link (%s) did not stop within %g s; letting it go",
                        self.thread_name, self.join_wait)
        self.inbox.close()

    def run(self) -> None:  # the thread's body
        raise NotImplementedError

    def release(self) -> None:  # what the thread used, once it ended
        pass


def thread_stopped(thread: Optional[threading.Thread], waker: Optional[Inbox], wait: float) -> bool:
    """Ask a link's thread to stop (a None in its ``waker``) and wait up to ``wait`` seconds: whether it ended (or
    never ran), so that what it uses may be closed."""
    if waker is not None:
        waker.put(None)
    if thread is not None:
        thread.join(wait)
    return thread is None or not thread.is_alive()


def members(round_: m.RoundStart) -> list:
    """The round's seats by node rank."""
    return sorted(round_.members or (), key=lambda seat: seat.node_rank)


def member(round_: m.RoundStart, node_id: str) -> Optional[m.Seat]:
    return next((seat for seat in round_.members or () if seat.node_id == node_id), None)


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
    hosts = tuple(seat.host for seat in members(round_))
    return Place(mine.node_rank, len(hosts), round_.world_size, hosts, mine.node_rank == 0)


def own_id() -> str:
    """An id unique to this launcher's run: its host name, process id and a random part."""
    return f"{socket.gethostname()}-{os.getpid()}-{secrets.token_hex(2)}"
