"""Node 0's store host (issue 17): who hosts the rendezvous store, the plan's variable, and the launcher side."""

import dataclasses
import os
import socket
import subprocess
import sys
from datetime import timedelta

import pytest

from launcher import envvars as ev
from launcher.errors import LaunchError
from launcher.plan import agent_store
from launcher.plan import policy
from launcher.plan.model import HostFacts, Interface, LaunchOptions
from launcher.plan.planner import make_plan
from launcher.run import store

PY = "/usr/bin/python3"
TORCH_HOST = HostFacts(gpu_count=None, cpu_count=8, interfaces=(Interface("lo", "127.0.0.1", "255.0.0.0"),),
                       python=PY, run_id="abc", temp_dir="/tmp", importable=frozenset({"torch"}))


def plan(host=TORCH_HOST, env=None, **opts):
    opts.setdefault("training_script", "train.py")
    return make_plan(LaunchOptions(**opts), env or {}, host, lambda ip, n: tuple(range(40000, 40000 + n)))


@pytest.mark.parametrize("choice, no_python, python, importable, used", [
    ("auto", False, PY, {"torch"}, True),
    ("auto", False, PY, {"torch", "paddle"}, False),  # Paddle's rank 0 hosts a store of its own on MASTER_PORT
    ("auto", False, PY, set(), False),  # a Paddle-only install
    ("auto", False, "/venv/bin/python", {"torch"}, False),  # PYTHON_EXEC: an interpreter not looked into
    ("auto", True, PY, {"torch"}, False),  # --no_python: not a Python worker
    ("off", False, PY, {"torch"}, False),
    ("on", False, PY, {"torch", "paddle"}, True),
    ("on", True, PY, {"torch"}, True),
    ("on", False, "/venv/bin/python", set(), True),
])
def test_who_hosts_the_store(choice, no_python, python, importable, used):
    assert agent_store.uses_agent_store(choice, no_python, python, PY, frozenset(importable)) is used


def test_on_without_torch_in_the_launchers_python_is_refused_in_one_sentence():
    with pytest.raises(LaunchError, match=r"^--agent_store on, but the workers' Python \(/usr/bin/python3\) cannot "
                                          r"import torch.*give --agent_store off\.$"):
        agent_store.uses_agent_store("on", False, PY, PY, frozenset())
    with pytest.raises(LaunchError, match="is not one of auto, on, off"):
        agent_store.uses_agent_store("maybe", False, PY, PY, frozenset())


def test_node_0_hosts_the_store_on_master_port_and_every_rank_is_told():
    p = plan(nproc_per_node=3)
    assert p.store_host == agent_store.StoreHostSpec(PY, "127.0.0.1", 40000)
    assert {w.env[ev.ELASTIC_USE_AGENT_STORE] for w in p.workers} == {"True"}
    assert p.workers[0].env[ev.MASTER_PORT] == "40000"


def test_other_nodes_are_told_but_host_nothing():
    p = plan(cluster_node_ips="127.0.0.1,127.0.0.2", node_ip="127.0.0.2", started_port=6170, nproc_per_node=2)
    assert p.node_rank == 1 and p.store_host is None
    assert {w.env[ev.ELASTIC_USE_AGENT_STORE] for w in p.workers} == {"True"}


def test_opt_out_and_paddle_jobs_keep_rank_0_hosting():
    for p in (plan(agent_store="off"), plan(host=dataclasses.replace(TORCH_HOST, importable=frozenset()))):
        assert p.store_host is None
        assert {w.env[ev.ELASTIC_USE_AGENT_STORE] for w in p.workers} == {"False"}


def test_parameter_server_mode_has_no_store_host():
    p = plan(server_num=1, worker_num=1)
    assert p.store_host is None and all(ev.ELASTIC_USE_AGENT_STORE not in w.env for w in p.workers)


# ---------------------------------------------------------------- the launcher side (launcher.run.store)


def test_the_store_hosts_exit_codes_are_the_launchers():
    sys.path.insert(0, os.path.dirname(store.STORE_HOST_FILE))
    try:
        import store_host
    finally:
        sys.path.pop(0)
    assert (store_host.NO_TORCH, store_host.CANNOT_LISTEN) == (store.NO_TORCH, store.CANNOT_LISTEN)
    assert os.path.isfile(store.STORE_HOST_FILE)


