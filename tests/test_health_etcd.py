"""An etcd elastic job's launchers judged by their health checks, on a real etcd (tests/etcd_servers.py): each
launcher's checkup goes in its node key, the keeper judges it against its own facts; a launcher that fails is kept
out, says why, checks itself again every interval (its key written again) and joins once it passes."""

import threading
import time

from etcd_servers import etcd  # noqa: F401 - the fixture
from link_harness import wait_until
from test_health_c10d import Body
from launcher.nodes.elastic.etcd import start
from launcher.nodes.elastic.etcd.client import Etcd3gwClient
from launcher.plan.elastic import ElasticSpec, Rendezvous
from launcher.plan.etcd import EtcdSpec, parse_endpoints


def test_a_joiner_whose_script_differs_is_kept_out_then_joins_once_it_passes(etcd, caplog):  # noqa: F811
    spec = ElasticSpec(2, 2, "etcd", etcd=EtcdSpec(parse_endpoints(etcd.endpoints, "test")[0]),
                       rendezvous=Rendezvous(keep_alive_interval=0.5, heartbeat_timeout=10.0, join_timeout=30.0,
                                             last_call_timeout=0.5, close_timeout=10.0, read_timeout=10.0))
    bodies = {"a": Body(), "b": Body(script="another copy")}
    links, errors, clients = {}, [], []

    def form(name):
        client = Etcd3gwClient(spec.etcd, 2.0)
        clients.append(client)
        try:
            links[name] = start.form(spec, "health-job", 1, None, time.monotonic, client, health=bodies[name].health())
        except Exception as e:  # the test's failure names it
            errors.append((name, e))

    threads = [threading.Thread(target=form, args=(name,), daemon=True) for name in bodies]
    try:
        threads[0].start()
        time.sleep(0.5)  # a's key first: it keeps the membership
        threads[1].start()
        wait_until(lambda: bodies["b"].checks >= 3 or errors, "b checked itself again, kept out")
        assert not links and not errors  # nothing started meanwhile
        assert any("this launcher is kept out" in r.getMessage() and "failed the health check script" in r.getMessage()
                   for r in caplog.records)
        bodies["b"].script = "good"  # mended
        wait_until(lambda: len(links) == 2 or errors, "both formed")
        assert not errors, errors
        assert links["a"].first.number == links["b"].first.number == 1 and len(links["b"].first.members) == 2
        assert links["a"].health_states()[links["b"].node_id]["script"] == ("ok", "")
    finally:
        for link in links.values():
            link.close()
        for t in threads:
            t.join(5)
        for client in clients:
            client.close()
