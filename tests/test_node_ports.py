"""Nodes that share a host: each node's ports (launcher.plan.node_ports), the node rank that tells them apart, and
what every source does with a host listed twice. Pure: plans, no process."""

from dataclasses import replace

import pytest

from launcher import envvars as ev
from launcher.cli import paddle as paddle_cli
from launcher.errors import LaunchError
from launcher.nodes.static.job import identity
from launcher.output.reports import format_plan
from launcher.plan import node_ports
from launcher.plan.model import HostFacts, Interface
from test_clusters import plan as clusters_plan, refused as clusters_refused

HOST = HostFacts(gpu_count=None, cpu_count=8, interfaces=(Interface("lo", "127.0.0.1", "255.0.0.0"),),
                 python="/usr/bin/python3", run_id="r", temp_dir="/tmp", importable=frozenset({"torch"}))
TWICE = "127.0.0.1,127.0.0.1"


def plan(env=None, host=HOST, **opts):
    return clusters_plan(env or {}, host, **opts)


def refused(env=None, host=HOST, **opts) -> str:
    return clusters_refused(env or {}, host, **opts)


# ---------------------------------------------------------------- the ports


def test_a_node_takes_the_ports_after_those_of_the_nodes_before_it_on_its_host():
    nodes = ("10.0.0.1", "10.0.0.2", "10.0.0.1", "10.0.0.1", "10.0.0.2")
    assert node_ports.every_node(nodes, (6070, 6071), "--started_port 6070") == (
        (6070, 6071), (6070, 6071), (6072, 6073), (6074, 6075), (6072, 6073))
    assert node_ports.on_host_of(nodes, 0, node_ports.every_node(nodes, (6070,), "")) == (6070, 6071, 6072)
    assert node_ports.sharing(nodes, 2) == (0, 3) and node_ports.sharing(nodes, 1) == (4,)


def test_nodes_of_hosts_of_their_own_keep_the_same_ports_as_before():
    nodes = ("127.0.0.1", "127.0.0.2", "127.0.0.3")  # two addresses of one machine are two hosts, as on the network
    assert node_ports.every_node(nodes, (6070, 6071), "") == ((6070, 6071),) * 3
    p = plan(cluster_node_ips="127.0.0.1,127.0.0.2", node_ip="127.0.0.2", started_port=6170)
    assert p.ports == (6170, 6171) and p.node_ports == ((6170, 6171), (6170, 6171))
    assert p.workers[0].env[ev.TRAINER_ENDPOINTS] == "127.0.0.1:6170,127.0.0.1:6171,127.0.0.2:6170,127.0.0.2:6171"
    assert "share" not in format_plan(p)


def test_ports_past_65535_are_refused_naming_the_node_and_the_start_port_that_fits():
    with pytest.raises(LaunchError) as e:
        node_ports.every_node(("h", "h", "h"), (65530, 65531, 65532), "--started_port 65530")
    assert str(e.value) == ("--started_port 65530: node 2 (h) shares its host with 2 node(s) before it, so its 3 worker(s) "
                            "would take ports 65536 to 65538, beyond 65535; choose a start port of at most 65527.")
    assert len(node_ports.every_node(("h", "h", "h"), (65527, 65528, 65529), "")[2]) == 3
    assert "node 1 (127.0.0.1) shares its host with 1 node(s) before it, so its 1 worker(s) would take ports 65536 to " \
           "65536, beyond 65535; choose a start port of at most 65534." in refused(
               cluster_node_ips=TWICE, node_rank=0, started_port=65535, nproc_per_node=1)


def test_every_node_computes_the_same_endpoints_and_identity():
    plans = [plan(cluster_node_ips=TWICE, node_rank=r, nproc_per_node=2, started_port=7000, agent_store="on") for r in (0, 1)]
    endpoints = "127.0.0.1:7000,127.0.0.1:7001,127.0.0.1:7002,127.0.0.1:7003"
    for p in plans:
        assert [w.env[ev.TRAINER_ENDPOINTS] for w in p.workers] == [endpoints] * 2
        assert {w.env[ev.MASTER_PORT] for w in p.workers} == {"7000"} and p.control.port == 6999
        assert p.endpoints == endpoints.split(",")
    assert plans[1].ports == (7002, 7003) and [w.endpoint for w in plans[1].workers] == ["127.0.0.1:7002", "127.0.0.1:7003"]
    assert [w.rank for w in plans[1].workers] == [2, 3] and plans[1].workers[0].env[ev.GROUP_RANK] == "1"
    assert identity(plans[0]) == identity(plans[1]) and plans[0].job_ports == (7000, 7001)
    assert plans[0].store_port == 7000 and plans[1].store_port is None
    assert plans[0].agent_store.port == 7000 and plans[1].agent_store is None
    assert "nodes: 127.0.0.1,127.0.0.1 (nodes 0 and 1 share 127.0.0.1, each with its own ports)" in format_plan(plans[1])