def test_without_a_store_host_nothing_is_done():
    agent = store.AgentStore(None, ())
    agent.listen()
    agent.start({}, lambda: None, lambda line: pytest.fail(line))
    assert agent.events(True) == [] and agent.pids() == set()
    agent.stop()
    agent.close()


def test_the_reserved_socket_is_the_one_listened_on_and_kept():
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        port = held.getsockname()[1]
        agent = store.AgentStore(agent_store.StoreHostSpec(PY, "127.0.0.1", port), [held])
        agent.listen()
        assert agent.listener is held
        with socket.create_connection(("127.0.0.1", port), timeout=5):  # queued, not refused
            pass
        agent.close()
        assert held.fileno() != -1  # the launch closes what it reserved


def test_a_port_in_use_is_refused_in_one_sentence():
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        agent = store.AgentStore(agent_store.StoreHostSpec(PY, "127.0.0.1", port), [])
        with pytest.raises(LaunchError, match=rf"^port {port} on 127.0.0.1, the rendezvous store's \(MASTER_PORT\), "
                                              r"cannot be listened on \(.*\); stop the program holding it, or "
                                              r"choose another --started_port \(--master_port\)\.$"):
            agent.listen()


class EndedHost:
    def __init__(self, returncode):
        self.returncode, self.told = returncode, False
        self.proc = type("Proc", (), {"pid": 4321})()

    def ended(self):
        return self.returncode


def test_a_store_host_that_ends_under_running_workers_stops_the_job_once():
    agent = store.AgentStore(agent_store.StoreHostSpec(PY, "127.0.0.1", 40000), [])
    agent.host = EndedHost(-9)
    assert agent.events(False) == []  # the workers are done: nothing needs it
    assert agent.events(True) == [policy.StartFailed(0, "the rendezvous store on 127.0.0.1:40000 (pid 4321) ended "
                                                        "(killed by SIGKILL)")]
    assert agent.events(True) == []


def test_a_store_host_without_torch_lets_the_job_go_on():
    agent = store.AgentStore(agent_store.StoreHostSpec(PY, "127.0.0.1", 40000), [])
    agent.host = EndedHost(store.NO_TORCH)
    assert agent.events(True) == []


def test_the_store_host_serves_clients_queued_before_it_was_up_and_ends_with_its_stdin():
    torch_dist = pytest.importorskip("torch.distributed")
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        port = held.getsockname()[1]
        agent = store.AgentStore(agent_store.StoreHostSpec(sys.executable, "127.0.0.1", port), [held])
        agent.listen()
        told = []
        agent.start(dict(os.environ), lambda: None, told.append)
        try:
            client = torch_dist.TCPStore("127.0.0.1", port, None, False, timeout=timedelta(seconds=60))
            client.set("key", "value")
            assert client.get("key") == b"value" and told == [f"pid {agent.host.proc.pid}"]
            del client
            proc = agent.host.proc
        finally:
            agent.close()
        assert proc.returncode is not None and agent.pids() == set()


def test_the_runtimes_rank_0_joins_the_agents_store_as_a_client():
    torch_dist = pytest.importorskip("torch.distributed")
    from launcher.runtime.environment import read_worker_env
    from launcher.runtime.parallel import rendezvous

    server = torch_dist.TCPStore("127.0.0.1", 0, None, True, wait_for_workers=False)
    env = read_worker_env({"RANK": "0", "WORLD_SIZE": "1", "MASTER_ADDR": "127.0.0.1",
                           "MASTER_PORT": str(server.port), ev.ELASTIC_USE_AGENT_STORE: "True"})
    assert env.agent_store
    rendezvous(env, timedelta(seconds=30)).set("from rank 0", "x")
    assert server.get("from rank 0") == b"x"
    assert not read_worker_env({"RANK": "0", "WORLD_SIZE": "1", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "1",
                                ev.ELASTIC_USE_AGENT_STORE: "False"}).agent_store
