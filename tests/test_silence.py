"""A peer's silence, judged by node 0's hub and by a node's spoke, on a fake clock: the time a
watcher's own loop did not run (a busy machine, a process not scheduled) is no peer's silence;
a peer really silent is still lost within the heartbeat timeout plus that lag.

Real hub and spoke on loopback; every ``now`` they see is the fake clock's, which moves only when a
test moves it. No assertion here is on the wall clock."""

import selectors

import pytest

from launcher.nodes.static.channel import Gone, Joined
from launcher.nodes.static.hub import Hub
from launcher.nodes.static.spoke import Spoke
from launcher.nodes.transport.messages import Beat, Identity, to_wire
from tests.conftest import free_ports

IDENTITY = Identity("job1", ("127.0.0.1", "127.0.0.2"), (7000,), "-u train.py")
TIMEOUT = 3.0
STEP = 0.25  # the longest a driven channel waits for its next turn when nothing is due


class FakeClock:
    def __init__(self, now: float = 1000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


def settle(channels, clock) -> list:
    """What arrived on the channels' sockets, read until nothing more comes, all at the fake ``now``
    (loopback delivers within the sender's call; the short real wait only lets the kernel finish)."""
    events = []
    with selectors.DefaultSelector() as sel:
        for _ in range(200):
            for key in list(sel.get_map().values()):
                sel.unregister(key.fd)
            for ch in channels:
                for fd, mask in ch.registrations().items():
                    sel.register(fd, mask, ch)
            ready = sel.select(0.01)
            if not ready:
                break
            for key, mask in ready:
                events += [(clock(), e) for e in key.data.ready(key.fd, mask, clock())]
    return events


def pump(channels, clock, seconds, until=None) -> list:
    """Drive the channels like the launcher's loop, on time: each turn reads what came, ticks, and
    waits (the fake clock moves) until the next deadline any of them gave, STEP at the most.
    The (time, event) pairs, stopping early once ``until(pairs)``."""
    end = clock() + seconds
    events = []
    while True:
        events += settle(channels, clock)
        for ch in channels:
            events += [(clock(), e) for e in ch.tick(clock())]
        if clock() >= end or (until and until(events)):
            return events
        deadlines = [d for d in (ch.next_deadline() for ch in channels) if d is not None]
        clock.now = min(end, max(clock() + 1e-6, min([clock() + STEP] + deadlines)))


def losses(events) -> list:
    return [(t, e) for t, e in events if isinstance(e, Gone)]


@pytest.fixture
def pair():
    """Node 0's hub and node 1's spoke, joined, on one fake clock; then a few quiet seconds of beats."""
    clock = FakeClock()
    port = free_ports(1)
    hub = Hub(IDENTITY, "127.0.0.1", port, TIMEOUT, join_timeout=1000, token=None, clock=clock)
    spoke = Spoke(IDENTITY, 1, "127.0.0.1", port, TIMEOUT, join_timeout=1000, token=None, clock=clock)
    try:
        events = pump([hub, spoke], clock, 30, until=lambda ev: sum(isinstance(e, Joined) for _, e in ev) == 2)
        assert sum(isinstance(e, Joined) for _, e in events) == 2
        assert losses(pump([hub, spoke], clock, 5)) == []
        assert hub.away < 1e-3 and spoke.away < 1e-3  # on time: no lag measured
        yield clock, hub, spoke
    finally:
        hub.close()
        spoke.close()


def heard_at(channel) -> float:
    """When (on the fake clock) the channel last heard its one peer; valid while it was not away since."""
    (c,) = [c for c in channel.connections.values() if c.node is not None]
    return c.heard + channel.away


# ---------------------------------------------------------------- the watcher's own loop stalls


def test_node_0_stalled_with_the_answers_waiting_in_its_socket_loses_no_node(pair):
    clock, hub, spoke = pair
    spoke.heartbeat_timeout = 100.0  # node 1 does not judge node 0 meanwhile (its own beats: every 2 s still)
    events = pump([spoke], clock, 2 * TIMEOUT)  # node 0's loop does not run: node 1's beats queue up unread
    assert losses(events) == []
    assert hub.tick(clock()) == []  # back: its timers first, then its sockets
    assert hub.away >= 2 * TIMEOUT - TIMEOUT / 3 - 1e-6  # all of the stall past its next beat
    spoke.heartbeat_timeout = TIMEOUT
    assert losses(pump([hub, spoke], clock, 3 * TIMEOUT)) == []
    assert hub.joined() == {1} and hub.away < 2 * TIMEOUT + 1e-3


def test_node_1_stalled_with_node_0s_beats_waiting_in_its_socket_does_not_judge_node_0(pair):
    clock, hub, spoke = pair
    hub.heartbeat_timeout = 100.0  # node 0 does not judge node 1 meanwhile (its beats: every second still)
    events = pump([hub], clock, 2 * TIMEOUT)  # node 1's loop does not run: node 0's beats queue up unread
    assert losses(events) == []
    assert spoke.tick(clock()) == []  # back: its timers first, then its sockets
    assert spoke.away >= 2 * TIMEOUT - 2 * TIMEOUT / 3 - 1e-6
    hub.heartbeat_timeout = TIMEOUT
    assert losses(pump([hub, spoke], clock, 3 * TIMEOUT)) == []
    assert spoke.hub is not None and hub.joined() == {1}


def test_the_whole_machine_stalled_loses_no_node_whoever_runs_first(pair):
    clock, hub, spoke = pair
    clock.advance(2 * TIMEOUT)  # neither loop runs: node 0 beats no one and node 1 answers nothing
    assert hub.tick(clock()) == []  # nothing waits in a socket: only the lag discounted keeps node 1
    assert spoke.tick(clock()) == []  # ... and node 0
    assert losses(pump([hub, spoke], clock, 3 * TIMEOUT)) == []
    assert hub.joined() == {1} and spoke.hub is not None


def test_the_lag_is_the_time_past_the_deadline(pair):
    clock, hub, _ = pair
    before, due = hub.away, hub.next_deadline()
    clock.now = max(clock(), due - 0.1)  # the loop comes back early: no lag, whatever it does then
    hub.tick(clock())
    assert hub.away == pytest.approx(before)
    clock.advance(5.0)  # a turn of 5 s, then a socket read: the time past the deadline is lag
    hub.awake(clock())
    assert hub.away == pytest.approx(before + clock() - due)
    clock.advance(0.5)  # still past it, later in the same turn: the time since the last visit
    hub.tick(clock())
    assert hub.away == pytest.approx(before + clock() - due)
    away = hub.away
    clock.now = hub.next_deadline()  # the tick set the next deadline: the loop is on time again
    hub.tick(clock())
    assert hub.away == away


def test_a_beat_waiting_unread_at_the_deadline_is_read_before_the_peer_is_judged(pair):
    """On time, no lag: node 1's beat came after the loop last looked at the sockets (a turn begun
    before it came); the tick that finds node 1 silent reads its socket once more first."""
    clock, hub, spoke = pair
    pump([hub], clock, 0.0)
    last = heard_at(hub)
    assert losses(pump([hub], clock, last + TIMEOUT - 0.5 - clock())) == []  # node 1 silent 2.5 s, then it beats
    spoke.send(to_wire(Beat()))
    away, events = hub.away, []
    while clock() < last + TIMEOUT - 1e-6:  # its ticks, each on time (its beats too), no socket read
        clock.now = hub.next_deadline()
        events += hub.tick(clock())
    assert clock() == pytest.approx(last + TIMEOUT) and hub.away == pytest.approx(away)
    assert events == [] and hub.joined() == {1}
    assert heard_at(hub) == pytest.approx(clock())  # read at the deadline


# ---------------------------------------------------------------- a peer really silent


def frozen(clock, watcher, stall, before_stall=1.0) -> tuple:
    """Its peer frozen from now on; the watcher runs ``before_stall`` s, stops ``stall`` s, runs again:
    (when it last heard the peer, the lag it measured, (time, Gone) pairs)."""
    assert losses(pump([watcher], clock, 0.0)) == []  # what the peer had sent is read
    last = heard_at(watcher)
    events = pump([watcher], clock, before_stall)
    away = watcher.away
    clock.advance(stall)
    events += pump([watcher], clock, TIMEOUT + stall + 1.0, until=losses)
    return last, watcher.away - away, losses(events)


@pytest.mark.parametrize("stall", [0.0, 2.0, 5.0])
def test_a_frozen_node_is_lost_within_the_timeout_plus_node_0s_lag(pair, stall):
    clock, hub, _ = pair
    last, lag, lost = frozen(clock, hub, stall)
    assert lag <= stall + 1e-3
    (lost_at, event), = lost
    assert event.nodes == (1,) and "node 1 (127.0.0.2) lost: no heartbeat for 3.0 s" in event.reason
    assert lost_at == pytest.approx(last + TIMEOUT + lag, abs=1e-3)  # not before, and no later
    assert hub.joined() == set()


@pytest.mark.parametrize("stall", [0.0, 2.0, 5.0])
def test_a_frozen_node_0_is_lost_within_the_timeout_plus_the_nodes_lag(pair, stall):
    clock, _, spoke = pair
    last, lag, lost = frozen(clock, spoke, stall)
    assert lag <= stall + 1e-3
    (lost_at, event), = lost
    assert event.nodes == (0,) and "node 0 (127.0.0.1) lost: no heartbeat for 3.0 s" in event.reason
    assert lost_at == pytest.approx(last + TIMEOUT + lag, abs=1e-3)


@pytest.mark.parametrize("side", ["hub", "spoke"])
def test_a_peer_silent_all_through_a_long_stall_is_lost_after_it_on_turns_that_run(pair, side):
    """The lag forgives the stall, not the peer: frozen before the watcher's loop stopped for 30 s,
    it is lost once the timeout has passed on turns that did run, not at once and not never."""
    clock, hub, spoke = pair
    watcher = hub if side == "hub" else spoke
    last, lag, lost = frozen(clock, watcher, 10 * TIMEOUT, before_stall=0.5)
    assert lag >= 10 * TIMEOUT - 2 * TIMEOUT / 3 - 1e-6  # all of it but the time to its next deadline
    (lost_at, event), = lost
    assert event.nodes == ((1,) if side == "hub" else (0,))
    assert lost_at == pytest.approx(last + TIMEOUT + lag, abs=1e-3)
    assert lost_at > last + 10 * TIMEOUT + 0.5  # after the stall, not at its end