def test_a_control_port_that_is_a_port_of_a_node_sharing_node_0s_host_is_refused():
    assert "--control_port 7002 is also the port of a process on node 0" in refused(
        cluster_node_ips=TWICE, node_rank=1, nproc_per_node=2, started_port=7000, control_port=7002)
    assert plan(cluster_node_ips="127.0.0.1,127.0.0.2", node_ip="127.0.0.2", nproc_per_node=2, started_port=7000,
                control_port=7002).control.port == 7002  # another host's ports are not node 0's


# ---------------------------------------------------------------- the node rank


def test_a_host_listed_twice_needs_the_node_rank():
    assert refused(cluster_node_ips=TWICE) == (
        "--cluster_node_ips 127.0.0.1,127.0.0.1 lists 127.0.0.1 twice (nodes 0 and 1 share that host), so --node_ip "
        "127.0.0.1 does not say which node this is; give this node's rank with --rank (0 or 1).")
    assert "lists 10.0.0.1 3 times (nodes 0, 1 and 3 share that host)" in refused(
        cluster_node_ips="10.0.0.1,10.0.0.1,10.0.0.2,10.0.0.1", node_ip="10.0.0.1")
    # the node alone at its address needs none
    assert plan(cluster_node_ips="127.0.0.1,127.0.0.1,127.0.0.2", node_ip="127.0.0.2", started_port=7000).node_rank == 2


def test_a_node_rank_out_of_range_or_at_another_address_is_refused():
    assert refused(cluster_node_ips=TWICE, node_rank=2) == "--rank 2 is not a node of --cluster_node_ips 127.0.0.1,127.0.0.1; give 0 to 1."
    assert refused(cluster_node_ips="127.0.0.1,127.0.0.2", node_rank=1) == (
        "--rank 1 is node 127.0.0.2 of --cluster_node_ips 127.0.0.1,127.0.0.2, but --node_ip is 127.0.0.1; give one of them.")


def test_paddles_rank_is_the_node_rank_of_the_command_line():
    values = {"cluster_node_ips": TWICE, "node_ip": "127.0.0.1", "rank": "1"}
    out = paddle_cli.translate(values, {"cluster_node_ips", "rank"})
    assert (out["node_ip"], out["node_rank"]) == ("127.0.0.1", 1)
    with pytest.raises(LaunchError, match="^--rank 2 is not a node rank of --cluster_node_ips 127.0.0.1,127.0.0.1; give 0 to 1.$"):
        paddle_cli.translate({**values, "rank": "2"}, {"cluster_node_ips", "rank"})
    assert "node_rank" not in paddle_cli.translate({**values, "rank": "-1"}, {"cluster_node_ips", "rank"})


# ---------------------------------------------------------------- the sources


def test_torchrun_nodes_of_one_host_are_told_apart_by_their_node_rank():
    host = replace(HOST, gathered_nodes=("127.0.0.1", "127.0.0.1"))
    p = plan(host=host, nnodes=2, node_rank=1, master_addr="127.0.0.1", started_port=29500, nproc_per_node=1)
    assert p.node_rank == 1 and p.ports == (29501,) and p.workers[0].env[ev.MASTER_PORT] == "29500"
    assert p.workers[0].env[ev.TRAINER_ENDPOINTS] == "127.0.0.1:29500,127.0.0.1:29501" and p.control.port == 29499


def test_paddlecloud_pods_of_one_host_each_get_their_own_ports():
    env = {"PADDLE_TRAINERS": TWICE, "POD_IP": "127.0.0.1", "PADDLE_TRAINER_ID": "1", "PADDLE_TRAINERS_NUM": "2",
           "PADDLE_PORT": "35019", "TRAINER_PORTS_NUM": "2"}
    p = plan(env, use_paddlecloud=True, nproc_per_node=2)
    assert p.ports == (35021, 35022) and [w.rank for w in p.workers] == [2, 3]
    explicit = {**env, "DISTRIBUTED_TRAINER_ENDPOINTS": "127.0.0.1:1000,127.0.0.1:1001,127.0.0.1:2000,127.0.0.1:2001"}
    p = plan(explicit, use_paddlecloud=True, nproc_per_node=2)
    assert p.ports == (2000, 2001) and p.node_ports == ((1000, 1001), (2000, 2001))
    assert p.workers[0].env[ev.TRAINER_ENDPOINTS] == explicit["DISTRIBUTED_TRAINER_ENDPOINTS"]
    assert p.workers[0].env[ev.MASTER_PORT] == "1000"


