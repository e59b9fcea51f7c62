"""The membership in etcd as keys and values (launcher.nodes.elastic.etcd.state), replayed without etcd: who keeps it,
a keeper taking the record over (the one before it lost), what the keys feed the rules, what each launcher reads,
and a record or report that is malformed, hostile or unproven read as nothing."""

import json

from launcher.nodes.elastic.etcd import keys as ek, state as es
from launcher.nodes.elastic import membership as mb
from launcher.plan.elastic import ElasticSpec, Rendezvous

SPEC = ElasticSpec(2, 3, "etcd", rendezvous=Rendezvous(last_call_timeout=1.0))
JOB = "job1"
A, B, C = (mb.Node(n, f"10.0.0.{i}", 1) for i, n in enumerate("abc", 1))


def joiner(node, created, token=None, lease=None, proves=None):
    """``node``'s key as the keeper reads it with ``token``; ``proves``: the token its launcher proves (the same)."""
    lease = lease or created * 10
    value = ek.node_value(node, lease, proves or token, JOB)
    return ek.read_node(value, lease, created, token, JOB)


def alive(*pairs, token=None):
    return {node.node_id: joiner(node, created, token) for node, created in pairs}


def running_record(now=0.0):
    """a keeps the job; a, b, c joined; round 1 runs with all three."""
    record, _ = es.take_over(None, SPEC, A, JOB, alive((A, 1)), now)
    record, actions, fed = es.reconcile(record, alive((A, 1), (B, 2), (C, 3)), [], set(), now)
    assert record.state.phase == mb.RUNNING and [m.node for m in record.state.round.members] == [A, B, C]
    return record


def test_the_oldest_live_launcher_keeps_the_membership():
    assert es.keeper_of(alive((B, 7), (A, 3), (C, 9)).values()) == "a"
    assert es.keeper_of([]) is None


def test_a_keeper_that_takes_over_loses_the_one_before_and_reforms_the_survivors():
    record = running_record()
    text = es.encode(record, None, JOB)
    theirs = es.decode(text, SPEC, JOB, None, now=10.0)
    assert theirs.state.round == record.state.round and theirs.state.members == record.state.members
    survivors = alive((B, 2), (C, 3))
    mine, _ = es.take_over(theirs, SPEC, B, JOB, survivors, now=10.0)
    assert mine.state.keeper == "b"
    mine, actions, fed = es.reconcile(mine, survivors, [], set(), now=10.0)
    assert mine.state.phase == mb.REFORMING and mine.stop[0] == 1
    assert any(isinstance(a, mb.StopWorkers) and a.nodes == ("b", "c") for a in actions)
    assert "its key in etcd is gone" in mine.stop[1]
    stopped = [((ek.report_key("/p/", n, "stopped"), 20 + i), mb.WorkersStopped(n, 1)) for i, n in enumerate("bc")]
    mine, actions, fed = es.reconcile(mine, survivors, stopped, fed, now=11.0)
    assert mine.state.phase == mb.RUNNING and mine.state.round.number == 2 and mine.stop is None
    assert [m.node.node_id for m in mine.state.round.members] == ["b", "c"] and mine.state.restarts == 0
    # the same reports again change nothing
    again, actions, _ = es.reconcile(mine, survivors, stopped, fed, now=12.0)
    assert again.state.round == mine.state.round and not [a for a in actions if not isinstance(a, mb.Say)]


def test_a_launchers_stop_report_changes_no_order_and_a_keeper_that_takes_over_reads_it_again():
    def orders(record):  # as the keeper compares them
        return es.encode(es.orders(record), None, JOB)

    everyone = alive((A, 1), (B, 2), (C, 3))
    record = running_record()
    failed = [((ek.report_key("/p/", "c", "failed"), 20), mb.WorkerFailed("c", 1, 1, "rank 2 exited 1"))]
    stopping, _, fed = es.reconcile(record, everyone, failed, set(), now=1.0)
    assert orders(stopping) != orders(record) and stopping.state.unstopped == {"a", "b", "c"}
    written = es.encode(stopping, None, JOB)  # the keeper writes the stop order
    reports = failed + [((ek.report_key("/p/", n, "stopped"), 21 + i), mb.WorkersStopped(n, 1)) for i, n in enumerate("ab")]
    mine, _, fed = es.reconcile(stopping, everyone, reports, fed, now=1.5)
    assert orders(mine) == orders(stopping) and mine.state.unstopped == {"c"}  # nothing to write
    # the keeper is lost now: the next one reads the record as written, and the reports again
    theirs = es.decode(written, SPEC, JOB, None, now=2.0)
    survivors = alive((B, 2), (C, 3))
    taken, _ = es.take_over(theirs, SPEC, B, JOB, survivors, now=2.0)
    taken, _, _ = es.reconcile(taken, survivors, reports[1:] + [reports[0]], set(), now=2.0)
    assert taken.state.unstopped == {"c"}
    last = [((ek.report_key("/p/", "c", "stopped"), 30), mb.WorkersStopped("c", 1))]
    taken, _, _ = es.reconcile(taken, survivors, reports + last, set(), now=2.5)
    assert taken.state.round.number == 2 and [m.node.node_id for m in taken.state.round.members] == ["b", "c"]
    assert orders(taken) != orders(theirs)


