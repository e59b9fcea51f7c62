"""Links of several launchers in one process, on a fake clock, for the link contract suite: the c10d
backend on loopback sockets, the etcd backend on the in-memory etcd (tests/memory_etcd.py).

Time moves only when a test says so (``Harness.tick``), one keep-alive interval a step; after each step
every live link is woken and the step waits (real time, bounded) until each has done what that time asks
of it: renewed its lease (etcd), or node 0 has sent its beat and heard every live member answer (c10d).
So a busy machine slows a test down but never changes what it sees: no silence is made by the machine.
"""

from __future__ import annotations

import threading
import time
from typing import Callable, List, Optional

from conftest import free_ports
from launcher.nodes.elastic import link as el
from launcher.plan import elastic_backends as eb
from launcher.plan.elastic import ElasticSpec, Rendezvous
from launcher.plan.etcd import EtcdSpec
from memory_etcd import MemoryEtcd

HOST = "127.0.0.1"
JOB = "job"
INTERVAL = 1.0  # keep_alive_interval; heartbeat_timeout is three of them
REAL_BOUND = 60.0  # seconds of real time any one wait may take before the test fails (a hang, not a slow machine)


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0
        self.lock = threading.Lock()

    def __call__(self) -> float:
        with self.lock:
            return self.now

    def advance(self, seconds: float) -> None:
        with self.lock:
            self.now += seconds


def wait_until(condition: Callable[[], bool], what: str, bound: float = REAL_BOUND) -> None:
    deadline = time.monotonic() + bound
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {bound:g} s of real time: {what}")
        time.sleep(0.002)


class Harness:
    """What the contract suite asks of a backend; ``C10d`` and ``Etcd`` below give it."""

    row: eb.Backend  # the backend's row: its name, whether it has a node 0
    crash_seen_as = "lost"  # how the survivors' round names a crashed member (lost: its connection closed)

    @property
    def name(self) -> str:
        return self.row.name

    @property
    def keeper_loss_ends_the_job(self) -> bool:
        """Node 0 keeps the membership: losing it ends the job."""
        return self.row.has_node_0

    def __init__(self, low: int = 3, high: int = 3, token: Optional[str] = "secret", max_restarts: int = 0,
                 **settings) -> None:
        self.clock = Clock()
        rendezvous = dict(keep_alive_interval=INTERVAL, heartbeat_timeout=3 * INTERVAL, join_timeout=30.0,
                          last_call_timeout=2.0, close_timeout=10.0, read_timeout=10.0)
        rendezvous.update(settings)
        self.rendezvous = Rendezvous(**rendezvous)
        self.low, self.high, self.token, self.max_restarts = low, high, token, max_restarts
        self.links: List[object] = []
        self.quiet: set = set()  # links made silent or lost: not waited for
        self.seen: dict = {}  # id(link) -> what its inbox gave so far
        self.ticking = threading.Lock()  # one step of time at once: a test's thread and a late joiner's both tick

    # ------------------------------------------------------------ forming

    def form(self, count: int, workers: int = 1) -> list:
        """``count`` launchers joining at once; each one's link once its first round started (or its error)."""
        out: list = [None] * count
        threads = [threading.Thread(target=self._form_one, args=(i, workers, out), daemon=True) for i in range(count)]
        for t in threads:
            t.start()
        deadline = time.monotonic() + REAL_BOUND
        while any(t.is_alive() for t in threads):
            if time.monotonic() > deadline:
                raise AssertionError("the links did not form")
            if count < self.high and not any(isinstance(x, el.LinkBase) for x in out):
                self.tick()  # the last call, or join_timeout, runs on the clock; once a round started, no time passes
                # until the test serves the links (node 0 unserved hears nobody: a slow joiner was lost meanwhile)
            time.sleep(0.01)
        return out

    def _form_one(self, i: int, workers: int, out: list) -> None:
        try:
            out[i] = self.form_link(i, workers)
        except Exception as e:  # the test looks at it
            out[i] = e

    def serve(self) -> None:
        for link in self.links:
            link.serve()

    # ------------------------------------------------------------ time

    def tick(self, steps: int = 1) -> None:
        for _ in range(steps):
            with self.ticking:
                self.clock.advance(INTERVAL)
                self.wake()
                self.settle()

    def wake(self) -> None:
        for link in self.live():
            if link.waker.read_fd is not None:
                link.waker.put(None)

    def live(self) -> list:
        return [x for x in self.links if id(x) not in self.quiet and not x.stopping and x.inbox.read_fd is not None]

    # ------------------------------------------------------------ what a test waits for

    def items(self, link) -> list:
        got = self.seen.setdefault(id(link), [])
        if link.inbox.read_fd is not None:
            got.extend(link.inbox.take())
        return got

    def await_item(self, link, kind, match=lambda item: True, most_ticks: int = 40):
        """The first item of ``kind`` in ``link``'s inbox that ``match``es, letting time pass a step at a time
        while none came (at most ``most_ticks`` steps of the fake clock)."""
        for _ in range(most_ticks + 1):
            deadline = time.monotonic() + 0.5
            while time.monotonic() < deadline:
                for item in self.items(link):
                    if isinstance(item, kind) and match(item):
                        return item
                time.sleep(0.005)
            self.tick()
        raise AssertionError(f"no {kind.__name__} within {most_ticks} steps; got {self.items(link)}")

    # ------------------------------------------------------------ what happens to a launcher

    def silence(self, link) -> None:
        """Its thread stops (a frozen process): it says nothing more, and its connection stays open."""
        self.quiet.add(id(link))
        self.freeze(link)
        link.stopping = True
        link.waker.put(None)
        link.thread.join(REAL_BOUND)
        assert not link.thread.is_alive(), f"{link.thread_name}'s thread did not stop within {REAL_BOUND:g} s"

    def freeze(self, link) -> None:
        """What a backend's link must not do as its thread ends, for a frozen or killed process."""

    def crash(self, link) -> None:  # its launcher's processes all gone
        raise NotImplementedError

    def join_late(self, workers: int = 1):
        """One more launcher, joining the running job: its link once its first round started."""
        out = [None]
        thread = threading.Thread(target=self._form_one, args=(0, workers, out), daemon=True)
        thread.start()
        while thread.is_alive():
            self.tick()
            thread.join(0.05)
        if isinstance(out[0], el.LinkBase):
            out[0].serve()
        return out[0]

    def form_link(self, i: int, workers: int):
        raise NotImplementedError

    def settle(self) -> None:
        raise NotImplementedError

    def close(self) -> None:
        """Every link closed, while time passes (a keeper waits a while, on the clock, for the others to go)."""
        closing = threading.Thread(target=lambda: [link.close() for link in self.links], daemon=True)
        closing.start()
        deadline = time.monotonic() + REAL_BOUND
        while closing.is_alive() and time.monotonic() < deadline:
            self.clock.advance(INTERVAL)
            for link in self.links:  # a keeper's wait for the others to go is on the clock: it sees the time pass
                link.waker.put(None)
            closing.join(0.01)


