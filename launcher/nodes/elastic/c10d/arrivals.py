"""What reaches node 0 of a c10d elastic job on each connection: the handshake (``handshake``: its challenge,
the launcher's hello checked, a welcome or a refusal), then the welcomed member's messages, opened in its
session (with a job token) and decoded, a heartbeat without decoding it (most of what comes); and what node 0 tells
one launcher of the membership's decisions on it."""

from __future__ import annotations

import socket
from typing import Iterator, Optional

from launcher.nodes.elastic import model as mb
from launcher.nodes.transport import messages as m
from launcher.nodes.transport import wire
from launcher.nodes.transport.connection import Connection, Shared
from launcher.nodes.transport.handshake import Server

BEAT = Shared(m.Beat())
BEAT_BODY = bytes(BEAT.body)


class Unsealed(Exception):
    """A message on a member's connection that its session does not open."""


def stranger(sock: socket.socket, token: Optional[str], job_id: str) -> Connection:
    """A new connection, challenged: a stranger until its hello."""
    sock.setblocking(False)  # a read takes what is there; a send waits only for a full buffer (send_within)
    peer = Connection(sock, handshake=Server(token, job_id))
    peer.send_within(peer.handshake.challenge())
    return peer


def answer(peer: Connection, hello: m.Hello, taken) -> Optional[str]:
    """Node 0's answer to a launcher's hello, sent: a welcome (``peer.node`` its id, ``peer.session`` their session
    from now on, with a job token; None returned) or a refusal (why returned)."""
    problem = peer.handshake.hello(hello.node_id, hello.nonce, hello.proof)
    if problem is None and hello.node_id in taken:
        problem = f"the node id {hello.node_id!r} is taken"
    if problem is not None:
        peer.send_within(peer.handshake.refusal(problem))
        return problem
    peer.send_within(peer.handshake.welcome())
    peer.node, peer.session = hello.node_id, peer.handshake.session
    return None


def messages(peer: Connection) -> Iterator:
    """The messages that came on ``peer``; ConnectionError at its end, ``wire.ProtocolError`` for junk, ``Unsealed``
    for one its session does not open (forged, replayed, reordered, another member's)."""
    for body in peer.receive():
        try:
            body = peer.unseal(body)
        except wire.ProtocolError as e:
            raise Unsealed(str(e)) from None
        yield m.Beat() if body == BEAT_BODY and peer.node is not None else m.from_wire(wire.decode(body))


def label(peer: Connection) -> str:
    """How a health check's sentence names the launcher at ``peer``: its id and address."""
    try:
        return f"node {peer.node} ({peer.sock.getpeername()[0]})"
    except OSError:
        return f"node {peer.node}"


def told_to_node(action) -> Optional[tuple]:
    """(message, close after it) that a membership's action says to its one launcher; None for another action."""
    if isinstance(action, mb.Admit):
        return m.Admitted(action.standby), False
    if isinstance(action, mb.Refuse):
        return m.Refusal(action.reason), True
    if isinstance(action, mb.KeepOut):  # not admitted: closed (it asks again); set aside: it stays
        return m.KeptOut(action.reason, action.admitted or None), not action.admitted
    if isinstance(action, mb.Drop):
        return m.Dropped(action.code, action.reason), True
    return None
