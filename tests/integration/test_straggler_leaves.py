"""A straggler found across nodes and acted on, on real launchers and gloo workers (tests/integration/workers/
slow_member.py: the node whose launcher has SLOW_NODE=1 does 0.25 s more of its own work per step).

- Two fixed nodes (one rank each, no monitor page): each node can compare only the other's ranks, which come over
  the control channel: both name node 1, and with ``--straggler_policy leave`` node 1 says why it stays.
- An elastic job of three nodes (``--nnodes 2:3``, c10d and a real etcd), ``--straggler_policy leave``: the slow
  node is named, leaves on purpose (its launcher ends with 0), and the two others go on in their processes in a world
  of two; the event log and ``launcher_membership_changes{cause="straggler"}`` give the cause.

Every wait is for an event, bounded; no duration is asserted.
"""

import json
import time

import pytest

from conftest import WORKERS, finish_all, free_ports, listening, read_until, start_launcher, wait_for
from etcd_servers import etcd  # noqa: F401 - the fixture

pytest.importorskip("torch")
WORKER = WORKERS / "slow_member.py"
WAIT = 180  # a window of the slow node's steps, the patience, and a busy machine
HOST = "127.0.0.1"
C10D_CONF = "heartbeat_timeout=3,keep_alive_interval=0.5,last_call_timeout=60"
ETCD_CONF = "heartbeat_timeout=4,keep_alive_interval=0.5,join_timeout=60,last_call_timeout=60"


def events(path):
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def steps(folder):
    """Every step line of a node's workers: step, world, rank, pid."""
    lines = [line for path in sorted(folder.glob("workerlog.*")) for line in path.read_text(errors="replace").splitlines()]
    return [dict(kv.split("=", 1) for kv in line.split() if "=" in kv) for line in lines
            if line.startswith("step=") and " world=" in line]


def stop(tmp_path, procs):
    (tmp_path / "stop").touch()
    return finish_all(procs, timeout=WAIT)


def test_a_slow_node_is_named_on_every_node_of_a_fixed_job_and_says_why_it_stays(tmp_path):
    policy = "leave"
    port = free_ports(3)
    logs = {ip: tmp_path / f"logs.{ip}" for ip in ("127.0.0.1", "127.0.0.2")}
    procs = [start_launcher("--cluster_node_ips", "127.0.0.1,127.0.0.2", "--node_ip", ip, "--started_port", port,
                            "--nproc_per_node", 1, "--log_dir", logs[ip], "--straggler_policy", policy, WORKER, tmp_path,
                            env={"SLOW_NODE": "1" if ip == "127.0.0.2" else "0"})
             for ip in ("127.0.0.2", "127.0.0.1")]
    try:
        wait_for(lambda: any(p.poll() is not None for p in procs)
                 or all(any(e["event"] == "straggler" for e in events(log / "events.jsonl")) for log in logs.values()),
                 WAIT, "both nodes naming node 1")
        assert all(p.poll() is None for p in procs)
        wait_for(lambda: any(e["event"] == "straggler_stays" for e in events(logs["127.0.0.2"] / "events.jsonl")),
                 WAIT, "node 1 saying why it stays")
    finally:
        results = stop(tmp_path, procs)
    assert [code for code, _, _ in results] == [0, 0], results
    for log in logs.values():
        named = [e for e in events(log / "events.jsonl") if e["event"] == "straggler"]
        assert named and {(e["node"], e["host"], tuple(e["ranks"])) for e in named} == {(1, "127.0.0.2", (1,))}, named
        assert named[0]["compared_nodes"] == 2 and named[0]["speed"] < 0.7, named
    said = results[0][2]  # node 1's launcher (started first)
    assert "stays in the job (--straggler_policy leave): a job of a fixed set of nodes" in said
    assert not any(e["event"] == "straggler_stays" for e in events(logs["127.0.0.1"] / "events.jsonl"))


def elastic_line(backend, endpoint, folder, ports):
    common = ("--nnodes", "2:3", "--nproc-per-node", 1, "--rdzv-id", "slow", "--log_dir", folder,
              "--straggler_policy", "leave")
    if backend == "c10d":
        return (*common, "--rdzv-backend", "c10d", "--rdzv-endpoint", f"{HOST}:{endpoint}", "--rdzv-conf", C10D_CONF,
                WORKER, folder.parent)
    return (*common, "--rdzv-backend", "etcd", "--rdzv-endpoint", endpoint, "--rdzv-conf", ETCD_CONF,
            "--started_port", ports, WORKER, folder.parent)


@pytest.mark.parametrize("backend", ["c10d", "etcd"])
def test_a_straggler_leaves_an_elastic_job_and_the_others_go_on_in_place(tmp_path, backend, request):
    endpoint = request.getfixturevalue("etcd").endpoints if backend == "etcd" else free_ports(6)
    ports = free_ports(4)
    folders = [tmp_path / f"node{n}" for n in range(3)]
    procs = []
    try:
        for n, folder in enumerate(folders):
            procs.append(start_launcher(*elastic_line(backend, endpoint, folder, ports),
                                        env={"SLOW_NODE": "1" if n == 2 else "0"}))
            if n == 0 and backend == "c10d":  # the first binds the endpoint: node 0
                wait_for(lambda: listening(HOST, endpoint), WAIT, "node 0's launcher on the endpoint")
            elif backend == "etcd" and n < 2:  # the oldest key keeps the membership: each key in etcd before the next
                read_until(procs[n], "elastic job: joined the job", WAIT)  # (of these two, only the exit code is read)
            else:
                time.sleep(0.5)
        wait_for(lambda: all(any(s["world"] == "3" for s in steps(f)) for f in folders), WAIT, "a world of 3")
        wait_for(lambda: procs[2].poll() is not None, WAIT, "the slow node's launcher leaving")
        out, err = procs[2].communicate(timeout=WAIT)
        assert procs[2].returncode == 0, err
        assert "leaves the job as a straggler (--straggler_policy leave): node " in err, err
        left_at = max(int(s["step"]) for f in folders[:2] for s in steps(f))
        wait_for(lambda: all(any(s["world"] == "2" and int(s["step"]) > left_at for s in steps(f))
                             for f in folders[:2]), WAIT, "the two others going on in a world of 2")
    finally:
        results = stop(tmp_path, procs)
    assert [code for code, _, _ in results[:2]] == [0, 0], results
    for folder in folders[:2]:
        lines = steps(folder)
        assert len({s["pid"] for s in lines}) == 1, f"{folder.name} has new processes"  # re-formed in place
        assert {s["slow"] for s in lines} == {"0"}
        log = events(folder / "events.jsonl")
        (change,) = [e for e in log if e["event"] == "member_straggler"]  # named here too, unless it left first
        assert "it leaves as a straggler" in change["reason"], change
    slow_log = events(folders[2] / "events.jsonl")
    assert any(e["event"] == "straggler_leaves" for e in slow_log), slow_log
    assert [e["code"] for e in slow_log if e["event"] == "job_ended"] == [0]
