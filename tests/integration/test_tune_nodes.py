"""launcher tune on a job of two nodes started on their own (docs/tuning.md, several nodes): the same command on
each node, node 0's tuner leading, the other's following over the tune link; real launchers on 127.0.0.1 and
127.0.0.2 running tests/integration/workers/tunable.py (no torch; its step time made of sleeps). A rank of it never
makes more than 32 samples in 0.04 s (800 samples/s), so a rate above that is the sum of both nodes' ranks. No test
asserts a duration."""

import contextlib
import json
import os
import signal
import subprocess

import psutil
import pytest
import yaml

from conftest import REPO, WORKERS, free_port, launcher_cmd, wait_for

TUNABLE = str(WORKERS / "tunable.py")
ONE_RANK_AT_MOST = 32 / 0.04  # samples/s


def start_node(tmp_path, node: int, port: int, space: str, job_port: int, elastic: str = "", script=TUNABLE):
    """``elastic``: the --nnodes of an elastic job at a c10d rendezvous (``2`` is PyTorch's own recipe, the nodes
    ranked in the order they arrive); none: Paddle's fixed node list."""
    path = tmp_path / "space.yaml"
    path.write_text(space)
    out = open(tmp_path / f"node{node}.out", "w")
    nodes = ["--nnodes", elastic, "--rdzv_backend", "c10d", "--rdzv_endpoint", f"127.0.0.1:{job_port}"] if elastic else \
        ["--cluster_node_ips", "127.0.0.1,127.0.0.2", "--started_port", job_port]
    proc = subprocess.Popen(launcher_cmd("tune", "--space", path, "--tune_port", port, "--log_dir", tmp_path / f"n{node}",
                                         *nodes, "--node_ip", f"127.0.0.{node + 1}", "--nproc_per_node", "1", script,
                                         "--batch-size", "32"),
                            stdout=out, stderr=subprocess.STDOUT, cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)})
    proc.output = tmp_path / f"node{node}.out"
    return proc


def said(proc) -> str:
    return proc.output.read_text()


def both_nodes(tmp_path, space: str, elastic: str = "", script_1=TUNABLE):
    port, job_port = free_port(), free_port()
    leader = start_node(tmp_path, 0, port, space, job_port, elastic)
    wait_for(lambda: "waiting for the other 1 node(s)' tuners" in said(leader) or leader.poll() is not None,
             timeout=60, what="node 0's tuner listening")
    return leader, start_node(tmp_path, 1, port, space, job_port, elastic, script_1)


def pids(state_file) -> list:
    state = json.loads(state_file.read_text())
    return [state["launcher_pid"], *(p["pid"] for p in state["processes"])]


def nothing_left_of(tmp_path) -> None:
    """No process of the test's trials (whose command lines name its folder) left, within a bound."""
    def ours():
        found = []
        for proc in psutil.process_iter(["cmdline"]):
            with contextlib.suppress(psutil.Error):
                if any(str(tmp_path) in arg for arg in proc.info["cmdline"] or ()):
                    found.append(proc.pid)
        return found
    wait_for(lambda: not ours(), timeout=60, what="every process of the trials gone")


def test_node_0_leads_the_other_node_runs_each_trial_and_the_rate_is_both_nodes(tmp_path):
    leader, follower = both_nodes(tmp_path, "metric: samples\ntrial_seconds: 30\nrepeats: 1\nknobs:\n"
                                            "  strategy.use_local_sgd: [false, true]\n")
    assert leader.wait(timeout=300) == 0, said(leader)
    assert follower.wait(timeout=120) == 0, said(follower)
    assert "tune: best: strategy.use_local_sgd=true, " in said(leader), said(leader)
    assert "this node follows the leading tuner at 127.0.0.1:" in said(follower)
    history = [json.loads(x) for x in open(tmp_path / "n0" / "tune.jsonl")]
    assert [h["trial"] for h in history] == [1, 2, 3] and all(h["rate"]["rate"] > ONE_RANK_AT_MOST for h in history)
    for n in (1, 2, 3):
        ours = yaml.safe_load((tmp_path / "n0" / f"trial-{n}" / "trial.yaml").read_text())
        theirs = yaml.safe_load((tmp_path / "n1" / f"trial-{n}" / "follower-1" / "trial.yaml").read_text())
        assert ours.get("strategy") == theirs.get("strategy") and ours["job_id"] == theirs["job_id"]
        assert theirs["node_ip"] == "127.0.0.2"
        relayed = (tmp_path / "n0" / f"trial-{n}" / "reports.node1.relayed.jsonl").read_text().splitlines()
        assert relayed and {json.loads(x)["rank"] for x in relayed} == {1}


