"""A following tuner's end of the tune link: it reaches the leading tuner on node 0's address at the tune port
(trying again until its deadline: the leader may start later), shakes hands (``transport.handshake``: it obeys only
an answer that proves the job token, where one is set), then takes the leader's orders and sends its trials' report
lines and ends. Blocking, bounded: every wait has its timeout."""

from __future__ import annotations

import time
from typing import Optional

from launcher.errors import LaunchError
from launcher.nodes.transport import wire
from launcher.nodes.transport.connection import RETRY_REFUSED, Connection, dial, tune
from launcher.nodes.transport.handshake import Client
from launcher.nodes.transport.messages import Refusal, Welcome, from_wire, to_wire
from launcher.nodes.transport.tune_messages import TrialLines, TuneHello
from launcher.nodes.tune.leader import HEARTBEAT, MAX_FRAME, PROOF_JOB
from launcher.plan import report_lines


class LeaderGone(ConnectionError):
    """The leading tuner closed the link or sent what no leader sends."""


class Leader:
    """The link to the leading tuner, once it welcomed this one."""

    def __init__(self, conn: Connection, pending: list) -> None:
        self.conn, self.pending = conn, pending  # bodies that came with the welcome

    @classmethod
    def join(cls, host: str, port: int, token: Optional[str], name: str, deadline: float,
             clock=time.monotonic) -> "Leader":
        """The link, once the leader welcomed this tuner (``name``: its host); LaunchError at ``deadline``."""
        last = "no answer"
        while clock() < deadline:
            try:
                sock = dial(host, port, deadline, clock)
                tune(sock, HEARTBEAT)  # a leader whose machine is lost is known within it, not waited for forever
            except OSError as e:
                last = e.strerror or str(e)
                break
            try:
                leader = cls._shake(sock, token, name, deadline, clock)
                if leader is not None:
                    return leader
                last = "an answer that does not prove the job token"
            except (ConnectionError, wire.ProtocolError, OSError) as e:
                last = str(e)
            sock.close()
            time.sleep(RETRY_REFUSED)
        raise LaunchError(f"this node's tuner could not join the leading tuner at {host}:{port} (last: {last}); start "
                          "launcher tune on node 0 too, with the same --tune_port and job token.")

    @classmethod
    def _shake(cls, sock, token, name: str, deadline: float, clock) -> Optional["Leader"]:
        conn, shake, pending = Connection(sock, framer=wire.Framer(MAX_FRAME)), Client(token, PROOF_JOB, name), []
        answer = shake.answer(from_wire(_one(conn, pending, deadline, clock)))
        if answer is None:
            return None
        sock.sendall(wire.encode(to_wire(TuneHello(name, *answer))))
        reply = from_wire(_one(conn, pending, deadline, clock))
        if isinstance(reply, Refusal) and shake.refused(reply):
            raise LaunchError(f"the leading tuner refused this node's tuner: {reply.reason}")
        if not isinstance(reply, Welcome) or not shake.welcomed(reply):
            return None
        conn.session = shake.session
        return cls(conn, pending)

    def receive(self, timeout: float):
        """The leader's next message (None when none came within ``timeout``); LeaderGone when it left."""
        if not self.pending:
            self.conn.sock.settimeout(max(0.001, timeout))
            try:
                self.pending += self.conn.receive()
            except ConnectionError as e:
                raise LeaderGone(str(e)) from None
            except wire.ProtocolError as e:
                raise LeaderGone(f"it sent junk ({e})") from None
        if not self.pending:
            return None
        try:
            return from_wire(self.conn.open(self.pending.pop(0)))
        except wire.ProtocolError as e:
            raise LeaderGone(f"it sent junk ({e})") from None

    def send(self, message) -> None:
        if not self.conn.send_within(message):
            raise LeaderGone("it does not take messages any more")

    def send_lines(self, trial: int, node: int, lines: list) -> None:
        """Report lines (without their newlines), in batches (``report_lines.batches``)."""
        for batch in report_lines.batches(lines):
            self.send(TrialLines(trial, node, batch))

    def close(self) -> None:
        self.conn.sock.close()


def _one(conn: Connection, pending: list, deadline: float, clock) -> dict:
    """One message before the session (the challenge, the answer to the hello), by ``deadline``; what came after it
    stays in ``pending``."""
    while not pending:
        left = deadline - clock()
        if left <= 0:
            raise ConnectionError("no answer in time")
        conn.sock.settimeout(left)
        pending += conn.receive()
    return conn.open(pending.pop(0))
