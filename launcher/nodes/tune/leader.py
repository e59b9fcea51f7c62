"""The leading tuner's end of the tune link: it listens on node 0's address at the tune port, shakes hands with each
following tuner as every link does (``transport.handshake``, the job token proven both ways where one is set), orders
each trial to every follower, passes on the report lines they send back, stops their trials and waits for their ends.
A follower that leaves is named in ``lost``. Nothing a stranger sends raises: its connection is dropped. The owner
calls ``pump`` from its own loop; nothing here blocks longer than it is asked to."""

from __future__ import annotations

import errno
import selectors
import time
from typing import Callable, Optional

from launcher.nodes.transport import wire
from launcher.nodes.transport.connection import Connection, tune
from launcher.nodes.transport.handshake import Server
from launcher.nodes.transport.listener import Listener, bind
from launcher.nodes.transport.messages import Beat, from_wire
from launcher.nodes.transport.tune_messages import (TrialEnded, TrialLines, TrialOrder, TrialStop, TuneHello,
                                                    TuneOver)
from launcher.errors import LaunchError
from launcher.output.messages import log
from launcher.plan.policy import one_line

PROOF_JOB = "launcher-tune"  # the job id the proofs are made over (each trial's job has its own)
HEARTBEAT = 30.0  # seconds of TCP's patience with a silent peer, on either end of the link
HELLO_WITHIN = 10.0
MAX_FRAME = 1 << 20  # a message from a follower that joined: its report lines, a few hundred at a time
LinesSink = Callable[[int, int, list], None]  # (follower, node, lines)


class _Stranger(Exception):
    """A connection that is no tuner of this job: dropped, with the reason given."""


class Follower(Connection):
    index: int = 0  # 1, 2, ...: the folder of its trials
    host: str = ""
    ended: int = 0  # the last trial it said ended


