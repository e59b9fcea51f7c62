"""This launcher's lease in etcd, its heartbeat: granted within join_timeout, renewed every
``keep_alive_interval`` (a third of its TTL at most), and revoked when the launcher leaves, when the last
launcher of an ended job also clears the job's keys. Its TTL is ``heartbeat_timeout``: a launcher that
cannot renew it for that long is out of the job, and its keys go with it."""

from __future__ import annotations

import math
import time
from typing import Callable, Optional

from launcher.nodes.elastic.etcd.client import KeyValue, Refused, Unavailable
from launcher.nodes.elastic.link import StartFailed
from launcher.output.messages import log
from launcher.plan.elastic import ElasticSpec
from launcher.plan.policy import one_line

RETRY_EVERY = 0.5  # etcd unreachable at the start: tried again this often, within join_timeout
LEAVE_WAIT = 5.0  # how long a launcher that leaves asks etcd again to revoke its lease and clear an ended job


def request_timeout(spec: ElasticSpec) -> float:
    """Seconds one etcd request may take: a third of the heartbeat timeout (the lease is renewed in time
    through a member that answers), one second at least."""
    return max(1.0, spec.rendezvous.heartbeat_timeout / 3)


def lease_ttl(spec: ElasticSpec) -> int:
    return max(1, math.ceil(spec.rendezvous.heartbeat_timeout))


class Lease:
    def __init__(self, client: KeyValue, spec: ElasticSpec, clock: Callable[[], float], where: str) -> None:
        self.client, self.spec, self.clock, self.where = client, spec, clock, where
        self.id = 0
        self.kept = clock()  # when it was last renewed
        self.next_beat = clock()

    def grant(self) -> None:
        """A new lease, etcd tried again within join_timeout; StartFailed, one sentence, when it cannot be had."""
        deadline, warned = self.clock() + self.spec.rendezvous.join_timeout, False
        while True:
            try:
                self.id = self.client.grant(lease_ttl(self.spec))
                break
            except Unavailable as e:
                if self.clock() + RETRY_EVERY >= deadline:
                    raise StartFailed(f"{self.where} did not answer within {self.spec.rendezvous.join_timeout:g} s "
                                      f"(join_timeout; last: {one_line(str(e), 200)}); check that etcd runs and "
                                      "--rdzv-endpoint names it.") from None
                if not warned:
                    log.warning("elastic job: %s does not answer (%s); trying again until join_timeout", self.where,
                                one_line(str(e), 200))
                    warned = True
                time.sleep(RETRY_EVERY)
            except Refused as e:
                raise StartFailed(f"{self.where} refused this launcher ({one_line(str(e), 200)}); check the etcd user "
                                  "and password, or its certificates (--rdzv-conf).") from None
        self.kept = self.next_beat = self.clock()

    def age(self) -> float:
        """Seconds since etcd last renewed the lease."""
        return max(0.0, self.clock() - self.kept)

    def may_retry(self) -> bool:
        """Whether a request that failed may be tried again before the lease would lapse."""
        return self.clock() - self.kept + RETRY_EVERY < self.spec.rendezvous.heartbeat_timeout

    def renew(self) -> Optional[str]:
        """Kept alive when due; why this launcher is out of the job (its lease expired, or etcd did not answer
        for heartbeat_timeout), or None."""
        now = self.clock()
        if now < self.next_beat:
            return None
        self.next_beat = now + min(self.spec.rendezvous.keep_alive_interval, lease_ttl(self.spec) / 3)
        try:
            ttl = self.client.keepalive(self.id)
        except (Unavailable, Refused) as e:
            ttl, problem = None, one_line(str(e), 200)
        timeout = self.spec.rendezvous.heartbeat_timeout
        if ttl == 0:
            return (f"this launcher's lease in {self.where} expired (it was not renewed within heartbeat_timeout "
                    f"{timeout:g} s): the job went on without this node")
        if ttl is not None:
            self.kept = self.clock()
        elif self.clock() - self.kept > timeout:
            return (f"{self.where} did not answer for {self.clock() - self.kept:.1f} s (heartbeat_timeout {timeout:g} s; "
                    f"last: {problem}): this launcher lost its place in the job")
        return None

    def leave(self, prefix: str, ended: bool) -> None:
        """Revoked (its keys go with it); the last launcher of an ended job removes the job's keys. etcd slow to
        answer is asked again, up to LEAVE_WAIT: a launcher that left its key behind would keep the last one from
        seeing that it is the last. The client is closed at the end."""
        deadline = self.clock() + LEAVE_WAIT
        try:
            while True:
                try:
                    return self._revoke_and_clear(prefix, ended)
                except Unavailable as e:
                    if self.clock() + RETRY_EVERY >= deadline:
                        raise Refused(f"no answer within {LEAVE_WAIT:g} s; last: {e}") from None
                    time.sleep(RETRY_EVERY)
        except Refused as e:
            log.warning("elastic job: could not leave %s cleanly (%s): this node's keys go when its lease expires, "
                        "and a job's record left behind is replaced by the next run of the job", self.where,
                        one_line(str(e), 200))
        finally:
            self.client.close()

    def _revoke_and_clear(self, prefix: str, ended: bool) -> None:
        if self.id:
            self.client.revoke(self.id)
            self.id = 0
        if ended:
            _, left = self.client.range(prefix + "nodes/")
            if not left:
                self.client.delete_prefix(prefix)
