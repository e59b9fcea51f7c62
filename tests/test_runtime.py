"""launcher.runtime: reading the launcher's variables, the backend choice, the flags, the rendezvous."""

import socket
from datetime import timedelta

import pytest
import torch

from launcher import envvars as ev
from launcher.runtime import WorkerEnv, WorkerEnvError, choose_backend, init_parallel_env, read_worker_env, reset
from launcher.runtime import parallel
from launcher.runtime import flags as fl
from launcher.runtime.environment import env_from_endpoints, gpu_index
from launcher.runtime.parallel import RendezvousError, rendezvous
from conftest import free_port

ENDPOINTS = "10.0.0.1:6170,10.0.0.1:6171,10.0.0.2:6170,10.0.0.2:6171"


@pytest.fixture(autouse=True)
def fresh():
    """Every test starts with no process group and no warning given."""
    reset()
    yield
    reset()


def paddle_env(rank=2, **extra):
    env = {ev.TRAINER_ID: str(rank), ev.TRAINERS_NUM: "4", ev.TRAINER_ENDPOINTS: ENDPOINTS,
           ev.CURRENT_ENDPOINT: ENDPOINTS.split(",")[rank]}
    env.update(extra)
    return env


def test_no_launcher_variables_is_a_world_of_one():
    env = read_worker_env({})
    assert (env.rank, env.world_size, env.alone, env.endpoints) == (0, 1, True, ())


def test_paddle_names_alone_give_rank_nodes_and_master():
    env = read_worker_env(paddle_env(rank=3))
    assert (env.rank, env.world_size, env.local_rank, env.local_world_size) == (3, 4, 1, 2)
    assert (env.node_rank, env.node_count) == (1, 2)
    assert (env.master_addr, env.master_port) == ("10.0.0.1", 6170)
    assert env.endpoint_of(2) == "10.0.0.2:6170"


def test_torch_names_alone_are_enough():
    env = read_worker_env({ev.RANK: "1", ev.WORLD_SIZE: "2", ev.MASTER_ADDR: "h", ev.MASTER_PORT: "29500",
                           ev.LOCAL_RANK: "1", ev.LOCAL_WORLD_SIZE: "2"})
    assert (env.rank, env.world_size, env.master_addr, env.master_port, env.endpoints) == (1, 2, "h", 29500, ())
    assert env.endpoint_of(1) == "endpoint unknown"


def test_launcher_variables_win_over_guesses():
    env = read_worker_env(paddle_env(rank=3, **{ev.RANK: "3", ev.WORLD_SIZE: "4", ev.LOCAL_RANK: "1",
                                                  ev.LOCAL_WORLD_SIZE: "2", ev.GROUP_RANK: "1", ev.GROUP_WORLD_SIZE: "2",
                                                  ev.MASTER_ADDR: "10.0.0.1", ev.MASTER_PORT: "6170"}))
    assert (env.local_rank, env.node_rank, env.node_count, env.master_port) == (1, 1, 2, 6170)


def test_endpoints_can_come_from_a_file(tmp_path):
    path = tmp_path / "endpoints"
    path.write_text(ENDPOINTS + "\n")
    environ = paddle_env(rank=1)
    del environ[ev.TRAINER_ENDPOINTS]
    environ[ev.TRAINER_ENDPOINTS_FILE] = str(path)
    assert read_worker_env(environ).endpoints == tuple(ENDPOINTS.split(","))


@pytest.mark.parametrize("environ, words", [
    ({ev.TRAINER_ID: "1", ev.RANK: "2", ev.TRAINERS_NUM: "4", ev.TRAINER_ENDPOINTS: ENDPOINTS}, "disagree"),
    ({ev.TRAINER_ID: "x", ev.TRAINERS_NUM: "4"}, "not a whole number"),
    ({ev.TRAINER_ID: "4", ev.TRAINERS_NUM: "4", ev.TRAINER_ENDPOINTS: ENDPOINTS}, "outside a world of 4"),
    ({ev.TRAINER_ID: "1"}, ev.TRAINERS_NUM),
    ({ev.TRAINER_ID: "1", ev.TRAINERS_NUM: "3", ev.TRAINER_ENDPOINTS: ENDPOINTS}, "lists 4 endpoints"),
    ({ev.TRAINER_ID: "1", ev.TRAINERS_NUM: "2"}, ev.MASTER_ADDR),
    ({ev.TRAINER_ID: "0", ev.TRAINERS_NUM: "1", ev.TRAINER_ENDPOINTS: "nohost"}, "ip:port"),
    ({ev.TRAINER_ID: "0", ev.TRAINERS_NUM: "1", ev.TRAINER_ENDPOINTS_FILE: "/no/such/file"}, "cannot be read"),
])
def test_bad_variables_are_named(environ, words):
    with pytest.raises(WorkerEnvError, match=words):
        read_worker_env(environ)


