"""The gathering of an MPI job's node list, with real sockets on loopback (127.0.0.1-3)."""

import os
import socket
import struct
import threading
import time

import pytest

from launcher.nodes.transport.listener import MAX_PENDING
from launcher.nodes.transport.wire import encode
from launcher.nodes.static import gather
from tests.conftest import free_port, pose_as_node_0
from launcher.errors import LaunchError
from launcher.nodes.static.gather import GatherTimeout, Spec


def start(spec, address, timeout=5.0, token=None):
    """gather() in a thread; its result or exception in the returned dict once joined."""
    out = {}

    def run():
        try:
            out["nodes"] = gather.gather(spec, address, timeout, token)
        except Exception as e:  # noqa: BLE001 - handed to the test
            out["error"] = e

    t = threading.Thread(target=run, daemon=True)
    t.start()
    out["thread"] = t
    return out


def finish(*runs, seconds=10.0):
    for r in runs:
        r["thread"].join(seconds)
        assert not r["thread"].is_alive(), "a gatherer did not return"
    return runs


def spec(rank, size, port):
    return Spec(rank, size, "127.0.0.1", port, f"--control_port {port}")


@pytest.mark.parametrize("token", [None, "s3cret"])
def test_three_ranks_agree_on_the_node_list_in_rank_order(token):
    port = free_port()
    # the others first: they retry until rank 0 listens
    r2 = start(spec(2, 3, port), "127.0.0.3", token=token)
    r1 = start(spec(1, 3, port), "127.0.0.2", token=token)
    time.sleep(0.3)
    r0 = start(spec(0, 3, port), "127.0.0.1", token=token)
    finish(r0, r1, r2)
    for r in (r0, r1, r2):
        assert r.get("nodes") == ("127.0.0.1", "127.0.0.2", "127.0.0.3"), r.get("error")
    # the port is free again for the control channel's hub (which binds it with SO_REUSEADDR)
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind(("0.0.0.0", port))
        s.listen(1)


def test_a_single_rank_gathers_nothing():
    assert gather.gather(spec(0, 1, 1), "127.0.0.1", 1.0) == ()


def raw_peer(port, payload: bytes):
    """A connection to rank 0 that reads the challenge and sends ``payload``."""
    s = socket.create_connection(("127.0.0.1", port), timeout=5)
    s.recv(65536)
    s.sendall(payload)
    return s


def wait_listening(port, seconds=5.0):
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            time.sleep(0.05)
    raise AssertionError("rank 0 never listened")


def test_junk_loses_only_its_connection_and_the_gathering_goes_on(caplog):
    port = free_port()
    r0 = start(spec(0, 3, port), "127.0.0.1")
    wait_listening(port)
    r1 = start(spec(1, 3, port), "127.0.0.2")
    time.sleep(0.5)
    junk = raw_peer(port, b"GET / HTTP/1.1\r\n\r\n")
    time.sleep(0.5)
    r2 = start(spec(2, 3, port), "127.0.0.3")
    finish(r0, r1, r2)
    junk.close()
    assert r0["nodes"] == r1["nodes"] == r2["nodes"] == ("127.0.0.1", "127.0.0.2", "127.0.0.3")
    assert any("dropped a connection to the gathering" in r.getMessage() and "sent junk" in r.getMessage()
               for r in caplog.records)


@pytest.mark.parametrize("message,fragment", [
    ({"type": "join", "rank": 1, "size": 3, "address": "127.0.0.9"}, "MPI rank 1 (127.0.0.9, from 127.0.0.1:"),
    ({"type": "join", "rank": 1, "size": 4, "address": "127.0.0.9"}, "says the job has 4 ranks, rank 0 says 3"),
    ({"type": "join", "rank": 5, "size": 3, "address": "127.0.0.9"}, "is not a rank from 1 to 2"),
])
def test_a_duplicate_rank_or_a_size_mismatch_is_named(message, fragment):
    port = free_port()
    r0 = start(spec(0, 3, port), "127.0.0.1")
    wait_listening(port)
    r1 = start(spec(1, 3, port), "127.0.0.2")
    time.sleep(0.5)
    other = raw_peer(port, encode(message))
    finish(r0, r1)
    other.close()
    assert fragment in str(r0["error"]) and r0["error"].exit_code == 2, r0["error"]
    if message.get("rank") == 1 and message.get("size") == 3:
        assert "joined twice: 127.0.0.2" in str(r0["error"])
    assert isinstance(r1["error"], LaunchError)


