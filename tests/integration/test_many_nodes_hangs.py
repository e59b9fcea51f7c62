"""A hung job of two nodes shows where each rank of each node was, on the node that saw the hang and on the node
stopped for it: one real launcher process per node on loopback addresses (test_many_nodes.py's ``Cluster``), workers
in a real gloo group (hang_two_nodes.py), stacks taken with py-spy."""

import time

import psutil
import pytest

from conftest import WORKERS, free_ports
from launcher.run import stacks
from test_many_nodes import LOOPBACK, assert_gone, job_args, root_cause
from test_many_nodes import cluster  # noqa: F401 - the fixture

HANG = WORKERS / "hang_two_nodes.py"


def marked_line(marker: str) -> int:
    return next(i for i, line in enumerate(HANG.read_text().splitlines(), 1) if line.rstrip().endswith(marker))


HANG_TIMEOUT = 20  # seconds: longer than two workers importing torch at once on a busy machine (8 was not)
HANG_TIMEOUT_WITHOUT_TORCH = 8  # the same for workers that start no process group: "ready" as soon as they start


def start_hung_job(cluster, tmp_path, *worker_args, hang_timeout=HANG_TIMEOUT):
    nodes = LOOPBACK[:2]
    port = free_ports(2)
    for i in (1, 0):  # node 1 first: rank 0's store listens on every address of this machine
        cluster.start(nodes, i, *job_args(port, 1, "--hang_timeout", hang_timeout, "--log_dir", tmp_path / f"log{i}"),
                      HANG, "--limit", 60, *worker_args)
    for i in range(2):
        path = tmp_path / f"log{i}" / f"workerlog.{i}"
        deadline = time.monotonic() + 60
        while not (path.exists() and "ready" in path.read_text()):
            assert time.monotonic() < deadline, f"rank {i} never got its process group; " + "".join(
                f"\n--- node {n.index}'s stderr:\n{n.stderr[-3000:]}" for n in cluster.nodes) + "".join(
                f"\n--- {log}:\n{log.read_text(errors='replace')[-2000:]}" for log in tmp_path.glob("log*/workerlog.*"))
            time.sleep(0.1)
    cluster.snapshot()
    pids = [next(p.pid for p in psutil.Process(node.proc.pid).children() if HANG.name in " ".join(p.cmdline()))
            for node in cluster.nodes]
    return cluster.nodes, pids  # (follower, leader), (rank 1's pid, rank 0's)


needs_py_spy = pytest.mark.skipif(stacks.find_py_spy() is None, reason="py-spy is not installed")


@needs_py_spy
def test_a_hung_job_shows_where_each_rank_of_each_node_was(cluster, tmp_path):
    (follower, leader), (pid1, pid0) = start_hung_job(cluster, tmp_path)
    assert cluster.finish(HANG_TIMEOUT + 40) == [1, 1], leader.stderr + follower.stderr
    reduce_line, sleep_line = marked_line("# ALLREDUCE"), marked_line("# SLEEP")
    assert "launcher: where each rank of node 0 (127.0.0.1) was:" in leader.stderr, leader.stderr
    assert f"  rank 0 (pid {pid0}): all_reduce ({HANG.name}:{reduce_line})" in leader.stderr, leader.stderr
    assert "launcher: where each rank of node 1 (127.0.0.2) was:" in follower.stderr, follower.stderr
    assert f"  rank 1 (pid {pid1}): step ({HANG.name}:{sleep_line})" in follower.stderr, follower.stderr
    causes = {root_cause(node) for node in cluster.nodes}
    assert len(causes) == 1, causes  # whichever node saw it first, both name the same one
    assert causes.pop().endswith(f"wrote a line for {HANG_TIMEOUT} s (--hang_timeout); exit code 1")
    assert_gone(cluster.pids)


@needs_py_spy
def test_a_node_stopped_for_a_hang_elsewhere_shows_its_stacks_too(cluster, tmp_path):
    """Workers without torch: what is tried is the launchers' part (the stacks' contents are the test's above)."""
    timeout = HANG_TIMEOUT_WITHOUT_TORCH
    (follower, leader), _ = start_hung_job(cluster, tmp_path, "--talk", 4, "--without_torch",  # node 1 goes quiet
                                           hang_timeout=timeout)  # 4 s after node 0
    assert cluster.finish(timeout + 40) == [1, 1], leader.stderr + follower.stderr
    assert root_cause(follower).endswith(f"no worker on node 0 (127.0.0.1) wrote a line for {timeout} s "
                                         "(--hang_timeout); exit code 1")
    assert "launcher: where each rank of node 0 (127.0.0.1) was:" in leader.stderr
    assert_gone(cluster.pids)
    assert "launcher: where each rank of node 1 (127.0.0.2) was:" in follower.stderr

