"""Every launcher's link to an elastic job whose membership is in etcd (``--rdzv-backend etcd``): no launcher is special,
so any node, the first included, may be lost and the others go on.

Each launcher puts its node key under a lease of its own (its heartbeat: kept alive every ``keep_alive_interval``, TTL
``heartbeat_timeout``), watches the job's prefix, and keeps a mirror of its keys. The live launcher whose key is the
oldest is the keeper: it runs the membership's rules (``etcd_state.reconcile`` over ``membership.decide``) on what the
keys say and writes the record, in a transaction guarded by the record's last revision and its own key; when it is
lost (its lease expires, or it leaves), the next oldest takes the record over and goes on. Every launcher reads its
orders from the record (``etcd_state.view``) and passes them to its event loop's ``Inbox``, as the other backend's
links do: a round to start, a round's workers to stop, the job's end.

A launcher that cannot renew its lease for ``heartbeat_timeout`` (etcd does not answer, answers too slowly, has no
leader) or finds its lease expired is out of the job: its workers are stopped and it exits 1, saying so; the others
have re-formed without it. At the job's end each launcher revokes its lease, and the last one removes the job's keys.
"""

from __future__ import annotations

import selectors
import time
from dataclasses import dataclass
from typing import Optional

from launcher.nodes.elastic.etcd import departures, keys as ek, state as es
from launcher.nodes.elastic.etcd.mirror import Mirror
from launcher.nodes.elastic.etcd.keeping import RecordKeeper
from launcher.nodes.elastic.etcd.paces import Paces
from launcher.nodes.elastic import membership as mb
from launcher.nodes.transport import messages as m
from launcher.nodes.elastic.fitness import Checker, CheckedUp, Judge, Recheck
from launcher.nodes.elastic.link import (FAILED, Health, JobOver, Leave, LinkBase, Report, Share, StartFailed,
                                         own_id, place_in)
from launcher.nodes.elastic.etcd.client import KeyValue, Refused, Unavailable, compare_created, put_op
from launcher.nodes.elastic.etcd.lease import RETRY_EVERY, Lease
from launcher.nodes.elastic.etcd.ring import Peer, Ring, successor
from launcher.output.messages import log
from launcher.plan.elastic import ElasticSpec
from launcher.plan.policy import one_line


@dataclass(frozen=True)
class WatchEvents:
    """A batch of the watch's events, for the link's thread."""

    events: list


@dataclass(frozen=True)
class WatchEnded:
    reason: str
    watcher: object  # the watch that ended (an older one's end is ignored)