def test_a_wrong_token_is_never_taken_and_the_timeout_says_why():
    port = free_port()
    r0 = start(spec(0, 2, port), "127.0.0.1", timeout=2.0, token="right")
    r1 = start(spec(1, 2, port), "127.0.0.2", timeout=2.0, token="wrong")
    finish(r0, r1)
    e0 = r0["error"]
    assert isinstance(e0, GatherTimeout) and e0.exit_code == 1, repr(e0)
    assert "joined as MPI rank 1 without proving it knows LAUNCHER_JOB_TOKEN" in str(e0) and "127.0.0.1:" in str(e0)
    assert "LAUNCHER_JOB_TOKEN" in str(r1["error"])


def test_rank_0_waits_no_longer_than_the_join_timeout_and_names_the_missing_ranks():
    port = free_port()
    r0 = start(spec(0, 3, port), "127.0.0.1", timeout=1.5)
    r1 = start(spec(1, 3, port), "127.0.0.2", timeout=120.0)
    finish(r0, seconds=120.0)  # a hang guard
    e = r0["error"]
    assert isinstance(e, GatherTimeout) and e.exit_code == 1
    assert "MPI rank(s) 2 did not join the gathering of the node list on port" in str(e) and "1.5 s" in str(e)
    # rank 0 gave up at its own timeout: rank 1 (120 s) was still waiting, and was told
    finish(r1)
    assert "rank 0 stopped the gathering" in str(r1["error"])


def test_a_rank_without_rank_0_gives_up_at_the_join_timeout():
    port = free_port()
    r1 = start(spec(1, 2, port), "127.0.0.2", timeout=1.0)
    finish(r1, seconds=120.0)  # a hang guard
    e = r1["error"]
    assert isinstance(e, GatherTimeout)
    assert f"MPI rank 1 (127.0.0.2) could not reach node 0 (MASTER_ADDR=127.0.0.1, port {port}" in str(e)
    assert "within 1 s (--join_timeout" in str(e)


def test_a_rank_whose_node_0_never_answers_gives_up_at_the_join_timeout():
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(1)
        port = silent.getsockname()[1]
        r1 = start(spec(1, 2, port), "127.0.0.2", timeout=1.0)
        finish(r1, seconds=120.0)  # a hang guard
    assert isinstance(r1["error"], GatherTimeout)
    assert "did not send MPI rank 1 (127.0.0.2) the node list within 1 s" in str(r1["error"])


def test_a_peer_that_only_knocks_is_no_rank():
    port = free_port()
    r0 = start(spec(0, 2, port), "127.0.0.1")
    wait_listening(port)  # connects and closes: dropped quietly
    r1 = start(spec(1, 2, port), "127.0.0.2")
    finish(r0, r1)
    assert r0["nodes"] == r1["nodes"] == ("127.0.0.1", "127.0.0.2")


def test_route_address_is_the_local_end_towards_master():
    assert gather.route_address("127.0.0.1", 6069) == "127.0.0.1"
    assert gather.own_address(Spec(1, 2, "127.0.0.1", 6069, "")) == "127.0.0.1"
    assert gather.own_address(Spec(0, 2, "localhost", 6069, "")) == "localhost"  # the name the others reach
    assert gather.own_address(Spec(1, 2, "localhost", 6069, "")) in ("127.0.0.1", "::1")
    with pytest.raises(LaunchError, match="give it with --node_ip"):
        gather.route_address("no-such-host.invalid", 6069)



