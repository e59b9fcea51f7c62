"""Nodes as torchrun forms them, on launchers that share 127.0.0.1: PyTorch's own multi-node recipe (the same
command on every node, ``--nnodes 2`` at a c10d rendezvous, no node rank) and Paddle's (``--master IP:PORT --nnodes
2``) form an elastic job of 2:2 whose node ranks follow the order of arrival, a launcher past 2 waiting as a
standby; nodes of different sizes (1 and 2 workers) get the variables torchrun's own agents give the same shape,
compared rank by rank with ``torch.distributed.run`` run beside ours, and every Paddle variable true for each node's
own count; the same on etcd. Node A is started first and waited for (listening, or its key in etcd) before node B,
so that the order of arrival is known. Every wait is bounded, and nothing of a test is left running."""

import json
import subprocess
import sys

import pytest

from conftest import (WORKERS, assert_all_gone, finish_all, free_ports, listening, read_dumps, read_until, start_launcher,
                      wait_for)
from etcd_servers import etcd  # noqa: F401 - the fixture

WORKER = str(WORKERS / "elastic_worker.py")
ENV_DUMP = str(WORKERS / "torchrun_env.py")
HOST = "127.0.0.1"
pytestmark = pytest.mark.usefixtures("workers_without_torch")
# what torchrun's agent defines for each worker, compared rank by rank (MASTER_PORT is a free port of each run's,
# TORCHELASTIC_ERROR_FILE a file of each launcher's, OMP_NUM_THREADS each launcher's own choice)
TORCHRUN_NAMES = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "GROUP_WORLD_SIZE", "ROLE_RANK",
                  "ROLE_WORLD_SIZE", "ROLE_NAME", "MASTER_ADDR", "TORCHELASTIC_RESTART_COUNT",
                  "TORCHELASTIC_MAX_RESTARTS", "TORCHELASTIC_RUN_ID", "TORCHELASTIC_USE_AGENT_STORE",
                  "TORCH_NCCL_ASYNC_ERROR_HANDLING")


def records(folder) -> list:
    path = folder / "records.jsonl"
    return sorted((json.loads(line) for line in path.read_text().splitlines()), key=lambda r: r["rank"]) \
        if path.exists() else []


def in_order(first, then, ready, timeout=120) -> list:
    """Start the launcher of ``first`` (its args), wait until ``ready()``, then each one of ``then``; (code, out, err)
    of each, in that order."""
    procs = [start_launcher(*first)]
    try:
        wait_for(lambda: ready() or procs[0].poll() is not None, 60, what="node A to be there")
        procs += [start_launcher(*args) for args in then]
        return finish_all(procs, timeout=timeout)
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()


def check_sizes(done: list, sizes: tuple) -> None:
    """The records of one round of nodes of ``sizes`` workers, by node rank: every variable true for each node's own
    count, and the group of all of them formed (its all-reduce summed every rank's rank + 1)."""
    world = sum(sizes)
    assert [r["rank"] for r in done] == list(range(world))
    endpoints = done[0]["env"]["PADDLE_TRAINER_ENDPOINTS"].split(",")
    assert len(endpoints) == len(set(endpoints)) == world
    starts = [sum(sizes[:n]) for n in range(len(sizes))]
    for r in done:
        env, node = r["env"], max(n for n, start in enumerate(starts) if start <= r["rank"])
        local = r["rank"] - starts[node]
        assert r["world"] == world and r["sum"] == world * (world + 1) / 2
        assert (env["RANK"], env["PADDLE_TRAINER_ID"], env["ROLE_RANK"]) == (str(r["rank"]),) * 3
        assert (env["WORLD_SIZE"], env["PADDLE_TRAINERS_NUM"], env["ROLE_WORLD_SIZE"]) == (str(world),) * 3
        assert (env["LOCAL_RANK"], env["PADDLE_RANK_IN_NODE"]) == (str(local),) * 2
        assert (env["LOCAL_WORLD_SIZE"], env["PADDLE_LOCAL_SIZE"]) == (str(sizes[node]),) * 2
        assert (env["GROUP_RANK"], env["GROUP_WORLD_SIZE"]) == (str(node), str(len(sizes)))
        assert env["PADDLE_TRAINER_ENDPOINTS"].split(",") == endpoints
        assert env["PADDLE_CURRENT_ENDPOINT"] == endpoints[r["rank"]]


def torchrun_recipe(port, folder, nproc=1, nnodes="2", *extra):
    return ("--nnodes", nnodes, "--nproc-per-node", nproc, "--rdzv-id", "recipe", "--rdzv-backend", "c10d",
            "--rdzv-endpoint", f"{HOST}:{port}", *extra, WORKER, folder, 2)


# ---------------------------------------------------------------- the recipes, no node rank


@pytest.mark.parametrize("nnodes", ["2", "2:2"])
def test_torchruns_recipe_with_no_node_rank_forms_with_ranks_in_the_order_of_arrival(tmp_path, nnodes):
    port = free_ports(6)
    a, b = torchrun_recipe(port, tmp_path, 1, nnodes), torchrun_recipe(port, tmp_path, 1, nnodes)
    results = in_order(a, [b], lambda: listening(HOST, port))
    assert [code for code, _, _ in results] == [0, 0], results
    check_sizes(records(tmp_path), (1, 1))
    assert "this launcher is node 0, waiting for 2 nodes on" in results[0][2]
    assert "this launcher is node 1" in results[1][2]
    assert "round 1 (start): 2 node(s), world size 2" in results[0][2]


