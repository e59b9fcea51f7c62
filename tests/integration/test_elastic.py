"""Elastic jobs (``--nnodes MIN:MAX``) on launchers that share 127.0.0.1: the same torchrun command line on
every node, no node rank. What is promised: the launcher that binds the rendezvous endpoint is node 0;
MAX launchers start the job at once, MIN of them once the last call has passed; real gloo workers see
the round's WORLD_SIZE and contiguous ranks; every node exits 0; below MIN after join_timeout every
launcher exits 1 saying how many joined. Every wait is bounded, and nothing of a test is left running.
"""

import json
import time

import psutil
import pytest

from conftest import WORKERS, assert_all_gone, finish_all, free_ports, run_launcher, start_launcher, wait_for

WORKER = str(WORKERS / "elastic_worker.py")
HOST = "127.0.0.1"


def torchrun_line(port, folder, *extra, nnodes="2:3", steps=3):
    return ("--nnodes", nnodes, "--nproc-per-node", 1, "--rdzv-backend", "c10d", "--rdzv-endpoint", f"{HOST}:{port}",
            "--rdzv-id", "elastic-test", *extra, WORKER, folder, steps)


def records(folder) -> list:
    path = folder / "records.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def run_nodes(count, args, timeout=120, env=None):
    procs = [start_launcher(*args, env=env) for _ in range(count)]
    try:
        return finish_all(procs, timeout=timeout), [p.pid for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()


def check_round(folder, world) -> None:
    done = records(folder)
    assert sorted(r["rank"] for r in done) == list(range(world))
    for r in done:
        env = r["env"]
        assert r["world"] == world and r["sum"] == world * (world + 1) / 2
        assert env["WORLD_SIZE"] == str(world) and env["RANK"] == str(r["rank"])
        assert env["GROUP_RANK"] == str(r["rank"]) and env["LOCAL_RANK"] == "0"
        assert env["PADDLE_TRAINERS_NUM"] == str(world) and env["PADDLE_TRAINER_ID"] == str(r["rank"])
        assert env["TORCHELASTIC_RESTART_COUNT"] == "0"


def test_max_launchers_start_the_job_at_once(tmp_path):
    port = free_ports(4) + 1
    # a last call far longer than the test: only MAX launchers joined can start it
    args = torchrun_line(port, tmp_path, "--rdzv-conf", "last_call_timeout=600")
    started = time.monotonic()
    results, pids = run_nodes(3, args)
    for code, out, err in results:
        assert code == 0, err
    assert time.monotonic() - started < 90
    check_round(tmp_path, 3)
    errs = "".join(err for _, _, err in results)
    assert errs.count("elastic job: this launcher is node 0") == 1
    assert "round 1 (start): 3 node(s), world size 3" in errs
    assert sorted(errs.count(f"this launcher is node {n}") for n in (1, 2)) == [1, 1]
    assert_all_gone(pids + [r["pid"] for r in records(tmp_path)])


@pytest.mark.parametrize("token", [None, "s3cret"])
def test_min_launchers_start_the_job_after_the_last_call(tmp_path, token):
    """With a job token (LAUNCHER_JOB_TOKEN) too: each hello proves it."""
    port = free_ports(4) + 1
    env = {"LAUNCHER_JOB_TOKEN": token} if token else None
    results, pids = run_nodes(2, torchrun_line(port, tmp_path, "--rdzv-conf", "last_call_timeout=1"), env=env)
    for code, out, err in results:
        assert code == 0, err
    check_round(tmp_path, 2)
    assert "round 1 (start): 2 node(s), world size 2" in "".join(err for _, _, err in results)
    assert_all_gone(pids + [r["pid"] for r in records(tmp_path)])


def test_below_min_after_join_timeout_every_launcher_exits_1_saying_so(tmp_path):
    port = free_ports(4) + 1
    results, pids = run_nodes(2, torchrun_line(port, tmp_path, "--rdzv-conf", "join_timeout=3", nnodes="3:4"),
                              timeout=60)
    for code, out, err in results:
        assert code == 1, err
        assert "Traceback" not in err
    errs = [err for _, _, err in results]
    assert any("only 2 node(s) joined within 3 s (join_timeout), 3 needed (--nnodes 3:4)" in e for e in errs), errs
    assert all("the elastic job did not start" in e or "did not take this launcher" in e for e in errs), errs
    assert records(tmp_path) == []
    assert_all_gone(pids)


def test_paddle3s_range_with_master_runs_the_same(tmp_path):
    port = free_ports(4)
    args = ("--nnodes", "2:3", "--master", f"{HOST}:{port}", "--nproc_per_node", 1, WORKER, tmp_path, 2)
    results, pids = run_nodes(2, args)
    for code, out, err in results:
        assert code == 0, err
    check_round(tmp_path, 2)
    assert all(r["env"]["MASTER_PORT"] == str(port + 1) for r in records(tmp_path))
    assert_all_gone(pids + [r["pid"] for r in records(tmp_path)])


def two_holding(folder):
    """Two launchers of a 2:3 job whose workers are in the group and hold until FOLDER/go; (port, procs)."""
    port = free_ports(4) + 1
    args = torchrun_line(port, folder, "--rdzv-conf", "last_call_timeout=0.5")
    procs = [start_launcher(*args, "hold") for _ in range(2)]
    try:
        wait_for(lambda: len(list(folder.glob("ready.*"))) == 2, timeout=60, what="both workers in the group")
    except AssertionError:
        for p in procs:
            p.kill()
            p.wait(timeout=30)
        raise
    return port, procs


def test_a_launcher_that_comes_after_the_start_exits_1_and_the_running_job_goes_on(tmp_path):
    """It reaches the job's store on the endpoint, which closes on its hello: it says the job has started."""
    port, procs = two_holding(tmp_path)
    try:
        late = run_launcher(*torchrun_line(port, tmp_path, "--rdzv-conf", "join_timeout=3,read_timeout=2"), timeout=60)
        assert late.returncode == 1, late.stderr
        assert "closed the connection without an answer: the job has started already" in late.stderr
        (tmp_path / "go").touch()
        results = finish_all(procs, timeout=60)
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    for code, out, err in results:
        assert code == 0, err
    check_round(tmp_path, 2)
    assert_all_gone([p.pid for p in procs] + [r["pid"] for r in records(tmp_path)])


@pytest.mark.parametrize("args, fragment", [
    (("--nnodes", "3:2", "--rdzv-backend", "c10d"), "--nnodes 3:2 has its minimum above its maximum"),
    (("--nnodes", "0:2", "--rdzv-backend", "c10d"), "--nnodes 0:2 has a minimum of 0 nodes"),
    (("--nnodes", "2:x", "--rdzv-backend", "c10d"), "--nnodes 2:x is not a number of nodes or a MIN:MAX range"),
    (("--nnodes", "2:3", "--rdzv-backend", "c10d", "--node-rank", "1"), "drop --node-rank"),
    (("--nnodes", "2:3", "--rdzv-backend", "c10d", "--rdzv-conf", "joint_timeout=5"), "unknown key 'joint_timeout'"),
    (("--nnodes", "2:3", "--rdzv-backend", "c10d", "--rdzv-conf", "join_timeout=0"), "join_timeout=0 is outside"),
    (("--nnodes", "2:3"), "a static rendezvous has a fixed number of nodes"),
    (("--nnodes", "2:3", "--master", "etcd://127.0.0.1:2379"), "names an etcd rendezvous"),
])
def test_a_bad_elastic_line_exits_2_with_one_sentence_before_anything_starts(tmp_path, args, fragment):
    done = run_launcher(*args, WORKER, tmp_path, 1, timeout=60)
    assert done.returncode == 2, done.stderr
    assert fragment in done.stderr and "Traceback" not in done.stderr
    assert done.stderr.count("\n") == 1 and "elastic job:" not in done.stderr


def test_a_node_lost_while_the_job_runs_ends_it_naming_the_node(tmp_path):
    """Not re-formed yet (docs/elastic.md): the survivor stops its workers and exits non-zero, naming node 1."""
    _, procs = two_holding(tmp_path)
    try:
        workers = {rank: int((tmp_path / f"ready.{rank}").read_text()) for rank in (0, 1)}
        lost = psutil.Process(workers[1]).parent()
        lost.kill()  # node 1's launcher and its worker at once, as a power-off
        psutil.Process(workers[1]).kill()
        survivor = next(p for p in procs if p.pid != lost.pid)
        _, err = survivor.communicate(timeout=60)
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
            p.wait(timeout=30)
    assert survivor.returncode == 1, err
    assert "the job stopped: node 1 (127.0.0.1) lost" in err, err
    assert_all_gone([p.pid for p in procs] + list(workers.values()))
