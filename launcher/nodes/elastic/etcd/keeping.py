"""The keeper's side of an etcd job: the record read back (decoded once per revision), taken over from the keeper
before, reconciled with what the keys say, and written in a transaction guarded by its own last revision and the
keeper's node key, so that no two keepers race each other into two memberships."""

from __future__ import annotations

from typing import Callable, Optional

from launcher.nodes.elastic import membership as mb
from launcher.nodes.elastic.etcd import keys as ek, state as es
from launcher.nodes.elastic.etcd.client import (Entry, KeyValue, Refused, Unavailable, compare_created, compare_modified,
                                                put_op)
from launcher.nodes.elastic.etcd.mirror import Mirror
from launcher.output.messages import log
from launcher.plan.elastic import ElasticSpec
from launcher.plan.policy import Say, one_line


class RecordKeeper:
    """The record as this launcher reads it, and, while it keeps the membership, writes it."""

    def __init__(self, spec: ElasticSpec, job_id: str, token, me: mb.Node, client: KeyValue, mirror: Mirror,
                 clock: Callable[[], float], where: str, judge: Callable = lambda _: None) -> None:
        self.spec, self.job_id, self.token, self.me, self.client = spec, job_id, token, me, client
        self.mirror, self.clock, self.where, self.judge = mirror, clock, where, judge  # judge: a joiner's unfitness
        self.key = ek.record_key(ek.job_prefix(job_id))
        self.created = 0  # the keeper's node key's create revision: its writes are guarded by it
        self.record: Optional[es.Record] = None  # this launcher's while it keeps the membership
        self.written = -1  # the record's revision as this keeper wrote it last
        self.encoded = ""  # the orders in the record as this keeper wrote it last (es.orders)
        self.fed: set = set()
        self.read_cache: tuple = (None, None)  # (revision, Record) of the record last decoded
        self.said_unproven = False

    def next_deadline(self) -> Optional[float]:
        return mb.next_deadline(self.record.state) if self.record is not None else None

    def read(self, entry: Optional[Entry]) -> Optional[es.Record]:
        """The record in ``entry`` (None: none, or not this job's: unproven or malformed, said once)."""
        if entry is None:
            return None
        if self.read_cache[0] == entry.mod_revision:
            return self.read_cache[1]
        record = es.decode(entry.value, self.spec, self.job_id, self.token, self.clock())
        if record is None and not self.said_unproven:
            log.warning("elastic job: the record of the job %s in %s is not this job's (it does not prove the job "
                        "token, LAUNCHER_JOB_TOKEN, or is malformed); check that every node has the same token",
                        self.job_id, self.where)
            self.said_unproven = True
        self.read_cache = (entry.mod_revision, record)
        return record

    def keep(self, alive: es.Alive, entry: Optional[Entry]) -> tuple:
        """The record after this keeper's turn (None: not written, decided again next turn), and whether its write
        was beaten (then everything is read again)."""
        now = self.clock()
        if self.record is None or (entry.mod_revision if entry else 0) != self.written:
            theirs = self.read(entry)
            before = theirs.state.keeper if theirs is not None else None
            self.record, actions = es.take_over(theirs, self.spec, self.me, self.job_id, alive, now)
            self.written, self.fed, self.encoded = (entry.mod_revision if entry else 0), set(), ""
            if before is not None and before != self.me.node_id:
                log.info("elastic job: this launcher keeps the membership now (node %s before it is gone)", before)
            say(actions)
        self.record, actions, self.fed = es.reconcile(self.record, alive, self.mirror.reports(alive), self.fed, now,
                                                      self.mirror.why_gone(self.spec.rendezvous.heartbeat_timeout),
                                                      self.judge)
        say(actions)
        orders = es.encode(es.orders(self.record), None, self.job_id)
        beaten = orders != self.encoded and not self._write(es.encode(self.record, self.token, self.job_id), orders)
        return self.record, beaten

    def _write(self, text: str, orders: str) -> bool:
        """False when another keeper wrote the record, or this launcher's key is gone."""
        guard = [compare_modified(self.key, self.written) if self.written > 0 else compare_created(self.key, 0),
                 compare_created(ek.node_key(ek.job_prefix(self.job_id), self.me.node_id), self.created)]
        try:
            done, revision = self.client.txn(guard, [put_op(self.key, text)])
        except (Unavailable, Refused) as e:
            log.warning("elastic job: could not write the membership to %s (%s)", self.where, one_line(str(e), 200))
            self.record = None  # read again and decided again next turn
            return True
        if not done:
            self.record = None
            return False
        self.written, self.encoded = revision, orders
        before = self.mirror.get(self.key)
        self.mirror.put(Entry(self.key, text, before.create_revision if before else revision, revision))
        return True


def say(actions) -> None:
    """The rules' words, but the rounds: each launcher says its rounds itself."""
    rounds = {mb.describe(a.round) for a in actions if isinstance(a, mb.StartRound)}
    for action in actions:
        if isinstance(action, Say) and action.text not in rounds:
            log.log(action.level, "elastic job: %s", action.text)
