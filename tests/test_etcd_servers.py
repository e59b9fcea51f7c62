"""The real-etcd test helper (tests/etcd_servers.py) itself: it starts servers on loopback only,
with TLS and auth when asked, keeps a cluster answering after its leader dies, and leaves nothing
running when closed."""

import http.client
import ssl
import time

import psutil
import pytest

from etcd_servers import EtcdError, etcd, etcd_cluster, etcd_factory, missing_tools, start_cluster  # noqa: F401


def listening_addresses(pid):
    return {c.laddr.ip for c in psutil.Process(pid).net_connections(kind="inet") if c.status == psutil.CONN_LISTEN}


def eventually(action, timeout=15.0):
    """``action()``'s result once it stops raising EtcdError, trying for at most ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            return action()
        except EtcdError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)


def test_single_member_puts_and_gets_on_loopback_only(etcd, tmp_path):
    (member,) = etcd.members
    assert etcd.endpoints == f"127.0.0.1:{member.client_port}"
    assert member.data_dir.is_dir() and tmp_path in member.data_dir.parents
    assert member.log_path.is_file() and tmp_path in member.log_path.parents
    etcd.ctl("put", "/launcher/k", "v1")
    assert etcd.ctl("get", "/launcher/k", "--print-value-only", endpoints=etcd.endpoints).stdout == "v1\n"
    assert listening_addresses(member.pid) == {"127.0.0.1"}
    assert etcd.leader() is member


def test_tls_member_takes_the_client_cert_and_refuses_a_client_without_one(etcd_factory):
    server = etcd_factory(tls=True)
    (member,) = server.members
    assert member.client_url.startswith("https://127.0.0.1:")
    assert all(path.is_file() for path in (server.cacert, server.cert, server.key))

    server.ctl("put", "k", "secure")
    assert server.ctl("get", "k", "--print-value-only").stdout == "secure\n"

    # The same files work for a Python client too.
    context = ssl.create_default_context(cafile=str(server.cacert))
    context.load_cert_chain(str(server.cert), str(server.key))
    conn = http.client.HTTPSConnection("127.0.0.1", member.client_port, context=context, timeout=10)
    conn.request("GET", "/version")
    assert b"etcdserver" in conn.getresponse().read()
    conn.close()

    no_cert = server.ctl("get", "k", client_cert=False, check=False, dial_timeout="1s", command_timeout="2s")
    assert no_cert.returncode != 0 and "secure" not in no_cert.stdout
    plain = server.ctl("get", "k", endpoints=[f"http://{member.endpoint}"], check=False,
                       dial_timeout="1s", command_timeout="2s")
    assert plain.returncode != 0 and "secure" not in plain.stdout


def test_auth_member_refuses_a_wrong_password_and_keeps_alice_to_her_prefix(etcd_factory):
    server = etcd_factory(auth=("root", "pw"))
    assert server.auth.users == {"root": "pw", "alice": "alice-pw"}
    server.ctl("put", "/other/k", "root-only")  # root, by default

    wrong = server.ctl("get", "/other/k", user=("root", "not-pw"), check=False)
    assert wrong.returncode != 0 and "authentication failed" in wrong.stderr
    anonymous = server.ctl("get", "/other/k", user=None, check=False)
    assert anonymous.returncode != 0 and "root-only" not in anonymous.stdout

    alice = ("alice", "alice-pw")
    server.ctl("put", "/launcher/job", "mine", user=alice)
    assert server.ctl("get", "/launcher/job", "--print-value-only", user=alice).stdout == "mine\n"
    outside = server.ctl("get", "/other/k", user=alice, check=False)
    assert outside.returncode != 0 and "permission denied" in outside.stderr


def test_cluster_answers_after_its_leader_is_killed_and_close_leaves_nothing(tmp_path):
    if missing_tools():
        pytest.skip(f"real etcd tests need {' and '.join(missing_tools())} on PATH")
    cluster = start_cluster(tmp_path)
    try:
        started = [psutil.Process(pid) for pid in cluster.pids]
        assert len(started) == 3
        ports = [p for m in cluster.members for p in (m.client_port, m.peer_port)]
        assert len(set(ports)) == 6 and not {2379, 2380, 23790, 23800} & set(ports)
        assert cluster.endpoints == ",".join(f"127.0.0.1:{m.client_port}" for m in cluster.members)
        for member in cluster.members:
            assert listening_addresses(member.pid) == {"127.0.0.1"}

        cluster.ctl("put", "/launcher/before", "1")
        leader = cluster.leader()
        cluster.stop(leader)
        assert not leader.running
        survivor = next(m for m in cluster.members if m is not leader)
        eventually(lambda: cluster.ctl("put", "/launcher/after", "2", members=[survivor]))
        got = cluster.ctl("get", "/launcher/", "--prefix", "--print-value-only", members=[survivor]).stdout
        assert got.split() == ["2", "1"]  # in key order: after, before
        assert cluster.leader() is not leader
    finally:
        cluster.close()
    assert not [p.pid for p in started if p.is_running()]
    assert not [pid for pid in cluster.pids if psutil.pid_exists(pid)]
    leftovers = []
    for proc in psutil.process_iter(["pid", "cmdline"]):
        if any(str(tmp_path) in arg for arg in proc.info["cmdline"] or ()):
            leftovers.append(proc.info)
    assert leftovers == []


def test_cluster_member_paused_resumed_and_restarted(etcd_cluster):
    follower = next(m for m in etcd_cluster.members if m is not etcd_cluster.leader())
    others = [m for m in etcd_cluster.members if m is not follower]

    etcd_cluster.pause(follower)
    with pytest.raises(EtcdError, match="not healthy") as hung:
        etcd_cluster.wait_healthy([follower], timeout=1)
    assert str(follower.log_path) in str(hung.value)
    etcd_cluster.ctl("put", "k", "while-paused", members=others)
    etcd_cluster.resume(follower)
    etcd_cluster.wait_healthy()

    etcd_cluster.stop(follower)
    etcd_cluster.ctl("put", "k", "while-down", members=others)
    old_pid = follower.pid
    etcd_cluster.restart(follower)
    assert follower.running and follower.pid != old_pid and follower.pid == etcd_cluster.pids[-1]
    args = follower.proc.args
    assert args[args.index("--initial-cluster-state") + 1] == "existing"
    assert args[args.index("--data-dir") + 1] == str(follower.data_dir)
    assert eventually(lambda: etcd_cluster.ctl("get", "k", "--print-value-only",
                                               members=[follower])).stdout == "while-down\n"
