"""The etcd link's rare paths, on the in-memory etcd and a fake clock (tests/link_harness.py): etcd that
stops answering one launcher in the middle of a round, and watches that end when etcd compacts the
history they were reading. Reached on purpose here, not by luck against a real etcd."""

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
            harness.await_item(link, el.StopOrder, lambda s: s.round == 1)
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
            harness.await_item(link, el.StopOrder, lambda s: s.round == 1)
            link.stopped(1)
        second = harness.await_item(survivors[0], m.RoundStart, lambda r: r.number == 2)
        assert lost.node_id not in {s.node_id for s in second.members}
    finally:
        harness.close()
