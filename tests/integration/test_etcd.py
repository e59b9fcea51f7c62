"""Elastic jobs whose membership is in a real etcd (Debian's etcd-server, started by the fixtures on loopback):
launchers on 127.0.0.1 with the same command line, workers in one group per round (real gloo in the tests
marked ``real_torch``, a start and a re-form; the launcher's store, spoken as torch does, in the others,
as in test_elastic.py). What is promised: the job runs and
leaves no key behind; any node may be lost, the first one (the keeper) included, and the others re-form
without it; a silent node is lost within the heartbeat timeout; two jobs share one etcd; a launcher that
does not prove the job token is refused; an etcd that does not answer (at the start, or gone mid-job) is
one sentence and every worker stopped; a three-member etcd that loses a member keeps the job running; TLS
with client certificates and etcd's users work; Paddle 3's and fleetrun's etcd lines run the same job.
Every wait is bounded, and nothing of a test is left running. What concerns the etcd itself (one that does not
answer or is gone, a three-member etcd that loses a member, TLS and users, an endpoint that is not etcd, the
in-memory double) is test_etcd_endpoints.py's: a file of its own, which xdist runs beside this one."""

import contextlib
import json
import os
import signal
import time

import psutil
import pytest

from conftest import WORKERS, assert_all_gone, finish_all, free_ports, start_launcher, wait_for
from etcd_servers import etcd  # noqa: F401 - the fixture

WORKER = str(WORKERS / "elastic_worker.py")
pytestmark = pytest.mark.usefixtures("workers_without_torch")
FAST = "heartbeat_timeout=2,keep_alive_interval=0.5,last_call_timeout=60,join_timeout=30"


def etcd_line(endpoints, folder, *extra, job="etcd-test", nnodes="2:3", conf=FAST, hold=False):  # noqa
    """torchrun's line with etcd; the workers' ports of every node above a free port; ``hold``: the workers wait
    for FOLDER/go once in the group (elastic_worker.py)."""
    return ("--nnodes", nnodes, "--nproc-per-node", 1, "--rdzv-backend", "etcd", "--rdzv-endpoint", endpoints,
            "--rdzv-id", job, "--rdzv-conf", conf, "--started_port", free_ports(8), *extra, WORKER, folder, 3,
            *(("hold",) if hold else ()))


def records(folder) -> list:
    path = folder / "records.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def entries(server, prefix="/launcher/") -> list:
    from launcher.nodes.elastic.etcd.client import Etcd3gwClient
    from launcher.plan.etcd import EtcdSpec, parse_endpoints

    client = Etcd3gwClient(EtcdSpec(parse_endpoints(server.endpoints, "test")[0]), 2.0)
    try:
        return client.range(prefix)[1]
    finally:
        client.close()


def keys(server, prefix="/launcher/") -> list:
    return [e.key for e in entries(server, prefix)]


def keeper(server, procs, job="etcd-test"):
    """The launcher that keeps the membership: the one whose node key is the oldest (its id holds its pid)."""
    nodes = [e for e in entries(server, f"/launcher/{job}/nodes/")]
    oldest = min(nodes, key=lambda e: e.create_revision).key.rsplit("/", 1)[1]
    pid = int(oldest.split("-")[-2])
    return next(p for p in procs if p.pid == pid)


def start_nodes(count, args, env=None):
    return [start_launcher(*args, env=env, start_new_session=True) for _ in range(count)]


@contextlib.contextmanager
def nodes(count, args, env=None):
    """``count`` launchers of ``args``; whichever still runs when the test is done with them is killed."""
    procs = start_nodes(count, args, env)
    try:
        yield procs
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()


def ready(folder, count):
    wait_for(lambda: len(list(folder.glob("ready.*[0-9]"))) >= count, 60, what=f"{count} workers in the group")
    return {int(p.name.split(".")[1]): int(p.read_text().split()[0]) for p in folder.glob("ready.*[0-9]")}


def power_off(proc, worker_pids):
    """The launcher, its watchdog and its workers killed at once, as a node that loses power."""
    victims = [proc.pid] + [c.pid for c in psutil.Process(proc.pid).children(recursive=True)] + list(worker_pids)
    for pid in victims:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    return victims


