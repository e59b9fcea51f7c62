"""What an elastic job's membership link tells this launcher's event loop, and how: the orders of node 0
(a round to start, a round's workers to stop, the job's end) put in an ``Inbox`` by the link's thread,
whose pipe the event loop watches as its control channel.

Node 0's link is ``elastic_keeper.Keeper`` (it keeps the membership), every other launcher's is
``elastic_start.MemberLink``; both are served by a thread of their own for the whole job, so that
heartbeats and re-forms go on whatever the event loop is doing. The event loop tells the link what
happened here through the ``Link`` methods (each only queues it for the link's thread).
"""

from __future__ import annotations

import collections
import os
import selectors
import threading
from dataclasses import dataclass
from typing import Optional, Protocol

from launcher.nodes import messages as m


@dataclass(frozen=True)
class StopOrder:
    """Stop this round's workers: the membership changed (or a failure restarts the round)."""

    round: int
    reason: str


@dataclass(frozen=True)
class JobOver:
    """The job ended (code 0: every worker finished), or this launcher is out of it."""

    code: int
    reason: str


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
    """This launcher's end of the membership, as the elastic coordinator (``elastic_job``) uses it."""

    inbox: Inbox
    node_id: str  # this launcher's id in the membership
    first: m.RoundStart  # the round this launcher started in
    says_rounds: bool  # the link says each round on the console itself (node 0's keeper does)

    def serve(self) -> None: ...  # start the link's thread (after the first round)

    def stopped(self, round_: int) -> None: ...  # this node's workers of the round are gone

    def done(self, round_: int) -> None: ...  # this node's workers of the round all finished

    def failed(self, round_: int, code: int, reason: str) -> None: ...  # a cause to stop found here

    def leave(self, code: int, reason: str) -> None: ...  # this launcher ends (node 0: the job ends)

    def close(self) -> None: ...


def thread_stopped(thread: Optional[threading.Thread], waker: Optional[Inbox], wait: float) -> bool:
    """Ask a link's thread to stop (a None in its ``waker``) and wait up to ``wait`` seconds: whether it ended (or
    never ran), so that what it uses may be closed."""
    if waker is not None:
        waker.put(None)
    if thread is not None:
        thread.join(wait)
    return thread is None or not thread.is_alive()


def members(round_: m.RoundStart) -> list:
    """The round's members by node rank: [id, host, workers, node_rank, first_rank]."""
    return sorted(round_.members or [], key=lambda x: x[3])


def member(round_: m.RoundStart, node_id: str) -> Optional[list]:
    return next((x for x in round_.members or [] if x[0] == node_id), None)