class C10d(Harness):
    row = eb.C10D

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.spec = ElasticSpec(self.low, self.high, self.row.name, host=HOST, port=free_ports(1),
                                rendezvous=self.rendezvous, max_restarts=self.max_restarts)
        self.keeper = None
        self.lock = threading.Lock()

    def form_link(self, i: int, workers: int):
        from launcher.nodes.elastic import membership as mb
        from launcher.nodes.elastic.c10d import start
        from launcher.nodes.elastic.c10d.keeper import Keeper
        from launcher.nodes.elastic.c10d.member import MemberLink

        with self.lock:
            lead = self.keeper is None
            if lead:  # node 0 listens before the others try (they try again until join_timeout meanwhile)
                listener = start.listen(self.spec.host, self.spec.port)
                self.keeper = Keeper(listener, self.spec, JOB, mb.Node(el.own_id(), HOST, workers), self.token,
                                     self.clock)
                self.links.append(self.keeper)
        if lead:
            if self.keeper.first_round() is None:
                raise el.StartFailed(f"the elastic job did not start: {self.keeper.failed_start[1]}.")
            return self.keeper
        link = MemberLink(self.spec, JOB, workers, self.token, self.clock)
        self.links.append(link)
        return link.join()

    def settle(self) -> None:
        """Node 0 beat at this time, and heard from every live member since the step before."""
        keeper = self.keeper
        if keeper is None or id(keeper) in self.quiet or keeper.stopping:
            return
        if keeper.first is not None and keeper.thread is None:  # its first round returned, its thread not yet
            return  # started (``serve``): nothing runs its loop, so it beats only once it is served
        now = self.clock()
        wait_until(lambda: keeper.next_beat > now or keeper.stopping or keeper.over, "node 0 beat")
        # the members whose first round started and whose thread answers; node 0's state is never read from here (its containers are for
        # the keeper's thread alone): what it heard since its last beat is the plain dict ``heard``, filled until
        # its next beat, which only the next step brings
        members = [x for x in self.live() if x is not keeper and x.first is not None and x.thread is not None]

        def heard_all() -> bool:
            return keeper.stopping or keeper.over or all(
                keeper.heard.get(x.node_id, -1.0) >= now - INTERVAL for x in members)
        wait_until(heard_all, "every live member was heard by node 0")

    def freeze(self, link) -> None:
        if link is self.keeper:  # its thread ends without the goodbye (closing, and waiting for the others to go)
            link.close_all = lambda wait_for_them: None

    def crash(self, link) -> None:
        self.silence(link)
        if link is self.keeper:  # the kernel closes a killed process's sockets
            type(link).close_all(link, wait_for_them=False)
        else:
            link.conn.sock.close()


class Etcd(Harness):
    row = eb.ETCD
    crash_seen_as = "silent"  # the in-memory etcd has no liveness ring: only its lease's expiry tells

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.store = MemoryEtcd(self.clock)
        self.spec = ElasticSpec(self.low, self.high, self.row.name, rendezvous=self.rendezvous, max_restarts=self.max_restarts,
                                etcd=EtcdSpec((("memory", 2379),)))

    def form_link(self, i: int, workers: int):
        from launcher.nodes.elastic.etcd.link import EtcdLink
        from launcher.nodes.elastic.etcd.start import first_round

        link = EtcdLink(self.spec, JOB, workers, self.token, self.clock, self.store.client(), f"127.0.0.{i + 1}", ring=False)
        self.links.append(link)
        return first_round(link)

    def settle(self) -> None:
        """Every live link renewed its lease at this time (etcd drops the leases that lapsed meanwhile)."""
        now = self.clock()
        for link in self.live():
            if link.thread is not None:
                wait_until(lambda: link.lease.next_beat > now or link.stopping, f"{link.node_id} renewed its lease")
        self.store.expire()

    def crash(self, link) -> None:
        self.silence(link)
        link.client.cut = True  # its lease lapses: nobody renews it