class Followers:
    """The followers of one tuning, from one listening socket (``bind`` makes it; OSError if another tuner has it)."""

    def __init__(self, listener: Listener, token: Optional[str], clock=time.monotonic) -> None:
        self.listener, self.token, self.clock = listener, token, clock
        self.selector = selectors.DefaultSelector()
        self.pending: dict = {}  # fd -> Follower, before its hello
        self.joined: list = []  # Follower, in the order they joined
        self.lost: list = []  # each follower that left, in words
        self.joins = 0
        self.trial = 0  # the trial ordered last
        self.failed: list = []  # the followers' parts of that trial that failed while it ran, in words
        self.stopped = 0  # the trial stopped last: its parts' ends after the stop are no failures

    @classmethod
    def bind(cls, address: str, port: int, token: Optional[str]) -> "Followers":
        return cls(Listener(bind(address, port), "the tune link", hello_within=HELLO_WITHIN), token)

    def wait(self, count: int, deadline: float, where: str) -> None:
        """Until ``count`` followers joined; LaunchError at ``deadline``."""
        while len(self.joined) < count:
            left = deadline - self.clock()
            if left <= 0:
                raise LaunchError(f"{count - len(self.joined)} of the other {count} nodes' tuners did not join the "
                                  f"tune link at {where} in time (--join_timeout); start the same launcher tune "
                                  "command on every node.")
            self.pump(min(left, 0.5), lambda *_: None)

    def order(self, trial: int, point: tuple, job_id: str) -> None:
        self.trial, self.failed = trial, []
        for f in self.joined:
            f.send_within(TrialOrder(trial, f.index, [list(p) for p in point], job_id))

    def stop(self, trial: int) -> None:
        self.stopped = trial
        for f in self.joined:
            f.send_within(TrialStop(trial))

    def ended(self, trial: int) -> bool:
        return all(f.ended >= trial for f in self.joined)

    def drop_unended(self, trial: int, within: float) -> None:
        """The followers whose trial did not end in time dropped (a stopped or lost machine), each named in ``lost``."""
        for f in [f for f in self.joined if f.ended < trial]:
            self._drop(f, f"did not end trial {trial} within {within:g} s of its stop")

    def close(self, reason: Optional[str] = None) -> None:
        for f in self.joined:
            f.send_within(TuneOver(reason))
        for f in [*self.joined, *self.pending.values()]:
            f.sock.close()
        self.joined, self.pending = [], {}
        self.listener.close()
        self.selector.close()

    def pump(self, timeout: float, on_lines: LinesSink) -> None:
        """What came within ``timeout``: new followers, their lines (``on_lines``), their trials' ends, who left."""
        now = self.clock()
        self.listener.watch_with(self.selector, now)
        for key, _ in self.selector.select(timeout):
            if key.data is None:
                self._accept()
            else:
                self._read(key.data, on_lines)
        for sock in self.listener.overdue(self.clock()):
            self._drop(self.pending.get(sock.fileno()), "said no hello in time")

    def _accept(self) -> None:
        new, pushed_out = self.listener.accept(self.clock())
        for sock in pushed_out:
            self._drop(self.pending.get(sock.fileno()), "was pushed out by newer connections")
        for sock, where in new:
            tune(sock, HEARTBEAT)
            f = Follower(sock, f"{where[0]}:{where[1]}", handshake=Server(self.token, PROOF_JOB))
            self.pending[sock.fileno()] = f
            self.selector.register(sock, selectors.EVENT_READ, f)
            f.send_within(f.handshake.challenge())

    def _read(self, f: Follower, on_lines: LinesSink) -> None:
        try:
            for body in f.receive():
                self._message(f, from_wire(f.open(body)), on_lines)
        except ConnectionError:
            self._drop(f, "left")
        except wire.ProtocolError as e:
            self._drop(f, f"sent junk ({e})")
        except _Stranger as e:
            self._drop(f, str(e))

    def _message(self, f: Follower, message, on_lines: LinesSink) -> None:
        if f not in self.joined:
            self._hello(f, message)
        elif isinstance(message, TrialLines) and message.trial == self.trial and message.lines is not None \
                and message.node is not None:
            on_lines(f.index, message.node, message.lines)
        elif isinstance(message, TrialEnded) and message.trial is not None:
            f.ended = max(f.ended, message.trial)
            if message.trial == self.trial != self.stopped and message.code != 0:
                self.failed.append(f"{f.host}'s part: exit code {message.code}: {one_line(message.why or '', 300)}")
        elif not isinstance(message, (Beat, TrialLines, TrialEnded)):
            self._drop(f, f"sent a {getattr(message, 'type', '?')} message, which no tuner sends")

    def _hello(self, f: Follower, hello) -> None:
        if not isinstance(hello, TuneHello) or not hello.host:
            raise _Stranger(f"said no tuner's hello ({one_line(str(getattr(hello, 'type', hello)), 80)})")
        problem = f.handshake.hello(hello.host, hello.nonce, hello.proof)
        if problem is not None:
            f.send_within(f.handshake.refusal(problem))
            raise _Stranger(f"was refused: {problem}")
        f.send_within(f.handshake.welcome())
        f.session, f.host = f.handshake.session, one_line(hello.host, 80)
        self.joins += 1
        f.index = self.joins
        f.framer = wire.Framer(MAX_FRAME)
        self.pending.pop(f.sock.fileno(), None)
        self.listener.settled(f.sock)
        self.joined.append(f)
        log.info("tune: the tuner of %s (%s) joined", f.host, f.where)

    def _drop(self, f: Optional[Follower], why: str) -> None:
        if f is None:
            return
        if f in self.joined:
            self.joined.remove(f)
            self.lost.append(f"the tuner of {f.host} ({f.where}) {why}")
        elif why != "left":
            log.warning("tune link: dropped a connection from %s: %s", f.where, why)
        self.pending.pop(f.sock.fileno(), None)
        self.listener.settled(f.sock)
        try:
            self.selector.unregister(f.sock)
        except (KeyError, ValueError):
            pass
        f.sock.close()


def is_taken(error: OSError) -> bool:
    """Whether binding failed because the address is not this machine's, or another tuner listens there."""
    return error.errno in (errno.EADDRNOTAVAIL, errno.EADDRINUSE)