def test_user_defined_endpoints_give_local_and_node_ranks():
    env = env_from_endpoints(2, ENDPOINTS.split(","))
    assert (env.rank, env.world_size, env.local_rank, env.local_world_size, env.node_rank, env.node_count) == (2, 4, 0, 2, 1, 2)
    with pytest.raises(WorkerEnvError, match="current_id 4"):
        env_from_endpoints(4, ENDPOINTS.split(","))


def test_ipv6_endpoints_are_read_in_brackets_as_the_launcher_writes_them():
    endpoints = ["[fd00::1]:6170", "[fd00::1]:6171", "[fe80::2%eth0]:6170", "[fe80::2%eth0]:6171"]
    env = env_from_endpoints(3, endpoints)
    assert (env.master_addr, env.master_port, env.node_rank, env.local_rank, env.node_count) == ("fd00::1", 6170, 1, 1, 2)
    environ = {ev.TRAINER_ID: "1", ev.TRAINERS_NUM: "2", ev.TRAINER_ENDPOINTS: "[::1]:6170,[::1]:6171"}
    assert (read_worker_env(environ).master_addr, read_worker_env(environ).master_port) == ("::1", 6170)


@pytest.mark.parametrize("endpoint, reason", [
    ("fd00::1:6170", "it has no port (an IPv6 address takes its port in brackets: [fd00::1:6170]:PORT)"),
    ("10.0.0.1:0", "it has the port '0', not a whole number from 1 to 65535"),
    ("10.0.0.1:65536", "it has the port '65536', not a whole number from 1 to 65535"),
    ("[fd00::1", "it is not HOST:PORT (brackets hold an IPv6 address, such as [::1]:29500)"),
    (":6170", "it has no host before its port"),
])
def test_a_bad_endpoint_is_refused_saying_what_is_wrong(endpoint, reason):
    environ = {ev.TRAINER_ID: "0", ev.TRAINERS_NUM: "1", ev.TRAINER_ENDPOINTS: endpoint}
    with pytest.raises(WorkerEnvError) as refusal:
        read_worker_env(environ)
    assert str(refusal.value) == f"{ev.TRAINER_ENDPOINTS} holds {endpoint!r} where ip:port belongs: {reason}."
    with pytest.raises(WorkerEnvError, match="where ip:port belongs: it"):
        env_from_endpoints(0, [endpoint])


@pytest.mark.parametrize("gpus, cuda, requested, backend", [
    ("0", True, None, "nccl"),
    ("3", False, None, "gloo"),
    (None, True, None, "gloo"),
    (None, False, None, "gloo"),
    ("0", True, "gloo", "gloo"),
])
def test_nccl_only_for_a_worker_with_a_gpu(gpus, cuda, requested, backend):
    assert choose_backend(gpus, cuda, requested) == backend


def test_nccl_without_cuda_is_refused():
    with pytest.raises(WorkerEnvError, match="needs CUDA"):
        choose_backend("0", False, "nccl")


def test_gpu_index_is_the_first_selected_gpu():
    assert (gpu_index(None), gpu_index("2"), gpu_index("1,2")) == (None, 2, 1)


def test_flags_are_read_and_checked():
    flags = fl.read_flags({fl.SYNC_NCCL_ALLREDUCE: "1", fl.FRACTION_OF_GPU_MEMORY: "0.9", fl.NCCL_IB_DISABLE: "1",
                           fl.FUSE_PARAMETER_MEMORY_SIZE: "16", fl.FUSE_PARAMETER_GROUPS_SIZE: "-1"})
    assert flags == fl.Flags(sync_allreduce=True, gpu_memory_fraction=0.9, ib_disable=True, fuse_memory_mb=16.0)
    assert fl.read_flags({}) == fl.Flags()
    with pytest.raises(ValueError, match=fl.FRACTION_OF_GPU_MEMORY):
        fl.read_flags({fl.FRACTION_OF_GPU_MEMORY: "1.5"})
    with pytest.raises(ValueError, match=fl.SYNC_NCCL_ALLREDUCE):
        fl.read_flags({fl.SYNC_NCCL_ALLREDUCE: "maybe"})