def worker_of(proc, workers):
    """The pid of ``proc``'s worker among the group's ``workers`` (rank -> pid)."""
    children = {c.pid for c in psutil.Process(proc.pid).children(recursive=True)}
    return next(pid for pid in workers.values() if pid in children)


@pytest.mark.real_torch
def test_a_job_in_etcd_runs_and_leaves_no_key(tmp_path, etcd):
    procs = start_nodes(3, etcd_line(etcd.endpoints, tmp_path))
    results = finish_all(procs, timeout=120)
    for code, out, err in results:
        assert code == 0, err
    done = records(tmp_path)
    assert sorted(r["rank"] for r in done) == [0, 1, 2] and {r["world"] for r in done} == {3}
    errs = "".join(err for _, _, err in results)
    assert errs.count("round 1 (start): 3 node(s), world size 3") == 3
    assert "Traceback" not in errs
    assert keys(etcd) == [], errs
    assert_all_gone([p.pid for p in procs] + [r["pid"] for r in done])


@pytest.mark.parametrize("first", [pytest.param(True, marks=pytest.mark.real_torch), False], ids=["the keeper", "another node"])
def test_a_node_powered_off_leaves_the_others_running_even_the_keeper(tmp_path, etcd, first):
    with nodes(3, etcd_line(etcd.endpoints, tmp_path, hold=True)) as procs:
        workers = ready(tmp_path, 3)
        chief = keeper(etcd, procs)
        victim = chief if first else next(p for p in procs if p is not chief)
        gone = power_off(victim, [worker_of(victim, workers)])
        (tmp_path / "go").touch()
        results = finish_all([p for p in procs if p is not victim], timeout=120)
    for code, out, err in results:
        assert code == 0, err
        assert "round 2 (lost): 2 node(s), world size 2" in err
        # found by the liveness ring, not by its lease's expiry (how soon: bench/elastic.py --etcd, power-off): the
        # round's line on every node says so (the keeper's warning "... lost: ..." is its own)
        assert "(its launcher is gone (its connection in the liveness ring closed))" in err
    second = [r for r in records(tmp_path) if r["world"] == 2]
    assert sorted(r["rank"] for r in second) == [0, 1]
    if first:
        assert sum("keeps the membership now" in err for _, _, err in results) == 1
    assert keys(etcd) == [], "".join(err for _, _, err in results)
    assert_all_gone(gone + [p.pid for p in procs] + [r["pid"] for r in records(tmp_path)])


def test_a_silent_node_is_lost_within_the_heartbeat_timeout(tmp_path, etcd):
    stopped = []
    with nodes(3, etcd_line(etcd.endpoints, tmp_path, hold=True)) as procs:
        try:
            workers = ready(tmp_path, 3)
            # not node 0: on this one host its frozen rank 0 would keep the store's port from the next round's rank 0
            silent = next(p for p in procs if worker_of(p, workers) == workers[2])
            stopped = [silent.pid] + [c.pid for c in psutil.Process(silent.pid).children(recursive=True)]
            for pid in stopped:
                os.kill(pid, signal.SIGSTOP)
            (tmp_path / "go").touch()
            results = finish_all([p for p in procs if p is not silent], timeout=120)
        finally:
            for pid in stopped:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
    everything = "".join(err for _, _, err in results)
    for code, out, err in results:
        assert code == 0, everything
        assert "round 2 (lost): 2 node(s), world size 2" in err
        assert "(no heartbeat for 2 s: its lease in etcd expired)" in err  # in the round's line, on every node
    assert_all_gone(stopped + [p.pid for p in procs])


def test_a_node_that_leaves_on_sigterm_is_counted_as_left(tmp_path, etcd):
    """The launcher tells why before its lease is revoked (``departures``): every event log names it as left."""
    with nodes(3, etcd_line(etcd.endpoints, tmp_path, "--log_dir", tmp_path / "logs", hold=True)) as procs:
        workers = ready(tmp_path, 3)
        leaving = next(p for p in procs if worker_of(p, workers) == workers[2])
        leaving.terminate()
        leaving.communicate(timeout=60)
        (tmp_path / "go").touch()
        results = finish_all([p for p in procs if p is not leaving], timeout=120)
    for code, out, err in results:
        assert code == 0, err
        assert "left: " in err and "; it leaves the job" in err, err
    events = [json.loads(line) for line in (tmp_path / "logs" / "events.jsonl").read_text().splitlines()]
    assert [e["event"] for e in events if e["event"].startswith("member_")] == ["member_left"] * 2


