"""An etcd elastic job's launchers judged by their health checks, on a real etcd (tests/etcd_servers.py): each
launcher's checkup goes in its node key (and in its failure's report), the keeper judges it against its own facts. A
launcher that fails is kept out, says why, checks itself again every interval (its key written again) and joins once
it passes; a member sick after its worker failure leaves as unhealthy and a fit standby takes its place, no restart
spent; a sick standby is set aside, not promoted."""

import threading
import time

import pytest

from etcd_servers import etcd  # noqa: F401 - the fixture
from link_harness import wait_until
from test_health_c10d import Body
from launcher.nodes.elastic.etcd import start
from launcher.nodes.elastic.etcd.client import Etcd3gwClient
from launcher.nodes.transport import messages as m
from launcher.plan.elastic import ElasticSpec, Rendezvous
from launcher.plan.etcd import EtcdSpec, parse_endpoints


class Launchers:
    """Launchers of one etcd job in threads, each formed with its own client and its body's health checks."""

    def __init__(self, etcd, low, high, restarts=0, last_call=0.5):  # noqa: F811
        self.spec = ElasticSpec(low, high, "etcd", etcd=EtcdSpec(parse_endpoints(etcd.endpoints, "test")[0]),
                                max_restarts=restarts,
                                rendezvous=Rendezvous(keep_alive_interval=0.5, heartbeat_timeout=10.0,
                                                      join_timeout=30.0, last_call_timeout=last_call,
                                                      close_timeout=10.0, read_timeout=10.0))
        self.links, self.errors, self.clients, self.threads = {}, [], [], []

    def join(self, name, body):
        def form():
            client = Etcd3gwClient(self.spec.etcd, 2.0)
            self.clients.append(client)
            try:
                self.links[name] = start.form(self.spec, "health-job", 1, None, time.monotonic, client,
                                              health=body.health())
            except Exception as e:  # the test's failure names it
                self.errors.append((name, e))
        self.threads.append(threading.Thread(target=form, daemon=True))
        self.threads[-1].start()

    def first(self, name, body):
        """``name``'s key written first: it keeps the membership."""
        self.join(name, body)
        wait_until(lambda: body.checks >= 1, f"{name} wrote its node key")  # its checkup, for its key
        time.sleep(0.5)

    def formed(self, *names):
        wait_until(lambda: all(n in self.links for n in names) or self.errors, f"{names} formed")
        assert not self.errors, self.errors

    def stop_order(self, name, round_):
        link = self.links[name]
        wait_until(lambda: any(isinstance(x, m.StopWorkers) and x.round == round_ for x in link.inbox.items),
                   f"{name} told to stop round {round_}")
        link.stopped(round_)

    def close(self):
        for link in self.links.values():
            link.close()
        for t in self.threads:
            t.join(5)
        for client in self.clients:
            client.close()


@pytest.fixture
def launchers(etcd):  # noqa: F811
    made = []
    yield lambda *args, **kwargs: made.append(Launchers(etcd, *args, **kwargs)) or made[-1]
    for job in made:
        job.close()


def test_a_joiner_whose_script_differs_is_kept_out_then_joins_once_it_passes(launchers, caplog):
    job, sick = launchers(2, 2), Body(script="another copy")
    job.first("a", Body())
    job.join("b", sick)
    wait_until(lambda: sick.checks >= 3 or job.errors, "b checked itself again, kept out")
    assert not job.links and not job.errors  # nothing started meanwhile
    assert any("this launcher is kept out" in r.getMessage() and "failed the health check script" in r.getMessage()
               for r in caplog.records)
    sick.script = "good"  # mended
    job.formed("a", "b")
    assert job.links["a"].first.number == job.links["b"].first.number == 1 and len(job.links["b"].first.members) == 2
    assert job.links["a"].health_states()[job.links["b"].node_id]["script"] == ("ok", "")


def test_a_member_sick_after_its_failure_leaves_unhealthy_and_a_standby_takes_its_place(launchers):
    job, member, standby = launchers(2, 2, restarts=3), Body(sick_after_failure="/dev/shm is full"), Body()
    job.first("a", Body())
    job.join("b", member)
    job.formed("a", "b")
    job.join("c", standby)  # at MAX: a standby, which writes its key again every interval
    wait_until(lambda: standby.checks >= 3, "the standby checked itself again while it waits")
    job.links["b"].failed(1, 1, "rank 1 failed")
    job.stop_order("a", 1)
    job.formed("c")
    second = job.links["c"].first
    assert second.number == 2 and second.restarts == 0  # no restart spent
    assert {s.node_id for s in second.members} == {job.links["a"].node_id, job.links["c"].node_id}
    (gone,) = [c for c in second.changes if c.kind != "joined"]
    assert (gone.node_id, gone.kind) == (job.links["b"].node_id, "unhealthy") and "/dev/shm is full" in gone.reason
    checks = member.checks
    wait_until(lambda: member.checks > checks + 1, "the sick launcher stays, checking itself again")


def test_a_sick_standby_is_not_promoted_and_joins_once_it_passes(launchers):
    job, standby = launchers(1, 2, last_call=20.0), Body()  # round 1 waits for b (at MAX it starts at once)
    job.first("a", Body())
    job.join("b", Body())
    job.formed("a", "b")
    job.join("c", standby)
    wait_until(lambda: standby.checks >= 3, "a standby, checking itself again")
    standby.sick = "a GPU is held by another job"
    keeper = job.links["a"]
    wait_until(lambda: any(v.refusal for v in keeper.judge.verdicts.values()), "the sick standby judged, set aside")
    job.links["b"].leave(0, "done here")
    job.stop_order("a", 1)
    wait_until(lambda: any(isinstance(x, m.RoundStart) and x.number == 2 for x in keeper.inbox.items), "round 2")
    round2 = next(x for x in keeper.inbox.items if isinstance(x, m.RoundStart) and x.number == 2)
    assert len(round2.members) == 1 and "c" not in job.links  # not promoted
    standby.sick = None  # mended: below MAX, it joins at its next check
    job.stop_order("a", 2)
    job.formed("c")
    assert job.links["c"].first.number == 3