def test_gpu_flags_on_a_cpu_worker_warn_once(monkeypatch):
    flags = fl.Flags(gpu_memory_fraction=0.5, ib_disable=True)
    with pytest.warns(fl.FleetWarning) as record:
        fl.apply_flags(flags, "gloo", torch.device("cpu"))
        fl.apply_flags(flags, "gloo", torch.device("cpu"))
    messages = [str(w.message) for w in record]
    assert len(messages) == 2
    assert any("NCCL_IB_DISABLE is read by NCCL only" in m for m in messages)
    assert any("runs on the CPU" in m for m in messages)


def three_ranks(rank, port):
    endpoints = (f"127.0.0.1:{port}", "127.0.0.1:7001", "127.0.0.1:7002")
    return WorkerEnv(rank=rank, world_size=3, local_world_size=3, local_rank=rank, endpoints=endpoints,
                     master_addr="127.0.0.1", master_port=port)


def test_rank_zero_names_the_ranks_that_never_arrived():
    with pytest.raises(RendezvousError, match=r"missing: rank 1 \(127.0.0.1:7001\), rank 2 \(127.0.0.1:7002\)\.$"):
        rendezvous(three_ranks(0, free_port()), timedelta(seconds=0.5))


def test_a_rank_without_rank_zero_names_rank_zero():
    port = free_port()
    with pytest.raises(RendezvousError, match=rf"missing: rank 0 \(127.0.0.1:{port}\)\.$"):
        rendezvous(three_ranks(1, port), timedelta(seconds=0.5))


def test_world_of_one_runs_collectives(monkeypatch):
    for name in (ev.TRAINER_ID, ev.RANK, ev.TRAINERS_NUM, ev.WORLD_SIZE, ev.SELECTED_GPUS):
        monkeypatch.delenv(name, raising=False)
    penv = init_parallel_env()
    assert (penv.rank, penv.world_size, penv.backend, penv.device.type) == (0, 1, "gloo", "cpu")
    t = torch.ones(3)
    torch.distributed.all_reduce(t)
    assert t.tolist() == [1.0, 1.0, 1.0]
    assert init_parallel_env() == penv  # a second call finds it set up


def test_selected_gpus_without_cuda_runs_on_the_cpu_and_says_so(monkeypatch):
    for name in (ev.TRAINER_ID, ev.RANK, ev.TRAINERS_NUM, ev.WORLD_SIZE):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv(ev.SELECTED_GPUS, "0")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)  # the one stand-in: a machine without a GPU
    with pytest.warns(fl.FleetWarning, match="sees no CUDA device"):
        penv = init_parallel_env()
    assert (penv.backend, penv.device.type) == ("gloo", "cpu")


def test_parameter_server_flags_warn_that_they_have_no_effect(monkeypatch):
    flags = fl.read_flags({name: "4" for name in fl.RPC_FLAGS})
    assert flags.rpc_flags == fl.RPC_FLAGS
    with pytest.warns(fl.FleetWarning) as record:
        fl.apply_flags(flags, "gloo", torch.device("cpu"))
    assert sorted(str(w.message).split(" ")[0] for w in record) == sorted(fl.RPC_FLAGS)
    assert all("parameter-server" in str(w.message) for w in record)


def test_reset_tears_the_job_down_and_forgets_the_warnings(monkeypatch):
    for name in (ev.TRAINER_ID, ev.RANK, ev.TRAINERS_NUM, ev.WORLD_SIZE, ev.SELECTED_GPUS):
        monkeypatch.delenv(name, raising=False)
    init_parallel_env(timeout=7)
    assert torch.distributed.is_initialized() and parallel.current_job().timeout == timedelta(seconds=7)
    with pytest.warns(fl.FleetWarning):
        fl.warn_once("some key", "a message")
    reset()
    assert not torch.distributed.is_initialized() and parallel.current_job() is None
    with pytest.warns(fl.FleetWarning):
        fl.warn_once("some key", "a message")


def test_rank_zero_hosts_the_store_on_a_port_the_launcher_keeps_reserved():
    """The launcher holds MASTER_PORT with a bound, non-listening SO_REUSEADDR socket; rank 0's TCPStore binds over it."""
    with socket.socket() as reserved:
        reserved.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        reserved.bind(("127.0.0.1", 0))
        port = reserved.getsockname()[1]
        env = WorkerEnv(rank=0, world_size=1, endpoints=(f"127.0.0.1:{port}",), master_addr="127.0.0.1", master_port=port)
        store = rendezvous(env, timedelta(seconds=5))
        store.set("k", "v")
        assert store.get("k") == b"v"
