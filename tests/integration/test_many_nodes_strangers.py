"""Strangers at node 0's control port are dropped and change nothing: jobs of several nodes, one real launcher
process per node on loopback addresses (test_many_nodes.py's ``Cluster``)."""

import json
import socket
import struct
import time
import uuid

from conftest import free_ports, pose_as_node_0
from launcher.nodes.transport.auth import step_proof
from test_many_nodes import LOOPBACK, WORKER, assert_gone, job_args, read_attempt
from test_many_nodes import cluster  # noqa: F401 - the fixture


def frame(body: bytes) -> bytes:
    return struct.pack("!I", len(body)) + body


def message(obj) -> bytes:
    return frame(json.dumps(obj).encode())


def recv_message(sock: socket.socket) -> dict:
    def exactly(n):
        data = b""
        while len(data) < n:
            chunk = sock.recv(n - len(data))
            assert chunk, "the hub closed the connection"
            data += chunk
        return data

    (size,) = struct.unpack("!I", exactly(4))
    return json.loads(exactly(size))


def closed_by_peer(sock: socket.socket, timeout: float) -> bool:
    sock.settimeout(timeout)
    try:
        while sock.recv(65536):
            pass
        return True
    except ConnectionResetError:
        return True
    except socket.timeout:
        return False


def hello_proof(token: str, challenge: str, job_id: str, node) -> str:
    """A hello's proof of ``token`` on node 0's ``challenge`` (the node's nonce: "c" * 32)."""
    return step_proof(token, "hello", job_id, node, challenge, "c" * 32)


def test_strangers_at_the_control_port_are_dropped_and_change_nothing(cluster, tmp_path):
    nodes = LOOPBACK[:2]
    port = free_ports(3)
    job_id, token = f"strangers-{uuid.uuid4().hex[:8]}", f"token-{uuid.uuid4().hex}"
    go = tmp_path / "go"
    script = [WORKER, "--dump", str(tmp_path), "--until", str(go), "--sleep", 90]
    for i in (1, 0):
        cluster.start(nodes, i, *job_args(port, 2, "--job_id", job_id, "--heartbeat_timeout", 3,
                                          *(["--log_level", "DEBUG"] if i == 1 else [])),
                      *script, env={"LAUNCHER_JOB_TOKEN": token})
    follower, leader = cluster.nodes
    read_attempt(tmp_path, 4, 0)
    follower.wait_text("control: joined node 0 at", 20)  # the real node 1, with the right proof
    cluster.snapshot()
    identity = {"job_id": job_id, "nodes": list(nodes), "ports": [port + 1, port + 2],
                "script": " ".join(["-u", *map(str, script)])}

    def hello(challenge, **change):
        m = {"type": "hello", "identity": identity, "node": 1, "nonce": "c" * 32, **change}
        return message({"proof": hello_proof(token, challenge, job_id, m["node"]), **m})

    cases = [
        ("junk", lambda n: b"GET / HTTP/1.1\r\nHost: x\r\n\r\n",
         f"sent a message of {struct.unpack('!I', b'GET ')[0]} bytes (the limit is 65536)"),
        ("oversized length", lambda n: struct.pack("!I", 64 * 1024 + 1) + b"{}",
         "sent a message of 65537 bytes (the limit is 65536)"),
        ("invalid JSON", lambda n: frame(b"{not json"), "sent a message that is not JSON"),
        ("not UTF-8", lambda n: frame(b"\xff\xfe\xfd"), "sent a message that is not JSON"),
        ("JSON without a type", lambda n: frame(b"[1, 2]"), "sent a message without a type"),
        ("nesting that overflows json's stack", lambda n: frame(b"[" * 32000 + b"]" * 32000),
         "sent a message nested deeper than 8"),
        ("an infinite number", lambda n: frame(b'{"type": "hello", "node": 1e400}'), "sent a message that is not JSON"),
        ("a lone surrogate", lambda n: frame(b'{"type": "hello", "node": "\\ud800"}'), "sent a message that is not JSON"),
        ("a frame length of 2**32-1", lambda n: b"\xff\xff\xff\xff", "sent a message of 4294967295 bytes"),
        ("no hello", lambda n: message({"type": "beat"}), "a 'beat' message before saying hello"),
        ("wrong job id", lambda n: hello(n, identity={**identity, "job_id": "another-job"}),
         f"not a node of this job: its job_id is 'another-job', this job's is '{job_id}'"),
        ("wrong script", lambda n: hello(n, identity={**identity, "script": "-u other.py"}),
         "not a node of this job: its script is '-u other.py'"),
        ("node out of range", lambda n: hello(n, node=2), "not a node of this job: node index 2 is not one of 1 to 1"),
        ("wrong token proof", lambda n: hello(n, proof=hello_proof("not-the-token", n, job_id, 1)),
         "not a node of this job: its proof of the job token (LAUNCHER_JOB_TOKEN) is wrong"),
        ("a proof not in ASCII", lambda n: hello(n, proof="\u00e9" * 64),
         "not a node of this job: its proof of the job token (LAUNCHER_JOB_TOKEN) is wrong"),
        ("node index true", lambda n: hello(n, node=True), "not a node of this job: node index True is not one of 1 to 1"),
        ("no nonce for node 0", lambda n: hello(n, nonce=None),
         "not a node of this job: it gives no nonce to prove the job token on"),
        ("no proof", lambda n: hello(n, proof=None),
         "not a node of this job: it gives no proof of the job token (LAUNCHER_JOB_TOKEN)"),
        ("proof for another nonce", lambda n: hello(n, proof=hello_proof(token, "0" * 32, job_id, 1)),
         "not a node of this job: its proof of the job token (LAUNCHER_JOB_TOKEN) is wrong"),
        ("node 1 again, right identity and proof", lambda n: hello(n),
         "not a node of this job: node 1 (127.0.0.2) is already joined"),
    ]
    for name, payload, reason in cases:
        with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
            challenge = recv_message(s)
            assert challenge["type"] == "challenge" and len(challenge["nonce"]) == 32, challenge
            s.sendall(payload(challenge["nonce"]))
            assert closed_by_peer(s, 10), f"{name}: the hub kept the connection"
            where = f"127.0.0.1:{s.getsockname()[1]}"
        leader.wait_text(f"control: dropped the connection from {where}: {reason}", 10)

    # a flood of idle connections: at most 64 wait for their hello (5 s), the rest are closed at once
    flood = []
    try:
        for _ in range(300):
            s = socket.socket()
            s.setblocking(False)
            s.connect_ex(("127.0.0.1", port))
            flood.append(s)
        leader.wait_text("said nothing valid for 5 s", 20)
        deadline = time.monotonic() + 15
        for s in flood:
            s.setblocking(True)
            assert closed_by_peer(s, max(0.1, deadline - time.monotonic())), "a flood connection stayed open"
    finally:
        for s in flood:
            s.close()
    print(f"\nflood: {leader.stderr.count('said nothing valid for 5 s')} of 300 waited for a hello, then dropped")
    assert 1 <= leader.stderr.count("said nothing valid for 5 s") <= 64

    go.touch()
    assert cluster.finish(30) == [0, 0], leader.stderr + follower.stderr
    for node in cluster.nodes:
        assert "launcher: all 2 worker(s) finished in " in node.stderr
        assert "lost" not in node.stderr and "the job stopped" not in node.stderr
    assert follower.stderr.count("control: joined node 0 at") == 1  # node 1 was never pushed out
    assert_gone(cluster.pids)


