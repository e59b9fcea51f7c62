"""The etcd link's rare paths, on the in-memory etcd and a fake clock (tests/link_harness.py): etcd that
stops answering one launcher in the middle of a round, and watches that end when etcd compacts the
history they were reading; a member whose answer breaks off. Reached on purpose here, not by luck against a real
etcd."""

import pytest

from launcher.nodes.elastic import link as el
from launcher.nodes.transport import messages as m
from link_harness import Etcd, wait_until


def formed(count=3):
    harness = Etcd(2, 3)
    links = harness.form(count)
    assert all(isinstance(x, el.LinkBase) for x in links), links
    harness.serve()
    return harness, links


def test_a_launcher_that_etcd_stops_answering_is_out_and_the_others_re_form():
    harness, links = formed()
    try:
        cut = next(x for x in links if not el.place_in(x.first, x.node_id).node_0)
        survivors = [x for x in links if x is not cut]
        cut.client.cut = True
        over = harness.await_item(cut, el.JobOver)
        assert over.code == 1 and "did not answer" in over.reason and "heartbeat_timeout" in over.reason
        for link in survivors:
            harness.await_item(link, m.StopWorkers, lambda s: s.round == 1)
            link.stopped(1)
        second = harness.await_item(survivors[0], m.RoundStart, lambda r: r.number == 2)
        assert {s.node_id for s in second.members} == {x.node_id for x in survivors}
    finally:
        harness.close()


def test_watches_ended_by_a_compaction_are_made_again_and_the_job_goes_on():
    harness, links = formed()
    try:
        watchers = [x.watcher for x in links]
        harness.store.compact()
        harness.store.end_watches()  # each was behind the compacted history
        harness.tick()  # the step waits for each lease's renewal; each link then watches again in the same turn
        wait_until(lambda: all(x.watcher is not None and x.watcher is not w for x, w in zip(links, watchers)),
                   "every link watching again")
        lost = next(x for x in links if el.place_in(x.first, x.node_id).node_rank == 2)
        harness.crash(lost)
        survivors = [x for x in links if x is not lost]
        for link in survivors:
            harness.await_item(link, m.StopWorkers, lambda s: s.round == 1)
            link.stopped(1)
        second = harness.await_item(survivors[0], m.RoundStart, lambda r: r.number == 2)
        assert lost.node_id not in {s.node_id for s in second.members}
    finally:
        harness.close()


def test_a_member_whose_answer_breaks_off_is_a_member_that_gave_none(monkeypatch):
    """etcd3gw lets requests' own errors through: a member killed in the middle of its answer (ChunkedEncodingError,
    seen when a three-member cluster lost its leader) made the link fail and the launcher exit 1; it is now a member
    with no answer: the next one is asked, and none answering is Unavailable (the lease's renewal decides)."""
    pytest.importorskip("etcd3gw")
    import requests

    from launcher.nodes.elastic.etcd.client import Etcd3gwClient, Unavailable
    from launcher.plan.etcd import EtcdSpec

    client = Etcd3gwClient(EtcdSpec((("127.0.0.1", 1), ("127.0.0.1", 2))), timeout=1.0)
    asked = []

    def post(member, path, body):
        asked.append(member)
        if member is client.clients[0]:
            raise requests.exceptions.ChunkedEncodingError("Response ended prematurely")
        return {"header": {"revision": 7}}

    monkeypatch.setattr(client, "_post", post)
    assert client.call("/kv/range", {}) == {"header": {"revision": 7}}
    assert asked == client.clients and client.current == 1
    monkeypatch.setattr(client, "_post", lambda member, path, body: (_ for _ in ()).throw(
        requests.exceptions.ConnectionError("reset while reading")))
    with pytest.raises(Unavailable, match="its answer broke off"):
        client.call("/kv/range", {})
    client.close()
