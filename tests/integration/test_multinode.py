"""Two nodes, one command each, a real gloo all-reduce over 4 ranks."""

import json
import subprocess

from conftest import REPO, WORKERS, finish_all, free_ports, launcher_cmd

ALLREDUCE = str(WORKERS / "allreduce_dump.py")


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
