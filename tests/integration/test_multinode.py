"""Two nodes, one command each, an all-reduce over 4 ranks: real gloo on loopback, a group without torch
(workers/store_group.py) in the other tests (conftest.workers_without_torch)."""

import json
import subprocess

import pytest

from conftest import PROBE, REPO, WORKERS, finish_all, free_ports, launcher_cmd, read_dumps, run_launcher

ALLREDUCE = str(WORKERS / "allreduce_dump.py")
pytestmark = pytest.mark.usefixtures("workers_without_torch")


def start_node(nodes, node_ip, port, out, prefix=()):
    cmd = [*prefix, *launcher_cmd("--cluster_node_ips", ",".join(nodes), "--node_ip", node_ip,
                                  "--started_port", port, "--nproc_per_node", 2,
                                  "--log_dir", out / f"log-{node_ip}", "--shutdown_timeout", 2,
                                  ALLREDUCE, out)]
    return subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def check_world(out, nodes, port):
    records = {}
    for rank in range(4):
        records[rank] = json.loads((out / f"allreduce.{rank}.json").read_text())
    endpoints = ",".join(f"{ip}:{port + i}" for ip in nodes for i in range(2))
    for rank, r in records.items():
        assert r["rank"] == rank and r["world"] == 4
        assert r["sum"] == 1 + 2 + 3 + 4
        env = r["env"]
        assert env["RANK"] == env["PADDLE_TRAINER_ID"] == str(rank)
        assert env["WORLD_SIZE"] == env["PADDLE_TRAINERS_NUM"] == "4"
        assert env["LOCAL_RANK"] == str(rank % 2) and env["LOCAL_WORLD_SIZE"] == "2"
        assert env["GROUP_RANK"] == str(rank // 2)
        assert env["MASTER_ADDR"] == nodes[0] and env["MASTER_PORT"] == str(port)
        assert env["PADDLE_CURRENT_ENDPOINT"] == f"{nodes[rank // 2]}:{port + rank % 2}"
        assert env["PADDLE_TRAINER_ENDPOINTS"] == endpoints


@pytest.mark.real_torch
def test_two_nodes_on_loopback(tmp_path):
    nodes = ["127.0.0.1", "127.0.0.2"]
    port = free_ports(2)
    # node 1 first: rank 0's store will listen on every address of this one machine,
    # which node 1's own port check would rightly call "in use" if node 0 came first
    second = start_node(nodes, nodes[1], port, tmp_path)
    first = start_node(nodes, nodes[0], port, tmp_path)
    for code, out, err in finish_all([second, first]):
        assert code == 0, err
    check_world(tmp_path, nodes, port)
    assert "rank 2/4: sum 10.0" in (tmp_path / "log-127.0.0.2" / "workerlog.2").read_text()


def test_two_nodes_in_two_network_namespaces(tmp_path, veth_namespaces):
    names, _, nodes = veth_namespaces
    port = 6070
    procs = [start_node(nodes, ip, port, tmp_path, prefix=("ip", "netns", "exec", ns)) for ns, ip in zip(names, nodes)]
    for code, out, err in finish_all(procs):
        assert code == 0, err
    check_world(tmp_path, nodes, port)


def test_paddle_18s_own_launch_test_node_0_alone_ends_0_at_once_and_names_node_1(tmp_path):
    """Paddle 1.8's test_launch.sh starts node 0 of a two-node PaddleCloud job alone, with workers
    that need no peer; the job's work here is done when they exit 0 (not after --join_timeout, 300 s)."""
    port = free_ports(3) + 1  # and the one below it, node 0's control port
    env = {"PADDLE_TRAINERS": "127.0.0.1,127.0.0.2", "POD_IP": "127.0.0.1", "PADDLE_TRAINER_ID": "0",
           "PADDLE_TRAINERS_NUM": "2", "PADDLE_PORT": str(port), "TRAINER_PORTS_NUM": "2", "CUDA_VISIBLE_DEVICES": "0,1"}
    # ended before the join timeout (300 s) could have passed: run_launcher gives up after 120 s
    r = run_launcher("--use_paddlecloud", "--selected_gpus=0,1", "--log_dir", tmp_path / "testlog", PROBE,
                     "--dump", tmp_path, env=env, timeout=120)
    assert r.returncode == 0, r.stderr
    assert ("node 1 (127.0.0.2) never joined; this node's workers all finished, so the job ends here "
            "with exit code 0") in r.stderr
    assert sorted(read_dumps(tmp_path, 2)) == [0, 1]