@pytest.mark.parametrize("env,host,fragment", [
    ({"OMPI_COMM_WORLD_SIZE": "2", "OMPI_COMM_WORLD_RANK": "1", "MASTER_ADDR": "127.0.0.1"},
     replace(HOST, gathered_nodes=("127.0.0.1", "127.0.0.1")),
     "lists 127.0.0.1 twice: MPI ranks 0 and 1 both run there, which starts several launchers per node; run mpirun "
     "with --map-by ppr:1:node"),
    ({"PMI_SIZE": "3", "PMI_RANK": "0", "MASTER_ADDR": "10.0.0.1"},
     replace(HOST, gathered_nodes=("10.0.0.1", "10.0.0.2", "10.0.0.2")), "MPI ranks 1 and 2 both run there"),
    ({"SLURM_STEP_ID": "0", "SLURM_NODEID": "0", "SLURM_JOB_ID": "5", "SLURM_STEP_NODELIST": "n1",
      "SLURM_STEP_NUM_NODES": "1", "SLURM_STEP_NUM_TASKS": "2"}, HOST,
     "SLURM_STEP_NUM_TASKS=2 on SLURM_STEP_NUM_NODES=1 starts several launchers per node"),
])
def test_schedulers_that_start_one_launcher_per_node_refuse_two_on_one_host(env, host, fragment):
    assert fragment in refused(env, host)


# ---------------------------------------------------------------- nodes of different sizes (an elastic round's)


def test_nodes_of_different_sizes_take_their_own_ports_and_ranks_the_running_sum_of_the_sizes_before():
    """An elastic round of a node of 1 worker and one of 2 on one host, seen from each: torchrun's ranks, Paddle's
    endpoints with each node's own count."""
    seen = {rank: plan(cluster_node_ips=TWICE, node_ip="127.0.0.1", node_rank=rank, started_port=6170,
                       nproc_per_node=(1, 2)[rank], node_workers=(1, 2)) for rank in (0, 1)}
    endpoints = "127.0.0.1:6170,127.0.0.1:6171,127.0.0.1:6172"
    assert seen[0].node_ports == seen[1].node_ports == ((6170,), (6171, 6172))
    assert [w.rank for w in seen[0].workers] == [0] and [w.rank for w in seen[1].workers] == [1, 2]
    for node_rank, p in seen.items():
        assert p.world_size == 3 and p.endpoints == endpoints.split(",")
        for w in p.workers:
            env = w.env
            assert (env[ev.RANK], env[ev.TRAINER_ID], env["ROLE_RANK"], env["PADDLE_GLOBAL_RANK"]) == (str(w.rank),) * 4
            assert (env[ev.WORLD_SIZE], env[ev.TRAINERS_NUM], env["ROLE_WORLD_SIZE"], env["PADDLE_GLOBAL_SIZE"]) == ("3",) * 4
            assert (env[ev.LOCAL_WORLD_SIZE], env["PADDLE_LOCAL_SIZE"]) == (str(node_rank + 1),) * 2
            assert (env[ev.GROUP_RANK], env["GROUP_WORLD_SIZE"], env["PADDLE_NNODES"]) == (str(node_rank), "2", "2")
            assert env[ev.TRAINER_ENDPOINTS] == endpoints and env[ev.CURRENT_ENDPOINT] == w.endpoint
            assert env[ev.MASTER_PORT] == "6170"


def test_gpu_nodes_of_different_sizes_name_each_nodes_devices():
    gpus = replace(HOST, gpu_count=4)
    p = plan(host=gpus, cluster_node_ips="10.0.0.1,10.0.0.2,10.0.0.3", node_ip="10.0.0.2", node_rank=1,
             started_port=6170, selected_gpus="2,3", node_workers=(1, 2, 3))
    assert [(w.rank, w.gpu, w.env[ev.SELECTED_GPUS]) for w in p.workers] == [(1, "2", "2"), (2, "3", "3")]
    assert p.workers[0].env["PADDLE_WORLD_DEVICE_IDS"] == "0,2:3,0:1:2"


def test_a_round_that_seats_this_node_with_another_count_than_its_own_is_refused():
    assert refused(cluster_node_ips=TWICE, node_ip="127.0.0.1", node_rank=1, started_port=6170, nproc_per_node=2,
                   node_workers=(1, 3)) == ("the round seats node 1 with 3 worker(s), but it runs 2; start its launcher "
                                            "again.")
