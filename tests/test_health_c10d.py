"""A c10d elastic job's launchers judged by their health checks, on loopback sockets (node 0's keeper and each
launcher's member link, in threads, on the real clock): a joiner that fails is kept out, says why, and joins once it
passes; a member whose checks fail after its worker failure leaves as unhealthy and a fit standby takes its place,
no restart spent; a sick standby is set aside, not promoted."""

import threading
import time

from conftest import free_ports
from link_harness import wait_until
from launcher.nodes.elastic import membership as mb
from launcher.nodes.elastic.c10d import start
from launcher.nodes.elastic.c10d.keeper import Keeper
from launcher.nodes.elastic.link import Health, own_id
from launcher.nodes.transport import messages as m
from launcher.plan.elastic import ElasticSpec, Rendezvous
from launcher.plan.health import FAILED, Checkup, Facts, Finding, HealthSettings

INTERVAL = 0.2  # seconds between two checks of a launcher kept out or aside
HOST = "127.0.0.1"


class Body:
    """One launcher's machine, as its checks see it: ``script`` its training script's hash, ``sick`` a failed
    check of its own (after a failure only, or always)."""

    def __init__(self, script="good", sick=None, sick_after_failure=None):
        self.script, self.sick, self.sick_after_failure, self.checks = script, sick, sick_after_failure, 0

    def health(self) -> Health:
        return Health(HealthSettings(interval=INTERVAL), self.check, lambda: self.check(False).facts)

    def check(self, after_failure: bool) -> Checkup:
        self.checks += 1
        sick = self.sick_after_failure if after_failure and self.sick_after_failure else self.sick
        findings = (Finding("shm", FAILED, sick),) if sick else ()
        return Checkup(Facts("3.11", "1.0", None, self.script, time.time()), findings)


def job(low, high, restarts=0, last_call=0.5):
    rendezvous = Rendezvous(keep_alive_interval=0.5, heartbeat_timeout=10.0, join_timeout=30.0,
                            last_call_timeout=last_call, close_timeout=10.0, read_timeout=10.0)
    return ElasticSpec(low, high, "c10d", host=HOST, port=free_ports(1), rendezvous=rendezvous, max_restarts=restarts)


class Launchers:
    def __init__(self, spec):
        self.spec, self.links, self.threads, self.errors = spec, {}, [], []
        self.keeper = Keeper(start.listen(HOST, spec.port), spec, "job", mb.Node(own_id(), HOST, 1), None,
                             time.monotonic, Body().health())

    def lead(self):
        self._run("keeper", lambda: self.keeper if self.keeper.first_round() else None)

    def join(self, name, body):
        self._run(name, lambda: start.join(self.spec, "job", 1, None, time.monotonic, body.health()))

    def _run(self, name, form):
        def run():
            try:
                link = form()
                link.serve()
                self.links[name] = link
            except Exception as e:  # the test's failure names it
                self.errors.append((name, e))
        t = threading.Thread(target=run, daemon=True)
        t.start()
        self.threads.append(t)

    def formed(self, *names):
        wait_until(lambda: all(n in self.links for n in names) or self.errors, f"{names} formed")
        assert not self.errors, self.errors

    def close(self):
        for link in list(self.links.values()) + [self.keeper]:
            link.close()



def test_a_joiner_whose_script_differs_is_kept_out_then_joins_once_it_passes(caplog):
    launchers = Launchers(job(2, 2))
    sick = Body(script="another copy")
    try:
        launchers.lead()
        launchers.join("n1", sick)
        wait_until(lambda: sick.checks >= 3, "node 1 checked itself again, kept out")
        assert "keeper" not in launchers.links  # nothing started meanwhile
        assert any("node 0 keeps this launcher out" in r.getMessage() and "failed the health check script" in
                   r.getMessage() for r in caplog.records)
        sick.script = "good"  # mended
        launchers.formed("keeper", "n1")
        assert len(launchers.keeper.first.members) == 2
        assert all(v.fit for v in [list(launchers.keeper.judge.verdicts.values())[-1]])
    finally:
        launchers.close()


def fail_the_member(launchers, member, standby):
    """Node 0 and member n1 formed, standby n2 waiting (at MAX) and checked again; n1's worker fails and node 0's own
    workers stop; the round after it formed on n2. Node 0's keeper."""
    launchers.lead()
    launchers.join("n1", member)
    launchers.formed("keeper", "n1")
    launchers.join("n2", standby)  # at MAX: waits as a standby
    wait_until(lambda: standby.checks >= 2, "the standby checked again while it waits")
    launchers.links["n1"].failed(1, 1, "rank 1 failed")
    keeper = launchers.keeper
    wait_until(lambda: any(isinstance(x, m.StopWorkers) for x in keeper.inbox.items), "node 0 told to stop")
    keeper.stopped(1)
    launchers.formed("n2")
    return keeper


def test_a_member_sick_after_its_failure_leaves_unhealthy_and_a_standby_takes_its_place_with_no_restart_spent():
    launchers = Launchers(job(2, 2, restarts=3))
    member, standby = Body(sick_after_failure="/dev/shm is full"), Body()
    try:
        keeper = fail_the_member(launchers, member, standby)
        second = launchers.links["n2"].first
        assert second.number == 2 and second.restarts == 0
        assert {s.node_id for s in second.members} == {keeper.node_id, launchers.links["n2"].node_id}
        (gone,) = [c for c in second.changes if c.kind != "joined"]
        assert (gone.node_id, gone.kind) == (launchers.links["n1"].node_id, "unhealthy")
        assert "/dev/shm is full" in gone.reason
        wait_until(lambda: launchers.links["n1"].aside, "the sick launcher is set aside, checking again")
    finally:
        launchers.close()