def test_the_launcher_exits_1_when_node_0_never_comes(tmp_path):
    import os
    import subprocess
    import sys

    from tests.conftest import REPO

    script = tmp_path / "train.py"
    script.write_text("print('never')\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OMPI_", "PMI_", "SLURM_", "PET_", "LSB_", "VC_", "MASTER_"))}
    env.update(OMPI_COMM_WORLD_SIZE="2", OMPI_COMM_WORLD_RANK="1", MASTER_ADDR="127.0.0.1",
               PYTHONPATH=os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")])))
    port = free_port()
    r = subprocess.run([sys.executable, "-m", "launcher", "--control_port", str(port), "--join_timeout", "1", str(script)],
                       env=env, capture_output=True, text=True, timeout=30, cwd=tmp_path)
    assert r.returncode == 1, r.stderr
    assert f"MPI rank 1 (127.0.0.1) could not reach node 0 (MASTER_ADDR=127.0.0.1, port {port}, --control_port {port})" in r.stderr
    assert "never" not in r.stdout


# ---------------------------------------------------------------- what an adversary sends


@pytest.mark.parametrize("payload, fragment", [
    (struct.pack("!I", 64000) + b"[" * 32000 + b"]" * 32000, "sent junk"),
    (encode({"type": "hello"}), "not a rank's join"),
    (encode({"type": "join", "rank": True, "size": 3, "address": "127.0.0.9"}), "not a rank's join"),
    (encode({"type": "join", "rank": 1, "size": 3.0, "address": "127.0.0.9"}), "not a rank's join"),
    (encode({"type": "join", "rank": 1, "size": 3, "address": "127.0.0.9", "nonce": "c" * 32,
                     "proof": "\u00e9" * 64}), "without proving it knows LAUNCHER_JOB_TOKEN"),
    (encode({"type": "join", "rank": 1, "size": 3, "address": "127.0.0.9", "proof": ["x"]}),
     "without proving it knows LAUNCHER_JOB_TOKEN"),
], ids=["deep nesting", "no join", "rank true", "size 3.0", "proof not ASCII", "proof a list"])
def test_nothing_a_stranger_sends_stops_the_gathering(payload, fragment, caplog):
    port = free_port()
    r0 = start(spec(0, 2, port), "127.0.0.1", token="right")
    wait_listening(port)
    other = raw_peer(port, payload)
    time.sleep(0.5)
    assert r0["thread"].is_alive()
    r1 = start(spec(1, 2, port), "127.0.0.2", token="right")
    finish(r0, r1)
    other.close()
    assert r0["nodes"] == r1["nodes"] == ("127.0.0.1", "127.0.0.2"), repr(r0.get("error"))
    assert any(fragment in r.getMessage() for r in caplog.records if "dropped a connection" in r.getMessage())


@pytest.mark.parametrize("welcome", [None, {"type": "welcome", "proof": "0" * 64}, {"type": "welcome"}],
                         ids=["no welcome", "a forged welcome", "a welcome without proof"])
def test_a_rank_obeys_no_stranger_posing_as_rank_0_and_joins_rank_0_after(welcome, caplog):
    port = free_port()
    forged = encode({"type": "nodes", "nodes": ["10.6.6.6", "127.0.0.2"], "proof": "0" * 64})
    r1 = start(spec(1, 2, port), "127.0.0.2", timeout=15, token="right")
    answered = len(pose_as_node_0(port, (encode(welcome) if welcome else b"") + forged, timeout=10))
    assert answered == 3 and r1["thread"].is_alive()
    r0 = start(spec(0, 2, port), "127.0.0.1", token="right")
    finish(r0, r1)
    assert r0["nodes"] == r1["nodes"] == ("127.0.0.1", "127.0.0.2")
    assert sum("does not prove LAUNCHER_JOB_TOKEN" in r.getMessage() for r in caplog.records) == 1


def test_a_flood_of_silent_connections_keeps_no_rank_out():
    port = free_port()
    r0 = start(spec(0, 3, port), "127.0.0.1", timeout=120)  # the timeouts: hang guards
    wait_listening(port)
    before = len(os.listdir("/proc/self/fd"))
    flood = [socket.create_connection(("127.0.0.1", port)) for _ in range(300)]
    try:
        time.sleep(1.0)  # rank 0 (a thread of this process) accepts them all
        kept = len(os.listdir("/proc/self/fd")) - before - len(flood)
        assert kept <= MAX_PENDING + 2, f"rank 0 keeps {kept} silent connections open"
        r1 = start(spec(1, 3, port), "127.0.0.2", timeout=120)
        r2 = start(spec(2, 3, port), "127.0.0.3", timeout=120)
        finish(r0, r1, r2, seconds=150.0)
        # both ranks joined through the flood (the silent connections they pushed out never speak)
        assert r0.get("nodes") == r1.get("nodes") == r2.get("nodes") == ("127.0.0.1", "127.0.0.2", "127.0.0.3"), r0
    finally:
        for s in flood:
            s.close()


def test_a_node_list_over_64_kib_reaches_every_rank():
    """1,700 ranks with long (IPv6) addresses: the answer is 70 KB, over what a peer not yet proven may
    send; a rank takes a node list of its job's size (wire.sized_for), whatever the size."""
    size, port = 1700, free_port()
    addresses = ["127.0.0.1"] + [f"fd00:1111:2222:3333:4444:5555:{r // 65536:04x}:{r % 65536:04x}" for r in range(1, size)]
    assert len(encode({"type": "nodes", "nodes": addresses})) > 64 * 1024
    r0 = start(spec(0, size, port), "127.0.0.1", timeout=60.0)
    wait_listening(port)
    runs = [start(spec(r, size, port), addresses[r], timeout=60.0) for r in range(1, size)]
    finish(r0, *runs, seconds=120.0)
    assert all(r.get("nodes") == tuple(addresses) for r in (r0, *runs)), {str(r.get("error")) for r in (r0, *runs)}