def test_a_trial_whose_part_on_another_node_fails_fails_at_once_with_that_nodes_reason(tmp_path):
    leader, follower = both_nodes(tmp_path, "trial_seconds: 60\nrepeats: 1\nknobs:\n  env.A: [1]\n",
                                  script_1=str(tmp_path / "not_there.py"))  # node 1 has no such program
    assert leader.wait(timeout=300) == 1, said(leader)
    assert follower.wait(timeout=120) == 1, said(follower)
    out = said(leader)
    assert "tune: trial 1: defaults: failed: 127.0.0.2's part: exit code 2: launcher: error: " in out, out
    assert out.strip().splitlines()[-1].startswith("launcher: error: every trial failed; the first: 127.0.0.2's "
                                                   "part: exit code 2: "), out
    nothing_left_of(tmp_path)


@pytest.mark.slow
@pytest.mark.training
@pytest.mark.parametrize("nnodes", ["2:3", "2"])  # 2: PyTorch's recipe (docs/tuning.md), no node rank
def test_an_elastic_job_of_nodes_started_on_their_own_is_tuned_the_same_way(tmp_path, nnodes):
    leader, follower = both_nodes(tmp_path, "metric: samples\ntrial_seconds: 30\nrepeats: 1\nknobs:\n"
                                            "  strategy.use_local_sgd: [true]\n", elastic=nnodes)
    assert leader.wait(timeout=300) == 0, said(leader)
    assert follower.wait(timeout=120) == 0, said(follower)
    history = [json.loads(x) for x in open(tmp_path / "n0" / "tune.jsonl")]
    assert [h["trial"] for h in history] == [1, 2] and all(h["rate"]["rate"] > ONE_RANK_AT_MOST for h in history)


@pytest.mark.slow
@pytest.mark.training
def test_a_follower_that_leaves_stops_a_fixed_jobs_tuning_with_its_name_and_nothing_is_left(tmp_path):
    leader, follower = both_nodes(tmp_path, "metric: samples\ntrial_seconds: 20\nrepeats: 1\nknobs:\n"
                                            "  strategy.use_local_sgd: [false, true]\n")
    node1 = tmp_path / "n1" / "trial-1" / "follower-1" / "launcher.node1.json"
    wait_for(node1.exists, timeout=120, what="node 1's first trial running")
    follower.kill()
    follower.wait()
    assert leader.wait(timeout=300) == 1, said(leader)
    last = said(leader).strip().splitlines()[-1]
    assert last.startswith("launcher: error: the tuner of 127.0.0.2 (127.0.0.") and \
        "left; a fixed job cannot run its trials without that node" in last, said(leader)
    nothing_left_of(tmp_path)


@pytest.mark.slow
@pytest.mark.training
def test_the_leader_gone_the_follower_stops_its_trial_and_says_so(tmp_path):
    leader, follower = both_nodes(tmp_path, "metric: samples\ntrial_seconds: 30\nrepeats: 1\nknobs:\n"
                                            "  strategy.use_local_sgd: [false, true]\n")
    node0 = tmp_path / "n0" / "trial-1" / "launcher.node0.json"
    node1 = tmp_path / "n1" / "trial-1" / "follower-1" / "launcher.node1.json"
    wait_for(lambda: node0.exists() and node1.exists(), timeout=120, what="the first trial running on both nodes")
    leader.send_signal(signal.SIGKILL)
    leader.wait()
    try:
        assert follower.wait(timeout=120) == 1, said(follower)
        assert "launcher: error: the leading tuner at 127.0.0.1:" in said(follower) and \
            "left (connection closed); this node's tuning stops with it." in said(follower), said(follower)
    finally:
        nothing_left_of(tmp_path)  # node 0's trial too, orphaned by the SIGKILL of its tuner: stopped with node 1
