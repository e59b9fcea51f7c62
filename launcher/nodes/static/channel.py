"""What the control channel between the launchers of one job is to its users: the events it
reports and the interfaces (``typing.Protocol``) that the supervisor and the coordinator rely on.

Node 0's launcher listens on the control port (``--control_port``, default: the first worker
port minus one): its ``hub.Hub``; every other node's launcher connects to it, retrying until the
join timeout: its ``spoke.Spoke``. Single-node jobs open no port. Everything is non-blocking and
driven by the launcher's selector: each socket is one more descriptor in its event loop, and the
launcher never imports torch.

Wire format (``wire``): JSON objects, each preceded by its length. A connection that sends
anything else (junk, an oversized or malformed message, a wrong job, a wrong token, a second
connection for a node already joined, nothing at all for ``HELLO_TIMEOUT`` seconds) is dropped
and logged; it never stops the job.

Handshake (``messages``, ``auth``): node 0 sends ``challenge`` with a random nonce; the peer
answers ``hello`` with the job's identity (job id, node list, ports, script), its node index, a
nonce of its own and, when a job token is set (``LAUNCHER_JOB_TOKEN``), HMAC-SHA256(token, nonce
+ job id + node) as proof; node 0 answers ``welcome`` (or ``refused``, with the reason). With a
token, authentication is mutual: the welcome (and a refusal) proves the token on the peer's
nonce, a node obeys no node 0 that does not prove it (it tries again until the join timeout), and
every message after the welcome is sealed in a ``Session`` bound to both nonces. Then
node 0 sends ``beat`` to every node at once every ``heartbeat_timeout / 3`` seconds and each node
answers it (so node 0 reads the answers in a burst); silence for ``heartbeat_timeout`` seconds
(or TCP's own keep-alive giving up) means the peer is lost. Silence is timed on the watcher's own
clock: the time its loop came back late past the channel's deadline (a busy machine, a process not
scheduled, a long turn) is its lag, not the peer's silence, and is not counted; and a peer's socket is
read once more before it is lost (``endpoint``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Protocol, Union

@dataclass(frozen=True)
class Joined:
    node: int


@dataclass(frozen=True)
class Received:
    node: int  # the sender: a peer for node 0, always 0 elsewhere
    message: dict  # the JSON object as it came: messages.from_wire reads it


LOST, NEVER_JOINED = "lost", "join"  # why nodes are gone, as the kind of the cause they stop the job with


@dataclass(frozen=True)
class Gone:
    """Nodes out of the job: LOST (a connection closed, or silent), or NEVER_JOINED (not within the join timeout,
    or node 0 refused this node); one sentence for all."""

    nodes: tuple
    kind: str
    reason: str


Event = Union[Joined, Received, Gone]


class Channel(Protocol):
    """What the supervisor's event loop and the coordinator need of either end of the channel."""

    def registrations(self) -> dict:
        """{fd: selector events} to watch now; any other descriptor of the channel is let go of."""

    def next_deadline(self) -> Optional[float]:
        """When ``tick`` is next due (on the channel's monotonic clock), or None."""

    def ready(self, fd: int, mask: int, now: float) -> list:
        """The events that a descriptor's readiness brought."""

    def tick(self, now: float) -> list:
        """The events that time brought: heartbeats sent, peers lost, joins overdue."""

    def node_name(self, node: int) -> str:
        """``node 1 (10.0.0.2)``: how messages name a node."""

    def close(self) -> None: ...


class HubChannel(Channel, Protocol):
    """Node 0's end: one connection per node that joined."""

    ever_joined: set

    def send(self, node: int, message: dict) -> None:
        """To one joined node (a node not joined: nothing)."""

    def broadcast(self, message: dict) -> None:
        """To every joined node."""

    def joined(self) -> set:
        """The nodes joined now."""

    def heard_ages(self, now: float) -> dict:
        """node -> seconds since it was last heard, at ``now``."""


class SpokeChannel(Channel, Protocol):
    """Every other node's end: its one connection to node 0."""

    welcomed: bool  # node 0 answered (once true, it stays true)

    def send(self, message: dict) -> None:
        """To node 0; before the welcome, nothing."""