class SlowBody(Body):
    """A launcher whose check after a failure runs longer than the heartbeat timeout (the user's own, say), then fails."""

    def check(self, after_failure: bool) -> Checkup:
        if after_failure:
            time.sleep(SLOW_CHECK)
        return super().check(after_failure)


SLOW_CHECK = 3.0  # seconds: three heartbeat timeouts of the job below


def test_a_check_longer_than_the_heartbeat_timeout_after_a_failure_keeps_the_member_heard():
    """The check after a failure runs beside the link's thread, which goes on beating: the member leaves as unhealthy
    once its check says so, never as silent while it checks."""
    spec = job(2, 2, restarts=3)
    spec = ElasticSpec(2, 2, "c10d", host=HOST, port=spec.port, max_restarts=3, rendezvous=Rendezvous(
        keep_alive_interval=0.2, heartbeat_timeout=SLOW_CHECK / 3, join_timeout=30.0, last_call_timeout=0.5,
        close_timeout=10.0, read_timeout=10.0))
    launchers = Launchers(spec)
    member, standby = SlowBody(sick_after_failure="an ECC error is pending"), Body()
    try:
        fail_the_member(launchers, member, standby)
        (gone,) = [c for c in launchers.links["n2"].first.changes if c.kind != "joined"]
        assert (gone.node_id, gone.kind) == (launchers.links["n1"].node_id, "unhealthy")
        assert "an ECC error is pending" in gone.reason
    finally:
        launchers.close()


def test_a_sick_standby_is_not_promoted_and_joins_once_it_passes():
    launchers = Launchers(job(1, 2, last_call=20.0))  # round 1 waits for n1 (at MAX it starts at once)
    standby = Body()
    try:
        launchers.lead()
        launchers.join("n1", Body())
        launchers.formed("keeper", "n1")
        launchers.join("n2", standby)
        wait_until(lambda: standby.checks >= 2, "admitted as a standby, checking again")
        standby.sick = "a GPU is held by another job"
        wait_until(lambda: launchers.keeper.state.aside, "the sick standby set aside")
        launchers.links["n1"].leave(0, "done here")
        keeper = launchers.keeper
        wait_until(lambda: any(isinstance(x, m.StopWorkers) for x in keeper.inbox.items), "node 0 told to stop")
        keeper.stopped(1)
        wait_until(lambda: keeper.state.round.number == 2, "round 2, without the sick standby")
        assert len(keeper.state.round.members) == 1 and "n2" not in launchers.links
        standby.sick = None  # mended: below MAX, it joins at its next check
        wait_until(lambda: any(isinstance(x, m.StopWorkers) and x.round == 2 for x in keeper.inbox.items), "a re-form")
        keeper.stopped(2)
        launchers.formed("n2")
        assert launchers.links["n2"].first.number == 3
    finally:
        launchers.close()


JUNK = [{"facts": {"python": ["3"], "launcher": "1.0", "torch": None, "script": None, "clock": "now"}, "findings": []},
        {"facts": [[[[]]]]}, "facts", 12, [], {"facts": {}, "findings": [["shm", "failed", {"deep": [[[]]]}]]}]


class Hostile(Body):
    """A launcher whose checkup is not one: each hello carries the next value of JUNK."""

    def health(self) -> Health:
        body = self

        class Junk(Health):
            def offer(self, after_failure=False):
                body.checks += 1
                return JUNK[body.checks % len(JUNK)]
        return Junk(HealthSettings(interval=INTERVAL), self.check, lambda: self.check(False).facts)


def test_a_checkup_that_is_not_one_keeps_the_launcher_out_in_one_sentence_and_node_0_goes_on():
    launchers = Launchers(job(1, 2))
    hostile = Hostile()
    try:
        launchers.lead()
        wait_until(lambda: launchers.keeper.first is not None, "node 0 alone started the job")
        launchers.join("n1", hostile)
        wait_until(lambda: hostile.checks >= 2 * len(JUNK), "every hostile checkup sent")
        refusals = {v.refusal.split(" sent ")[1] for v in launchers.keeper.judge.verdicts.values()}
        assert refusals == {"a health checkup that is not one (a field missing or of a wrong type): run the same "
                            "launcher version on every node"}
        assert not launchers.errors and launchers.keeper.thread.is_alive() and "n1" not in launchers.links
    finally:
        launchers.close()


def test_a_node_0_that_fails_its_own_checks_refuses_the_job_in_one_sentence_and_frees_its_endpoint():
    """Node 0 of a c10d job cannot leave the job it keeps: sick, it refuses to start (exit 2), before anyone joins."""
    import pytest

    from launcher.errors import LaunchError

    spec = job(1, 2)
    listener = start.listen(HOST, spec.port)
    with pytest.raises(LaunchError) as refused:
        start.lead(listener, spec, "job", 1, None, time.monotonic, Body(sick="/dev/shm is full").health())
    assert str(refused.value).startswith(f"node 0 ({HOST}) failed the health check shm: /dev/shm is full")
    assert getattr(refused.value, "exit_code", 2) == 2 and listener.fileno() == -1