def test_two_jobs_share_one_etcd_without_touching_each_other(tmp_path, etcd):
    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir()
    b.mkdir()
    procs = start_nodes(2, etcd_line(etcd.endpoints, a, job="job-a", nnodes="2")) + \
        start_nodes(2, etcd_line(etcd.endpoints, b, job="job-b", nnodes="2"))
    results = finish_all(procs, timeout=120)
    for code, out, err in results:
        assert code == 0, "".join(err for _, _, err in results)
    for folder in (a, b):
        assert sorted(r["rank"] for r in records(folder)) == [0, 1]
    assert keys(etcd) == [], "".join(err for _, _, err in results)


def test_a_launcher_that_does_not_keep_the_membership_hears_no_report(etcd):
    """Its range and its watch (the etcd client's, on the real etcd) hold the node keys and the record only."""
    from launcher.nodes.elastic.etcd import keys as ek
    from launcher.nodes.elastic.etcd.client import Etcd3gwClient
    from launcher.plan.etcd import EtcdSpec, parse_endpoints

    client = Etcd3gwClient(EtcdSpec(parse_endpoints(etcd.endpoints, "test")[0]), 2.0)
    prefix = ek.job_prefix("span-test")
    start, end = ek.orders_span(prefix)
    heard, ended = [], []
    try:
        client.put(ek.node_key(prefix, "a"), "{}")
        client.put(ek.report_key(prefix, "a", "stopped"), "{}")
        revision, entries = client.range(start, end)
        assert [e.key for e in entries] == [ek.node_key(prefix, "a")]
        watch = client.watch(start, revision + 1, heard.extend, ended.append, end)
        for key in (ek.report_key(prefix, "b", "failed"), ek.node_key(prefix, "b"), ek.report_key(prefix, "a", "done"),
                    ek.record_key(prefix), ek.job_prefix("span-test2") + "nodes/c"):
            client.put(key, "{}")
        wait_for(lambda: len(heard) >= 2, 10, what="the watch's two events")
        time.sleep(0.3)
        watch.stop()
        assert [e.key for e in heard] == [ek.node_key(prefix, "b"), ek.record_key(prefix)] and not ended
    finally:
        client.delete_prefix(prefix)
        client.delete_prefix(ek.job_prefix("span-test2"))
        client.close()


def test_a_launcher_without_the_job_token_is_refused_and_the_job_goes_on(tmp_path, etcd):
    args = etcd_line(etcd.endpoints, tmp_path, nnodes="2:3", conf=FAST.replace("last_call_timeout=60",
                                                                                "last_call_timeout=0.5"), hold=True)
    with nodes(2, args, env={"LAUNCHER_JOB_TOKEN": "s3cret"}) as procs:
        ready(tmp_path, 2)
        intruder = start_launcher(*args, env={"LAUNCHER_JOB_TOKEN": "wrong"})
        code, out, err = finish_all([intruder], timeout=60)[0]
        (tmp_path / "go").touch()
        results = finish_all(procs, timeout=120)
    assert code == 1 and "does not prove this launcher's job token (LAUNCHER_JOB_TOKEN)" in err, err
    assert "Traceback" not in err
    for code, out, err in results:
        assert code == 0, err
        assert "round 2" not in err
    assert sorted(r["rank"] for r in records(tmp_path)) == [0, 1]


def test_paddle3s_and_fleetruns_etcd_lines_run_one_job(tmp_path, etcd):
    paddle3 = ("--nnodes", "2", "--master", f"etcd://{etcd.endpoints.split(',')[0]}", "--job_id", "pj",
               "--nproc_per_node", 1, "--started_port", free_ports(8), WORKER, tmp_path, 3)
    fleetrun = ("--elastic_server", etcd.endpoints.split(",")[0], "--job_id", "pj", "--np", "2",
                "--nproc_per_node", 1, "--started_port", paddle3[9], WORKER, tmp_path, 3)
    results = finish_all([start_launcher(*paddle3), start_launcher(*fleetrun)], timeout=120)
    for code, out, err in results:
        assert code == 0, err
    assert sorted(r["rank"] for r in records(tmp_path)) == [0, 1]