class EtcdLink(LinkBase):
    """This launcher's node key, lease, watch and mirror of the job's keys; the keeper's record when it keeps it."""

    thread_name = "elastic-etcd"  # every launcher says its rounds itself (job.ElasticJob)

    def __init__(self, spec: ElasticSpec, job_id: str, workers: int, token, clock, client: KeyValue,
                 host: str, ring: bool = True, health: Optional[Health] = None) -> None:
        super().__init__()
        self.health, self.judge, self.recheck = health, Judge(health), Recheck(health)  # its checkup in its node key
        self.checker = Checker(health, self.waker)
        self.spec, self.job_id, self.token, self.clock, self.client = spec, job_id, token, clock, client
        self.where = f"etcd at {spec.etcd.shown()}"
        self.prefix = ek.job_prefix(job_id)
        self.node_id = own_id()
        self.me = mb.Node(self.node_id, host, workers)
        self.lease = Lease(client, spec, clock, self.where)
        self.ring = Ring() if ring else None  # finds a launcher whose process is gone before its lease expires
        self.mirror = Mirror(self.prefix, token, job_id)  # the job's keys as this launcher last heard them (``_span``)
        self.records = RecordKeeper(spec, job_id, token, self.me, client, self.mirror, clock, self.where,
                                    lambda node, offered: self.judge.unfit(node.node_id, node.label, offered))
        self.keeps = False  # whether this launcher keeps (or kept) the membership, and so reads the reports
        self.watcher = None
        self.round_given: Optional[m.RoundStart] = None  # the last round given to the event loop
        self.paces = Paces(self.prefix, self.node_id, token, job_id, self.where)  # its speed, the members' read
        self.given_round = self.given_stop = 0
        self.over_given = self.said_standby = self.ended = False

    # ------------------------------------------------------------ start, and the event loop's side

    def start(self) -> None:
        """The lease and the node key (etcd tried again within join_timeout), the mirror, the watch, the thread."""
        checkup = self.health.offer() if self.health is not None else None  # before the lease: it may take a while
        self.lease.grant()
        key = ek.node_key(self.prefix, self.node_id)
        self.ring_at = ring = self.ring.listen(self.me.host) if self.ring is not None else None
        value = ek.node_value(self.me, self.lease.id, self.token, self.job_id, ring, checkup)
        while True:  # an etcd slow to answer (hundreds of launchers joining at once) is asked again, within the lease
            try:
                self.records.created = self.records.created or self.client.put(key, value, self.lease.id)
                self.resync()
                break
            except (Unavailable, Refused) as e:
                if isinstance(e, Refused) or not self.lease.may_retry():
                    raise StartFailed(f"{self.where} failed while this launcher joined ({one_line(str(e), 200)}).") from None
                time.sleep(RETRY_EVERY)
        log.info("elastic job: joined the job %s in %s as node %s (%s); waiting for the round to start", self.job_id,
                 self.where, self.node_id, self.me.host)
        super().serve()  # the thread runs from here: the first round comes through it

    def await_first_round(self) -> Optional[m.RoundStart]:
        """Bounded by join_timeout and read_timeout until admitted; a standby then waits as long as its lease lives
        (the link's thread ends it when it cannot renew it), as a standby of the other backend while node 0 is heard."""
        rendezvous = self.spec.rendezvous
        deadline = self.clock() + rendezvous.join_timeout + rendezvous.read_timeout
        with selectors.DefaultSelector() as selector:
            selector.register(self.inbox.read_fd, selectors.EVENT_READ)
            while self.said_standby or self.clock() < deadline:
                selector.select(1.0 if self.said_standby else min(1.0, max(0.0, deadline - self.clock())))
                items = self.inbox.take()
                for i, item in enumerate(items):
                    if isinstance(item, m.RoundStart):
                        for later in items[i + 1:]:
                            self.inbox.put(later)
                        place = place_in(item, self.node_id)
                        log.info("elastic job: %s; this launcher is node %d", item.text or f"round {item.number}",
                                 place.node_rank)
                        return item
                    if isinstance(item, StartFailed):
                        raise item
                    if isinstance(item, m.KeptOut):  # it checks again: the wait for its round starts again
                        deadline = self.clock() + rendezvous.join_timeout + rendezvous.read_timeout
                    if isinstance(item, JobOver) and item.code == 0 and self.given_round == 0:
                        log.info("elastic job: the job ended without this launcher: %s", one_line(item.reason, 300))
                        return None
                    if isinstance(item, JobOver):
                        raise StartFailed(f"the elastic job did not start: {one_line(item.reason, 300)}.")
        raise StartFailed(f"the job {self.job_id} in {self.where} did not start this launcher's round within "
                          f"{rendezvous.join_timeout + rendezvous.read_timeout:g} s (join_timeout and read_timeout).")

    def serve(self) -> None:
        pass  # the thread runs from start()

    def heartbeat_ages(self) -> dict:  # etcd keeps the heartbeats (the leases): each launcher tells its own
        return {self.node_id: self.lease.age()}

    def release(self) -> None:
        self._leave_etcd()  # first: the launcher before it in the ring finds its key gone, not its ring closed
        if self.ring is not None:
            self.ring.close()

    # ------------------------------------------------------------ the link's thread

    def run(self) -> None:
        try:
            with selectors.DefaultSelector() as selector:
                selector.register(self.waker.read_fd, selectors.EVENT_READ)
                while not self.stopping:
                    if self.ring is not None:
                        self.ring.watch_with(selector, self.waker.read_fd)
                    gone = [peer for key, mask in selector.select(self._wait()) if key.fd != self.waker.read_fd
                            for peer in self.ring.ready(key.fd, mask)]  # only the ring's are registered besides
                    self._revoke(gone)
                    self._turn()
        except Exception as e:  # a bug here must not leave the job running without its link, silently
            log.error("elastic job: this launcher's link to %s failed (%s: %s)", self.where, type(e).__name__, e)
            self._over(1, f"this launcher's link to {self.where} failed ({type(e).__name__})")

    def _revoke(self, gone: list) -> None:
        """Launchers whose process is gone (the ring found it): their leases revoked, their keys gone for every watch."""
        for peer in gone:
            joiner = self.mirror.alive().get(peer.node_id)
            if joiner is not None and joiner.lease == peer.lease:
                log.warning("elastic job: node %s (%s) is gone (its connection closed)", peer.node_id, joiner.node.host)
                try:  # why, first: a keeper that sees its key gone has seen this too
                    self._mark_gone(peer.node_id, departures.LOST, "its connection in the liveness ring closed")
                except (Unavailable, Refused):
                    pass  # its key goes all the same: a loss, told as a silence
                try:
                    self.client.revoke(peer.lease)
                except (Unavailable, Refused) as e:
                    log.debug("elastic job: could not revoke %s's lease (%s)", peer.node_id, one_line(str(e), 200))

    def _wait(self) -> float:
        times = [self.lease.next_beat, self.clock() + 1.0, self.recheck.next_check or self.lease.next_beat]
        times.append(self.records.next_deadline() or times[-1])
        return max(0.0, min(times) - self.clock())

    def _turn(self) -> None:
        items = self.waker.take()
        while items:
            item = items.pop(0)
            if self.checker.holds(item):
                continue
            if isinstance(item, Report) and item.kind == FAILED and self.health is not None:
                self.checker.ask(item)  # checked again before the failure spends a restart; reported as it comes back
            elif isinstance(item, Report):
                self._report(item)
            elif isinstance(item, CheckedUp) and item.after is not None:
                self._report(item.after, item.checkup)
                items[:0] = self.checker.released()  # what waited for it, in order
            elif isinstance(item, CheckedUp):  # kept out: checked again, its node key written again for the keeper
                self._write_node(item.checkup)
            elif isinstance(item, Leave):  # why, first: the lease is revoked as the thread ends (``release``)
                self.stopping = True
                try:
                    self._mark_gone(self.node_id, departures.LEFT, item.reason)
                except (Unavailable, Refused) as e:
                    log.debug("elastic job: could not tell %s why this node leaves (%s)", self.where, one_line(str(e), 200))
                return
            elif isinstance(item, Share):
                self.paces.write(self.client, self.lease.id, item.entry, self.round_given, self.clock())
            elif isinstance(item, WatchEvents):
                self.mirror.apply(item.events)
            elif isinstance(item, WatchEnded) and item.watcher is self.watcher:
                log.debug("elastic job: the watch of %s ended (%s); watching again", self.where, item.reason)
                self.watcher = None
        if self.stopping:
            return
        self._renew()
        if not self.checker.busy and self.recheck.due(self.clock()):  # kept out: checked again, beside this thread
            self.checker.ask()
        if self.watcher is None and not self.stopping:
            try:
                self.resync()
            except (Unavailable, Refused):
                return  # tried again next turn; the lease's renewal decides when this launcher is out
        self._decide()
        paces = self.paces.news(self.mirror.paces(self.mirror.alive()), self.round_given)
        if paces is not None:
            self.inbox.put(m.Speeds(paces))

    def _renew(self) -> None:
        out = self.lease.renew()
        if out is not None:
            self._over(1, out)

    def resync(self) -> None:
        """The keys this launcher reads (``_span``) read afresh, and watched from there on."""
        self._unwatch()
        start, end = self._span()
        revision, entries = self.client.range(start, end)
        self.mirror.reset(entries)
        holder: list = []
        watcher = self.client.watch(start, revision + 1, lambda events: self.waker.put(WatchEvents(events)),
                                    lambda reason: self.waker.put(WatchEnded(reason, holder[0] if holder else None)),
                                    end)
        holder.append(watcher)
        self.watcher = watcher

    def _span(self) -> tuple:
        """Every key of the job for the keeper, which reads the reports; the node keys and the record for the others."""
        return (self.prefix, None) if self.keeps else ek.orders_span(self.prefix)

    def _unwatch(self) -> None:
        if self.watcher is not None:
            self.watcher.stop()
            self.watcher = None

    def _mark_gone(self, node_id: str, kind: str, reason: str) -> None:
        """Why ``node_id`` is gone, for the keeper; the launcher's own word (left) stands over its ring's (lost)."""
        key = departures.gone_key(self.prefix, node_id)
        value = departures.gone_value(kind, reason, self.node_id, self.token, self.job_id)
        self.client.txn([] if kind == departures.LEFT else [compare_created(key, 0)], [put_op(key, value)])

    def _report(self, report: Report, checkup: Optional[dict] = None) -> None:
        value = ek.report_value(self.node_id, self.lease.id, report.kind, report.round, report.code, report.reason,
                                self.token, self.job_id, checkup)
        try:
            self.client.put(ek.report_key(self.prefix, self.node_id, report.kind), value, self.lease.id)
        except (Unavailable, Refused) as e:
            log.warning("elastic job: could not tell %s that this node's workers %s (%s)", self.where, report.kind,
                        one_line(str(e), 200))

    def _write_node(self, checkup: Optional[dict]) -> None:
        value = ek.node_value(self.me, self.lease.id, self.token, self.job_id, self.ring_at, checkup)
        try:
            self.client.put(ek.node_key(self.prefix, self.node_id), value, self.lease.id)
        except (Unavailable, Refused):
            self.recheck.next_check = self.clock()  # checked and written again next turn

    # ------------------------------------------------------------ the keeper, and every launcher's orders

    def _decide(self) -> None:
        alive = self.mirror.alive()
        if self.ring is not None:  # the next proven launcher by its key's age
            ring = sorted((j for j in alive.values() if j.proven and j.ring), key=lambda j: j.created)
            self.ring.follow(successor([Peer(j.node.node_id, j.lease, j.ring) for j in ring], self.node_id))
        entry = self.mirror.get(ek.record_key(self.prefix))
        theirs = self.records.read(entry)
        if entry is not None and theirs is None:  # not this job's: never obeyed, never overwritten
            if self.given_round == 0:
                self._over(1, f"the record of the job {self.job_id} in {self.where} does not prove this launcher's job "
                              "token (LAUNCHER_JOB_TOKEN): it is kept by launchers with another token; give every node "
                              "the same token, or this job another --rdzv-id")
            return
        if theirs is not None and theirs.state.end is not None and theirs.state.known(self.node_id) is not None:
            # this launcher's job ended, and its keeper may have left at once (its key gone in the same batch as the
            # end): keeping the membership now would take the ended record for an earlier run's and start afresh
            self._deliver(es.view(theirs, self.node_id))
            return
        if es.keeper_of(j for j in alive.values() if j.proven) == self.node_id:
            if not self.keeps:  # the reports too from now on: read every key afresh, then decide on them
                self.keeps = True
                return self._resync_and_decide()
            record, beaten = self.records.keep(alive, entry)
            if beaten:  # another keeper wrote the record, or this launcher's key is gone: read everything again
                self._unwatch()
        else:
            self.records.record = None
            record = theirs
        if record is not None:
            self._deliver(es.view(record, self.node_id))

    def _resync_and_decide(self) -> None:
        try:
            self.resync()
        except (Unavailable, Refused):
            return  # tried again next turn
        self._decide()

    def _deliver(self, view: es.View) -> None:
        waits = view.kept_out is not None or view.standby  # it checks itself again every interval
        if waits and self.recheck.kept_out(view.kept_out, self.clock()) and view.kept_out and not self.given_round:
            self.inbox.put(m.KeptOut(view.kept_out))
        if view.refused is not None and self.given_round == 0:
            self.inbox.put(StartFailed(f"the job {self.job_id} in {self.where} did not take this launcher: "
                                       f"{one_line(view.refused, 300)}."))
            self.stopping = True
            return
        if view.round is not None and view.round.number > self.given_round:
            self.inbox.put(view.round)
            self.given_round = view.round.number
            self.round_given = view.round
        if view.stop is not None and view.stop[0] == self.given_round and self.given_stop < self.given_round:
            self.inbox.put(m.StopWorkers(*view.stop))
            self.given_stop = self.given_round
        if view.standby and not self.said_standby and self.given_round == 0:
            log.info("elastic job: this launcher waits as a standby")
            self.said_standby = True
        if view.over is not None:
            self.ended = view.job_ended
            self._over(*view.over)
        elif self.given_round and view.round is None and view.round_number > self.given_round and not view.standby:
            self._over(1, f"the job re-formed without this launcher (round {view.round_number}): the others counted it "
                          "as lost")

    def _over(self, code: int, reason: str) -> None:
        if not self.over_given:
            self.over_given = True
            self.inbox.put(JobOver(code, reason))
        self.stopping = True

    def _leave_etcd(self) -> None:
        """Out of the job: the watch stopped, the lease revoked (its keys go with it), the job's keys cleared by the
        last launcher of an ended job."""
        self._unwatch()
        self.lease.leave(self.prefix, self.ended)