def test_a_launcher_past_n_waits_as_a_standby_and_ends_with_the_job(tmp_path):
    """The workers hold (elastic_worker.py's ``hold``) until node 0 said the third launcher waits as a standby: a
    launcher that came after the job's end would wait for a job of its own."""
    port = free_ports(6)
    args = (*torchrun_recipe(port, tmp_path), "hold")
    procs = [start_launcher(*args)]
    try:
        wait_for(lambda: listening(HOST, port) or procs[0].poll() is not None, 60, what="node A to listen")
        procs += [start_launcher(*args) for _ in range(2)]
        said = read_until(procs[0], "waits as a standby: the job has its 2 nodes", timeout=90)
        (tmp_path / "go").touch()
        results = finish_all(procs)
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    assert [code for code, _, _ in results] == [0, 0, 0], results
    check_sizes(records(tmp_path), (1, 1))
    assert (said + results[0][2]).count("waits as a standby") == 1


def test_paddles_recipe_master_and_nnodes_with_no_rank_forms(tmp_path):
    port = free_ports(6)
    args = ("--nnodes", 2, "--master", f"{HOST}:{port}", "--nproc_per_node", 1, WORKER, tmp_path, 2)
    results = in_order(args, [args], lambda: listening(HOST, port))
    assert [code for code, _, _ in results] == [0, 0], results
    done = records(tmp_path)
    check_sizes(done, (1, 1))
    assert all(r["env"]["MASTER_PORT"] == str(port + 1) for r in done)


# ---------------------------------------------------------------- nodes of different sizes


def test_nodes_of_1_and_2_workers_form_one_group_with_every_variable_of_their_own_count(tmp_path):
    port = free_ports(8)
    results = in_order(torchrun_recipe(port, tmp_path, 1), [torchrun_recipe(port, tmp_path, 2)],
                       lambda: listening(HOST, port))
    assert [code for code, _, _ in results] == [0, 0], results
    done = records(tmp_path)
    check_sizes(done, (1, 2))
    assert "round 1 (start): 2 node(s), world size 3 (workers per node: 1, 2)" in results[0][2]
    assert_all_gone([r["pid"] for r in done])


def torchrun_agents(port, folder, sizes) -> list:
    """torch's own torchrun agents on the shape (node A first, at 127.0.0.1, and on once it hosts the rendezvous;
    torchrun ranks the nodes by their address, so B's is 127.0.0.2): their workers' dumps."""
    line = [sys.executable, "-m", "torch.distributed.run", "--nnodes", 2, "--rdzv-id", "sizes", "--rdzv-backend", "c10d",
            "--rdzv-endpoint", f"{HOST}:{port}"]
    procs = []
    try:
        for size, address in zip(sizes, ("127.0.0.1", "127.0.0.2")):
            procs.append(subprocess.Popen([*map(str, line), "--nproc-per-node", str(size), "--local-addr", address,
                                           ENV_DUMP, str(folder)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                          text=True))
            wait_for(lambda: listening(HOST, port) or procs[0].poll() is not None, 60, what="torchrun's node A")
        results = finish_all(procs)
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    assert [code for code, _, _ in results] == [0, 0], results
    return read_dumps(folder, sum(sizes))


def test_nodes_of_different_sizes_get_what_torchruns_own_agents_give_rank_by_rank(tmp_path):
    """The workers dump their variables without importing torch (WORKER_GROUP=store), under either launcher."""
    sizes = (1, 2)
    (tmp_path / "torchrun").mkdir()
    (tmp_path / "ours").mkdir()
    theirs = torchrun_agents(free_ports(4), tmp_path / "torchrun", sizes)
    port = free_ports(8)
    lines = [("--nnodes", 2, "--nproc-per-node", size, "--rdzv-id", "sizes", "--rdzv-backend", "c10d", "--rdzv-endpoint",
              f"{HOST}:{port}", ENV_DUMP, tmp_path / "ours") for size in sizes]
    results = in_order(lines[0], lines[1:], lambda: listening(HOST, port))
    assert [code for code, _, _ in results] == [0, 0], results
    ours = read_dumps(tmp_path / "ours", sum(sizes))
    assert sorted(ours) == sorted(theirs) == [0, 1, 2]
    for rank in ours:
        assert {n: ours[rank][n] for n in TORCHRUN_NAMES} == {n: theirs[rank][n] for n in TORCHRUN_NAMES}, rank


# ---------------------------------------------------------------- etcd


def etcd_recipe(server, folder, nproc, started_port):
    return ("--nnodes", 2, "--nproc-per-node", nproc, "--rdzv-backend", "etcd", "--rdzv-endpoint", server.endpoints,
            "--rdzv-id", "forming", "--rdzv-conf", "heartbeat_timeout=2,keep_alive_interval=0.5,join_timeout=30",
            "--started_port", started_port, WORKER, folder, 2)


def node_keys(server) -> list:
    from launcher.nodes.elastic.etcd.client import Etcd3gwClient
    from launcher.plan.etcd import EtcdSpec, parse_endpoints

    client = Etcd3gwClient(EtcdSpec(parse_endpoints(server.endpoints, "test")[0]), 2.0)
    try:
        return client.range("/launcher/forming/nodes/")[1]
    finally:
        client.close()


def test_etcd_forms_the_recipe_with_nodes_of_1_and_2_workers(tmp_path, etcd):  # noqa: F811
    start = free_ports(8)
    results = in_order(etcd_recipe(etcd, tmp_path, 1, start), [etcd_recipe(etcd, tmp_path, 2, start)],
                       lambda: len(node_keys(etcd)) == 1)
    assert [code for code, _, _ in results] == [0, 0], results
    check_sizes(records(tmp_path), (1, 2))
    assert "world size 3 (workers per node: 1, 2)" in "".join(err for _, _, err in results)
