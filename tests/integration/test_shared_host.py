"""Two nodes on one host (127.0.0.1 twice), one real launcher each, as torchrun users try a multi-node
command on one machine: torchrun's command line and ours, all-reduces across both nodes (real gloo in the
test marked ``real_torch``, a group without torch in the others: conftest.workers_without_torch).

What is promised: the nodes are told apart by their node rank; each takes its own worker ports (node 1
the ones after node 0's), so that every worker sees the same endpoint list; both may share one
--log_dir (workerlog.N per global rank, a state file per node, ``launcher status`` showing both); a
failure on node 1 stops node 0 with the same exit code, naming the node by its rank. Every wait is
bounded, and no worker outlives its launcher.
"""

import json
import subprocess

import pytest

from conftest import REPO, WORKERS, assert_all_gone, finish_all, free_ports, launcher_cmd, run_launcher

ALLREDUCE = str(WORKERS / "allreduce_dump.py")
NODE_WORKER = str(WORKERS / "node_worker.py")
pytestmark = pytest.mark.usefixtures("workers_without_torch")
HOST = "127.0.0.1"


def start(*args):
    return subprocess.Popen(launcher_cmd(*args), cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def run_both(node_args, timeout=120) -> list:
    """Node 1's launcher, then node 0's (the order users start them in does not matter); (code, out, err) of each."""
    procs = [start(*node_args(1)), start(*node_args(0))]
    results = finish_all(procs, timeout=timeout)
    return [results[1], results[0]]  # by node rank


def check_world(out, nproc: int, port: int) -> None:
    """Every rank joined the all-reduce, with node 1's ports after node 0's on the one host."""
    world = 2 * nproc
    endpoints = ",".join(f"{HOST}:{port + i}" for i in range(world))
    for rank in range(world):
        record = json.loads((out / f"allreduce.{rank}.json").read_text())
        env = record["env"]
        assert record["world"] == world and record["sum"] == world * (world + 1) / 2
        assert env["GROUP_RANK"] == str(rank // nproc) and env["LOCAL_RANK"] == str(rank % nproc)
        assert env["MASTER_ADDR"] == HOST and env["MASTER_PORT"] == str(port)
        assert env["PADDLE_CURRENT_ENDPOINT"] == f"{HOST}:{port + rank}"
        assert env["PADDLE_TRAINER_ENDPOINTS"] == endpoints


@pytest.mark.parametrize("nproc", [1, pytest.param(2, marks=pytest.mark.real_torch)])
def test_torchruns_command_line_runs_two_nodes_on_one_host(tmp_path, nproc):
    port = free_ports(1 + 2 * nproc) + 1  # node 0's launcher listens on the one below (--master-port minus one)

    def node(rank):
        return ("--nnodes", 2, "--node-rank", rank, "--nproc-per-node", nproc, "--master-addr", HOST,
                "--master-port", port, ALLREDUCE, tmp_path)

    for code, out, err in run_both(node):
        assert code == 0, err
        assert f"nodes: {HOST},{HOST} (nodes 0 and 1 share {HOST}, each with its own ports)" in err
    check_world(tmp_path, nproc, port)


@pytest.mark.parametrize("nproc,store", [(1, "on"), (2, "off")])
def test_our_command_line_runs_two_nodes_on_one_host_with_one_log_dir(tmp_path, nproc, store):
    """Either host of the store (node 0's launcher, or rank 0 listening on every address) leaves node 1's ports free."""
    port = free_ports(1 + 2 * nproc) + 1
    logs = tmp_path / "mylog"

    def node(rank):
        return ("--cluster_node_ips", f"{HOST},{HOST}", "--rank", rank, "--started_port", port,
                "--nproc_per_node", nproc, "--agent_store", store, "--log_dir", logs, ALLREDUCE, tmp_path)

    for code, out, err in run_both(node):
        assert code == 0, err
    check_world(tmp_path, nproc, port)
    names = sorted(p.name for p in logs.iterdir())
    assert names == sorted(["events.jsonl", "launcher.node0.json", "launcher.node1.json"] +
                           [f"workerlog.{r}" for r in range(2 * nproc)])  # both nodes' events in one log, by line
    for rank in range(2 * nproc):
        assert f"rank {rank}/{2 * nproc}: sum" in (logs / f"workerlog.{rank}").read_text()
    status = run_launcher("status", logs)
    assert status.returncode == 0, status.stderr
    assert "launcher: node 0 of 2 (127.0.0.1): ended with exit code 0" in status.stdout
    assert "launcher: node 1 of 2 (127.0.0.1): ended with exit code 0" in status.stdout
    rows = [line.split()[:2] for line in status.stdout.splitlines()[3:]]
    assert rows == [[str(r // nproc), "rank"] for r in range(2 * nproc)], status.stdout


def test_a_failure_on_node_1_stops_node_0_naming_node_1_by_its_rank(tmp_path):
    port = free_ports(5) + 1
    world = 4

    def node(rank):
        return ("--cluster_node_ips", f"{HOST},{HOST}", "--rank", rank, "--started_port", port, "--nproc_per_node", 2,
                "--shutdown_timeout", 2, NODE_WORKER, "--dump", tmp_path, "--fail-rank", world - 1, "--world", world,
                "--code", 9, "--sleep", 60)

    results = run_both(node, timeout=90)
    pids = [json.loads((tmp_path / f"env.{r}.0.json").read_text())["pid"] for r in range(world)]
    for code, out, err in results:
        assert code == 9, err
        assert f"launcher: the job stopped: rank 3 on node 1 ({HOST}) failed (exit code 9); exit code 9" in err
    assert_all_gone(pids)


def test_a_host_listed_twice_without_a_node_rank_is_refused_with_exit_code_2():
    r = run_launcher("--cluster_node_ips", f"{HOST},{HOST}", ALLREDUCE, "/tmp")
    assert r.returncode == 2
    assert r.stderr == (f"launcher: error: --cluster_node_ips {HOST},{HOST} lists {HOST} twice (nodes 0 and 1 share that "
                        f"host), so --node_ip {HOST} does not say which node this is; give this node's rank with --rank "
                        f"(0 or 1).\n")
    r = run_launcher("--cluster_node_ips", f"{HOST},{HOST}", "--rank", 2, ALLREDUCE, "/tmp")
    assert r.returncode == 2 and r.stderr == (f"launcher: error: --rank 2 is not a node rank of --cluster_node_ips "
                                              f"{HOST},{HOST}; give 0 to 1.\n")