def test_a_record_of_an_ended_run_or_of_launchers_all_gone_is_started_afresh():
    record = running_record()
    gone = es.decode(es.encode(record, None, JOB), SPEC, JOB, None, 0.0)
    fresh, _ = es.take_over(gone, SPEC, mb.Node("z", "h", 1), JOB, alive((mb.Node("z", "h", 1), 50)), 0.0)
    assert fresh.state.round is None and [n.node_id for n in fresh.state.members] == ["z"]
    state, _ = mb.decide(record.state, mb.JobEnded(0, "done"), 0.0)
    ended = es.Record(state)
    fresh, _ = es.take_over(ended, SPEC, A, JOB, alive((A, 1)), 0.0)
    assert fresh.state.end is None and fresh.state.phase == mb.WAITING


def test_each_launcher_reads_its_own_orders():
    record = running_record()
    view = es.view(record, "b")
    assert view.round.number == 1 and view.round.world_size == 3 and view.stop is None and view.over is None
    assert [x.node_id for x in view.round.members] == ["a", "b", "c"]
    state, actions = mb.decide(record.state, mb.Closed("c", "gone"), 1.0)
    record = es.apply(record, state, actions)
    assert es.view(record, "b").stop == (1, record.stop[1])
    record = es.Record(record.state, dropped={"b": (3, "its worker failed")})
    assert es.view(record, "b").over == (3, "its worker failed") and not es.view(record, "b").job_ended
    state, actions = mb.decide(record.state, mb.JobEnded(0, "every worker finished"), 2.0)
    view = es.view(es.apply(record, state, actions), "a")
    assert view.over == (0, "every worker finished") and view.job_ended


def test_a_newcomer_at_max_waits_as_a_standby_and_takes_a_lost_members_place():
    record = running_record()
    d = mb.Node("d", "10.0.0.4", 1)
    record, actions, _ = es.reconcile(record, alive((A, 1), (B, 2), (C, 3), (d, 4)), [], set(), 1.0)
    assert es.view(record, "d").standby and es.view(record, "d").round is None
    record, actions, _ = es.reconcile(record, alive((A, 1), (C, 3), (d, 4)), [], set(), 2.0)
    assert [n.node_id for n in record.state.members] == ["a", "d", "c"]


def test_with_a_job_token_an_unproven_launcher_is_refused_and_a_forged_record_is_nothing():
    token = "s3cret"
    record, _ = es.take_over(None, SPEC, A, JOB, alive((A, 1), token=token), 0.0)
    stranger = {"x": joiner(mb.Node("x", "h", 1), 5, token=token, proves="wrong")}
    record, actions, _ = es.reconcile(record, {**alive((A, 1), token=token), **stranger}, [], set(), 0.0)
    assert record.refused == {"x": "wrong job or job token"} and es.view(record, "x").refused
    text = es.encode(record, token, JOB)
    assert es.decode(text, SPEC, JOB, token, 0.0) is not None
    assert es.decode(text, SPEC, JOB, "other", 0.0) is None  # another token
    assert es.decode(text, SPEC, JOB, None, 0.0) is None  # this job has none
    assert es.decode(es.encode(record, None, JOB), SPEC, JOB, token, 0.0) is None  # no proof at all
    outer = json.loads(text)
    outer["body"] = outer["body"].replace('"restarts": 0', '"restarts": 5')
    assert es.decode(json.dumps(outer), SPEC, JOB, token, 0.0) is None  # tampered


def test_a_report_counts_only_under_its_nodes_lease_and_with_its_proof():
    token = "s3cret"
    value = ek.report_value("b", 20, "failed", 1, 3, "rank 1 exited 3", token, JOB)
    assert ek.read_report(value, 20, 20, token, JOB) == mb.WorkerFailed("b", 1, 3, "rank 1 exited 3")
    assert ek.read_report(value, 21, 20, token, JOB) is None  # another lease wrote it
    assert ek.read_report(value, 20, 20, "other", JOB) is None
    forged = json.dumps({**json.loads(value), "code": 0})
    assert ek.read_report(forged, 20, 20, token, JOB) is None


def test_what_is_not_a_record_or_a_key_of_ours_is_read_as_nothing():
    deep = "[" * 100000 + "]" * 100000
    for value in ("", "junk", "[]", "null", '{"body": 5}', deep, json.dumps({"body": deep}),
                  json.dumps({"body": json.dumps({"keeper": "a"})}), json.dumps({"body": json.dumps({
                      "keeper": "a", "phase": "nonsense", "members": [], "standbys": [], "round": None,
                      "unstopped": [], "why": "", "left": [], "restarts": 0, "end": None, "done": [], "stop": None,
                      "refused": {}, "dropped": {}})}),
                  json.dumps({"body": json.dumps({"keeper": "a", "phase": "running", "members": [["a", "h", "1"]]})})):
        assert es.decode(value, SPEC, JOB, None, 0.0) is None
        assert ek.read_node(value, 1, 1, None, JOB) is None
        assert ek.read_report(value, 1, 1, None, JOB) is None


def test_keys_of_one_job_are_never_under_another_jobs_prefix():
    assert not ek.job_prefix("a/b").startswith(ek.job_prefix("a"))
    assert ek.read_node_id(ek.report_key(ek.job_prefix("j"), "host-1/x", "done"), ek.job_prefix("j")) == "host-1/x"


def test_a_launcher_that_does_not_keep_the_membership_reads_node_keys_and_the_record_and_no_report():
    for job in ("j", "a/b", "x" * 200, "ü%/"):
        prefix = ek.job_prefix(job)
        start, end = ek.orders_span(prefix)
        for node_id in ("host-1", "a/b", "%", "ü" * 50, "\x7f", "~" * 300):
            assert start <= ek.node_key(prefix, node_id) < end
            for kind in ek.KINDS:
                assert not start <= ek.report_key(prefix, node_id, kind) < end
        assert start <= ek.record_key(prefix) < end
        assert not start <= ek.job_prefix(job + "x") < end