def test_a_stranger_holding_node_0s_port_is_not_obeyed_and_node_0_is_joined_after(cluster, tmp_path):
    """Node 0 is not started yet; a stranger without the token holds its control port, answers
    node 1's hello with a welcome and a forged stop. Node 1 obeys nothing, keeps trying, and joins
    the real node 0 once it comes: the job runs and ends with 0 everywhere."""
    nodes = LOOPBACK[:2]
    port = free_ports(3)
    token = f"token-{uuid.uuid4().hex}"
    forged = {"type": "stop", "attempt": 0, "cause": {"node": 0, "kind": "worker", "code": 42, "text": "FORGED"}}
    go = tmp_path / "go"  # the workers run until node 1 has joined (a node whose workers finished alone ends)
    follower = cluster.start(nodes, 1, *job_args(port, 1, "--join_timeout", 60), WORKER, "--dump", tmp_path,
                             "--sleep", 60, "--until", go, env={"LAUNCHER_JOB_TOKEN": token})
    hellos = [json.loads(said[4:]) for said in pose_as_node_0(port, message({"type": "welcome"}) + message(forged))]
    assert len(hellos) == 3 and all(h["type"] == "hello" for h in hellos)
    cluster.start(nodes, 0, *job_args(port, 1), WORKER, "--dump", tmp_path, "--sleep", 60, "--until", go,
                  env={"LAUNCHER_JOB_TOKEN": token})
    read_attempt(tmp_path, 2, 0)
    time.sleep(2.0)  # node 1 tries node 0's port again every second
    go.touch()
    assert cluster.finish(60) == [0, 0], follower.stderr
    assert "FORGED" not in follower.stderr and "the job stopped" not in follower.stderr
    assert "never answered" not in follower.stderr and "never joined" not in follower.stderr  # it joined node 0
    assert follower.stderr.count("welcomed this node without proving the job token") == 1, follower.stderr


