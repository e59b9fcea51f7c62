"""What node 0's hub and the other nodes' spoke share: the connections, the heartbeats, losing a
peer, and their part in the launcher's selector."""

from __future__ import annotations

import selectors
import time
from typing import Callable, Optional

from launcher.nodes.transport.auth import TOKEN_VAR
from launcher.nodes.static.channel import LOST, Gone, Received
from launcher.nodes.transport.messages import Beat, Identity, Message, from_wire, to_wire
from launcher.nodes.transport.wire import ProtocolError
from launcher.output.messages import log

class Endpoint:
    """What node 0's hub and the other nodes' spoke share: heartbeats and the selector's part.

    Silence is judged on this node's own clock, which stops while its loop is away: the time by which
    the launcher's loop came back to the channel later than the channel's deadline (``next_deadline``)
    is no peer's silence (on a busy machine node 0's process may not run for seconds; its beats are then
    late, and the answers wait unread in its sockets). ``away`` sums that lag, each ``heard`` is stamped
    on ``awake(now)``, and a peer is lost after ``heartbeat_timeout`` seconds of this clock: a peer really
    silent is found within the timeout plus the lag. Before a peer is lost, its socket is read once more."""

    beats_all = False  # node 0's hub: it beats every node at once; a node answers

    def __init__(self, identity: Identity, node: int, heartbeat_timeout: float, join_timeout: float,
                 token: Optional[str], clock: Callable[[], float] = time.monotonic) -> None:
        self.identity = identity
        self.node = node
        self.heartbeat_timeout = heartbeat_timeout
        self.beat_every = heartbeat_timeout / 3  # two beats may go missing before the peer counts as lost
        self.clock = clock  # what ``now`` is on: the launcher's monotonic clock (a fake one in tests)
        self.next_beat = clock()
        self.due: Optional[float] = None  # when ``_beat_and_check`` next has work (None: nothing watched)
        self.away = 0.0  # how long the loop came back later than ``due``, in all: this node's lag, no peer's silence
        self.seen = self.next_beat  # when the loop last came to the channel
        self.join_deadline = self.next_beat + join_timeout
        self.join_timeout = join_timeout
        self.token = token or None
        if self.token is None:
            log.warning("control: no %s is set: whoever reaches node 0's control port can join this job as a "
                        "node, or take the port and pose as node 0, and stop the job; set the same secret "
                        "in %s on every node", TOKEN_VAR, TOKEN_VAR)
        self.connections: dict = {}  # fd -> Connection
        self.closed = False
        # sockets let go of, closed only when the launcher's loop next asks what to watch: until
        # then its selector still holds their numbers, which a new socket must not take over
        self.discarded: list = []

    def node_name(self, node: int) -> str:
        return f"node {node} ({self.identity.nodes[node]})"

    # the selector's part
    def registrations(self) -> dict:
        """{fd: selector events} this channel wants watched now. The caller stops watching any
        other descriptor of the channel at once (the sockets let go of are closed here)."""
        for sock in self.discarded:
            sock.close()
        self.discarded.clear()
        return {fd: selectors.EVENT_READ | (selectors.EVENT_WRITE if c.out else 0) for fd, c in self.connections.items()}

    def next_deadline(self) -> Optional[float]:
        return self.due

    def awake(self, now: float) -> float:
        """``now`` on this node's clock of attention: less the time its loop was away. The lag is how
        late the loop came back past the deadline it was given, or, past it, the time since its last
        visit: a long turn (a busy machine, a process not scheduled, a stop) counts whole."""
        if self.due is not None:
            late = now - max(self.due, self.seen)
            if late > 0:
                self.away += late
            if late >= self.beat_every:
                log.debug("control: this node's loop came back %.1f s late; no peer's silence is judged over "
                          "that time", late)
        self.seen = max(self.seen, now)
        return now - self.away

    def _watch_from(self, at: float) -> None:
        """A connection was added (or changed): the next scan is due at ``at`` at the latest."""
        self.due = at if self.due is None else min(self.due, at)

    def _beat_and_check(self, now: float) -> list:
        """Heartbeats and overdue peers. Node 0 beats every node at once, every ``beat_every``; a node
        answers each beat (``_on_message``) and beats by itself only when node 0 has said nothing for
        twice that: so node 0 reads the answers in bursts, a few turns of its loop per beat, whatever
        the number of nodes. The scan of every connection runs only when something is due."""
        awake = self.awake(now)
        if self.due is None or now < self.due:
            return []
        beat_all = self.beats_all and now >= self.next_beat
        if beat_all:
            self.next_beat = now + self.beat_every
        alone = 2 * self.beat_every  # a node's own beat, when node 0 has said nothing for that long
        beat, events, due = to_wire(Beat()), [], [self.next_beat] if self.beats_all else []
        for fd, c in list(self.connections.items()):
            if c.node is None:  # its hello's deadline is the listener's
                continue
            if awake - c.heard >= self.heartbeat_timeout:
                events += self._read(fd, now)  # a last look: what waits unread in its socket is no silence
                if fd not in self.connections:
                    continue
                if awake - c.heard >= self.heartbeat_timeout:
                    events.append(self._lose(fd, f"no heartbeat for {awake - c.heard:.1f} s"))
                    continue
            if beat_all or (not self.beats_all and now - c.said >= alone):
                c.send(beat, now)
            due.append(c.heard + self.heartbeat_timeout + self.away)
            if not self.beats_all:
                due.append(c.said + alone)
        self.due = min(due, default=None)
        return events

    def _read(self, fd: int, now: float) -> list:
        awake = self.awake(now)
        c = self.connections[fd]
        try:
            bodies = c.receive()
        except ProtocolError as e:
            return self._refuse(fd, f"sent {e}")
        except ConnectionError as e:
            return self._refuse(fd, f"connection lost ({e})" if c.node is not None else str(e))
        events = []
        for body in bodies:
            if fd not in self.connections:
                break
            try:
                message = c.open(body)
            except ProtocolError as e:
                return events + self._refuse(fd, f"sent {e}")
            c.heard = awake
            events += self._on_message(fd, c, message, now)
        return events

    def _refuse(self, fd: int, reason: str) -> list:
        """Let go of a connection: a joined node's is lost, any other is dropped."""
        if self.connections[fd].node is not None:
            return [self._lose(fd, reason)]
        self._drop(fd, reason)
        return []

    def _on_message(self, fd, c, message: dict, now: float) -> list:
        """A message of a connection: the handshake's, a heartbeat, or one for the coordinator."""
        typed = from_wire(message)
        if c.node is None:
            return self._handshake(fd, c, typed, now)
        if isinstance(typed, Beat):
            if not self.beats_all:
                c.send(to_wire(Beat()), now)  # the answer: node 0 hears every node in the same burst
            return []
        return [Received(c.node, message)]

    def _handshake(self, fd, c, message: Message, now: float) -> list:
        raise NotImplementedError

    def _drop(self, fd: int, reason: str) -> None:
        c = self.connections.pop(fd)
        log.warning("control: dropped the connection from %s: %s", c.where, reason)
        self.discarded.append(c.sock)

    def _lose(self, fd: int, reason: str) -> Gone:
        c = self.connections.pop(fd)
        self.discarded.append(c.sock)
        return Gone((c.node,), LOST, f"{self.node_name(c.node)} lost: {reason}")

    def close(self) -> None:
        for c in self.connections.values():
            c.flush()
            c.sock.close()
        self.connections.clear()
        for sock in self.discarded:
            sock.close()
        self.discarded.clear()
        self.closed = True
        self.due = None

