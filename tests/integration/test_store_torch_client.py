"""torch's own TCPStore client (``is_master=False``) against the store a real launcher serves
(``--agent_store on``): every query type the Python API has, PrefixStore over it, waits woken
from other processes, and a wait or barrier that times out (CANCEL_WAIT) leaving the client usable."""

import os
import signal
import subprocess
import sys
import textwrap
from datetime import timedelta

import pytest

from conftest import PROBE, free_ports, start_launcher

dist = pytest.importorskip("torch.distributed")

TIMEOUT = timedelta(seconds=30)


@pytest.fixture(scope="module")
def port():
    """A launcher on one node serving the store on this port (its one worker sleeps, touching no store)."""
    port = free_ports(2)
    launcher = start_launcher("--agent_store", "on", "--nproc_per_node", 1, "--started_port", port,
                              "--print_config", "false", PROBE, "--sleep", 300)
    try:
        yield port
    finally:
        launcher.send_signal(signal.SIGTERM)
        launcher.communicate(timeout=60)


def client(port):
    return dist.TCPStore("127.0.0.1", port, None, False, timeout=TIMEOUT)


def other_process(port, code, timeout=60):
    """Run ``code`` with a client ``c`` of the store in a process of its own; it is started, not waited for."""
    program = "import sys\nfrom datetime import timedelta\nimport torch.distributed as dist\n" \
              f"c = dist.TCPStore('127.0.0.1', {port}, None, False, timeout=timedelta(seconds=60))\n" + \
              textwrap.dedent(code)
    return subprocess.Popen([sys.executable, "-c", program], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)


def test_set_get_add_compare_set_check_delete_num_keys(port):
    c = client(port)
    before = c.num_keys()
    c.set("kv/a", "1")
    c.set("kv/bytes", b"\x00\xff" * 1000)
    assert c.get("kv/a") == b"1" and c.get("kv/bytes") == b"\x00\xff" * 1000
    assert c.add("kv/n", 5) == 5 and c.add("kv/n", -2) == 3 and c.get("kv/n") == b"3"
    assert c.compare_set("kv/a", "1", "2") == b"2" and c.compare_set("kv/a", "1", "3") == b"2"
    assert c.compare_set("kv/new", "", "made") == b"made" and c.compare_set("kv/none", "x", "y") == b"x"
    assert c.check(["kv/a", "kv/n"]) and not c.check(["kv/a", "kv/missing"])
    assert c.num_keys() == before + 4
    assert c.delete_key("kv/a") and not c.delete_key("kv/a")
    assert c.num_keys() == before + 3


def test_append_multi_set_multi_get_and_list_keys(port):
    c = client(port)
    c.append("multi/log", "ab")
    c.append("multi/log", "cd")
    c.multi_set(["multi/x", "multi/y"], ["1", "2"])
    assert c.multi_get(["multi/log", "multi/x", "multi/y"]) == [b"abcd", b"1", b"2"]
    assert {"multi/log", "multi/x", "multi/y"} <= set(c.list_keys())


def test_a_value_of_torchs_largest_size_goes_both_ways(port):
    c = client(port)
    big = os.urandom(8 * 1024 * 1024)
    c.set("big/v", big)
    assert c.get("big/v") == big
    c.delete_key("big/v")


def test_wait_without_and_with_a_timeout_and_the_client_goes_on(port):
    c = client(port)
    c.set("w/there", "1")
    c.wait(["w/there"])
    c.wait(["w/there"], timedelta(seconds=5))
    with pytest.raises(dist.DistStoreError, match="wait timeout after 300ms"):
        c.wait(["w/never"], timedelta(milliseconds=300))
    assert c.get("w/there") == b"1"  # CANCEL_WAIT was answered: the connection is in step
    with pytest.raises(dist.DistStoreError, match="barrier timeout after 300ms"):
        c.barrier("w/barrier", 2, timedelta(milliseconds=300))
    assert c.add("w/after", 1) == 1


def test_a_wait_is_woken_by_another_process(port):
    waiter = other_process(port, """
        c.wait(["wake/k"], timedelta(seconds=60))
        print(c.get("wake/k").decode())
    """)
    c = client(port)
    c.set("wake/k", "woken")
    out, err = waiter.communicate(timeout=90)
    assert waiter.returncode == 0, err
    assert out.strip() == "woken"


def test_a_barrier_across_processes(port):
    others = [other_process(port, """
        c.barrier("bar/b", 3, timedelta(seconds=60))
        print("passed")
    """) for _ in range(2)]
    c = client(port)
    c.barrier("bar/b", 3, timedelta(seconds=60))
    for p in others:
        out, err = p.communicate(timeout=90)
        assert p.returncode == 0 and out.strip() == "passed", err
    assert c.get("bar/b") == b"3"


def test_queues_push_pop_len_and_a_blocked_pop_woken(port):
    c = client(port)
    c.queue_push("q/one", "a")
    c.queue_push("q/one", b"b")
    assert c.queue_len("q/one") == 2
    assert c.queue_pop("q/one") == b"a" and c.queue_pop("q/one", False) == b"b"
    with pytest.raises(dist.QueueEmptyError):
        c.queue_pop("q/one", False)
    popper = other_process(port, """
        print(c.queue_pop("q/two").decode())
    """)
    c.set("q/ready", "1")
    c.queue_push("q/two", "pushed")
    out, err = popper.communicate(timeout=90)
    assert popper.returncode == 0 and out.strip() == "pushed", err
    assert c.queue_len("q/two") == 0


def test_prefix_store_over_the_launchers_store(port):
    c = client(port)
    p = dist.PrefixStore("job/", c)
    p.set("x", "1")
    assert p.get("x") == b"1" and not c.check(["x"])
    assert p.add("n", 2) == 2 and p.check(["x", "n"])
    p.wait(["x"])
    assert p.multi_get(["x", "n"]) == [b"1", b"2"]
    nested = dist.PrefixStore("inner", p)
    nested.set("y", "z")
    seen_by_another = dist.PrefixStore("inner", dist.PrefixStore("job/", client(port)))
    assert seen_by_another.get("y") == b"z"
